"""zoo-eval as one command of a multi-host job: two processes on a local coordinator (jax.distributed started
by zoo-eval itself) each score their share, and process 0 prints what one process prints; process 1 prints
nothing."""

import json

import pytest

pytest.importorskip("transformers", reason="the tiny run is converted from a transformers model")

from tests.eval.test_choice import QUESTIONS  # noqa: E402
from tests.helpers import tiny_lms  # noqa: E402
from tests.helpers.processes import finish, start  # noqa: E402
from tests.helpers.runs import write_jsonl  # noqa: E402
from zoo.cli import eval as zoo_eval  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_lms.gpt2_run(tmp_path_factory)


def one_and_two(args, capsys):
    assert zoo_eval.main(args + ["--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    (out0, err0), (out1, err1) = finish(start(args + ["--json"], devices=1, command=("-m", "zoo.cli.eval")),
                                        timeout=240)
    assert out1 == "" and "error" not in err0 + err1, err0 + err1
    return alone, json.loads(out0)


def test_two_processes_score_the_documents_of_one(run, capsys):
    alone, two = one_and_two([run, "--data", "builtin", "--max-docs", "5", "--stride", "16"], capsys)
    assert two["documents"] == alone["documents"] == 5 and two["tokens"] == alone["tokens"]
    assert two["perplexity"] == pytest.approx(alone["perplexity"], rel=1e-9)  # rows batch differently
    assert two["bits_per_byte"] == pytest.approx(alone["bits_per_byte"], rel=1e-9)


def test_two_processes_answer_the_questions_of_one(run, tmp_path, capsys):
    path = str(write_jsonl(tmp_path / "q.jsonl", QUESTIONS))  # 5 questions: shares of 3 and 2
    alone, two = one_and_two([run, "--task", "choice", path], capsys)
    assert {k: two[k] for k in ("questions", "correct", "correct_norm", "acc", "acc_norm")} == \
        {k: alone[k] for k in ("questions", "correct", "correct_norm", "acc", "acc_norm")}


def test_two_processes_answer_the_prompts_of_one(run, tmp_path, capsys):
    rows = [{"prompt": p, "answer": a} for p, a in (("The cat", "sat"), ("Two", "three"), ("A", "b"))]
    path = str(write_jsonl(tmp_path / "qa.jsonl", rows))
    alone, two = one_and_two([run, "--task", "generate", path, "--max-new-tokens", "8"], capsys)
    assert two == {**alone, "run": two["run"]} and two["items"] == 3
