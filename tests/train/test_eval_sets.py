"""train.eval_sets: multiple-choice and generation files scored at every evaluation of a GPT run, logged in
metrics.jsonl and the console line, equal to zoo-eval on the checkpoint; bad entries and files are refused in
one line before the first step."""

import json

import pytest

from conftest import replace
from tests.eval.test_choice import QUESTIONS
from tests.helpers.runs import run, write_jsonl
from zoo.cli import eval as zoo_eval
from zoo.overrides import apply_overrides
from zoo.errors import ConfigError, ZooDataError

QA = [{"prompt": "The", "answer": "the"}, {"messages": [{"role": "user", "content": "Hi"}], "answer": ["a", "b"]}]


@pytest.fixture
def sets(tmp_path):
    return (write_jsonl(tmp_path / "mc.jsonl", QUESTIONS), write_jsonl(tmp_path / "qa.jsonl", QA))


def test_every_evaluation_scores_the_sets_as_zoo_eval_does(tiny_cfg, sets, tmp_path, one_device, capsys):
    cfg = replace(tiny_cfg, train=dict(eval_every=3, eval_batches=1, eval_sets=f"choice:{sets[0]},generate:{sets[1]}"))
    run(cfg, tmp_path / "run")
    console = capsys.readouterr()
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    scored = [r for r in records if "eval_mc_acc" in r]
    assert [r["step"] for r in scored] == [3, 6]
    for r in scored:
        assert {"eval_mc_acc_norm", "eval_qa_exact_match", "eval_qa_contains"} <= set(r)
        assert 0 <= r["eval_qa_exact_match"] <= r["eval_qa_contains"] <= 1
    assert "eval_mc_acc" in console.out + console.err and "eval_qa_contains" in console.out + console.err
    assert zoo_eval.main([str(tmp_path / "run"), "--task", "choice", sets[0], "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert (alone["acc"], alone["acc_norm"]) == (scored[-1]["eval_mc_acc"], scored[-1]["eval_mc_acc_norm"])


@pytest.mark.parametrize("value, fragment", [
    ("mc.jsonl", "entry 'mc.jsonl' must be KIND:FILE.jsonl with KIND one of choice, generate"),
    ("rank:x.jsonl", "entry 'rank:x.jsonl' must be KIND:FILE.jsonl"),
    ("choice:", "entry 'choice:' must be KIND:FILE.jsonl"),
])
def test_a_bad_entry_names_the_key(tiny_cfg, value, fragment):
    with pytest.raises(ConfigError, match=fragment):
        apply_overrides(tiny_cfg, [f"train.eval_sets={value}"])


def test_a_bad_file_stops_the_run_before_its_first_step(tiny_cfg, tmp_path, one_device):
    bad = write_jsonl(tmp_path / "mc.jsonl", [{"context": "a", "choices": ["b"], "answer": 3}])
    cfg = replace(tiny_cfg, train=dict(eval_every=3, eval_sets=f"choice:{bad}"))
    with pytest.raises(ZooDataError, match="mc.jsonl:1"):
        run(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    with pytest.raises(ZooDataError, match="no-such.jsonl"):
        run(replace(tiny_cfg, train=dict(eval_sets=f"generate:{tmp_path / 'no-such.jsonl'}")), tmp_path / "run2")
