"""The evaluation set zoo builds offline (zoo.eval.sets: `zoo-eval RUN --task choice builtin`) and `--held-out`
perplexity: the set's questions come from the documents a default run on `builtin` held out, each with its true
continuation among the choices; zoo-eval reads the named set exactly as it reads the same rows from a file, and
--held-out scores exactly the run's validation documents."""

import json

import pytest

pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import tiny_lms  # noqa: E402
from tests.helpers.runs import write_jsonl  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.cli import eval as zoo_eval  # noqa: E402
from zoo.data.corpus import NAMED  # noqa: E402
from zoo.data.store import doc_hash  # noqa: E402
from zoo.eval import sets  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    src = tmp_path_factory.mktemp("gpt2") / "hf"
    tiny_lms.gpt2(src)
    out = str(tmp_path_factory.mktemp("gpt2") / "run")
    hf.from_hf(str(src), out, verbose=False)
    return out


def held_out_texts(fraction=sets.VAL_FRACTION):
    return [t for t in NAMED["builtin"][0]() if doc_hash(t) < fraction]


def test_the_builtin_set_asks_for_the_true_continuation_of_held_out_text():
    qs = sets.builtin_choice()
    assert len(qs) >= 60 and qs == sets.builtin_choice()  # the same set every time
    held = [" ".join(t.split()) for t in held_out_texts()]
    for q in qs:
        assert len(q["choices"]) == 4 and len(set(q["choices"])) == 4
        true = q["choices"][q["answer"]]
        assert any(q["context"] + " " + true in t for t in held)  # the passage and its true next words
        assert sum(any(q["context"] + " " + c in t for t in held) for c in q["choices"]) == 1  # and no other
    assert len({q["answer"] for q in qs}) == 4  # the true one is not always in the same place


def test_zoo_eval_reads_the_named_set_as_it_reads_its_rows_from_a_file(run, tmp_path, capsys):
    assert zoo_eval.main([run, "--task", "choice", "builtin", "--json"]) == 0
    named = json.loads(capsys.readouterr().out)
    path = write_jsonl(tmp_path / "builtin.jsonl", sets.builtin_choice())
    assert zoo_eval.main([run, "--task", "choice", path, "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert named["questions"] == len(sets.builtin_choice())
    assert {k: v for k, v in named.items() if k != "data"} == {k: v for k, v in from_file.items() if k != "data"}


def test_held_out_scores_exactly_the_documents_the_run_held_out(run, tmp_path, capsys):
    fraction = json.load(open(f"{run}/config.json"))["data"]["val_fraction"]
    texts = held_out_texts(fraction)
    assert zoo_eval.main([run, "--data", "builtin", "--held-out", "--json"]) == 0
    held = json.loads(capsys.readouterr().out)
    path = write_jsonl(tmp_path / "held.jsonl", [{"text": t} for t in texts])
    assert zoo_eval.main([run, "--data", path, "--json"]) == 0
    direct = json.loads(capsys.readouterr().out)
    assert held["documents"] == len(texts) < len(NAMED["builtin"][0]())
    assert held["perplexity"] == pytest.approx(direct["perplexity"], rel=1e-9)
    assert zoo_eval.main([str(tmp_path), "--data", "builtin", "--held-out"]) == 2
    assert "--held-out needs a zoo run" in capsys.readouterr().err
