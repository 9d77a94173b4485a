"""zoo-eval --task choice: per-choice log-likelihoods equal a torch loop's on a tiny GPT-2; acc is the argmax
of the summed log-likelihoods and acc_norm of them over each choice's length in characters, as
lm-evaluation-harness defines them; the context/continuation split is the harness's; a bad questions file is
one error line naming the file, the line and the key."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the reference loop runs transformers (PyTorch)")
pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import tiny_lms  # noqa: E402
from tests.helpers.hf_runs import one_torch_thread  # noqa: F401,E402  (autouse fixture)
from tests.helpers.runs import write_jsonl  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.cli import eval as zoo_eval  # noqa: E402
from zoo.data.tokenizers import ByteTokenizer  # noqa: E402
from zoo.eval import choice  # noqa: E402

EOT = tiny_lms.EOT
QUESTIONS = [
    {"context": "The cat sat on the", "choices": ["mat", "floor of the old house", "a"], "answer": 1},
    {"context": "Two plus two is", "choices": ["four", "five", "twenty-two or so"], "answer": 0},
    {"context": "", "choices": ["yes", "no"], "answer": 1},  # an empty context: the prefix token alone
    {"context": "Capital of France: ", "choices": ["Paris", "Lyon"], "answer": 0},  # its space moves
    {"context": "x" * 40, "choices": ["long context", "cut on the left"], "answer": 1},
]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    src = tmp_path_factory.mktemp("gpt2") / "hf"
    model = tiny_lms.gpt2(src)
    run = str(tmp_path_factory.mktemp("gpt2") / "run")
    hf.from_hf(str(src), run, verbose=False)
    return run, model


def reference_logliks(model, q):
    """Each choice's log-likelihood by a plain torch loop over bytes, the harness's pair split written out."""
    out = []
    for c in q["choices"]:
        ctx, cont = q["context"], " " + c
        spaces = len(ctx) - len(ctx.rstrip())
        ctx, cont = (ctx[:-spaces], ctx[-spaces:] + cont) if spaces else (ctx, cont)
        ids = (list(ctx.encode()) or [EOT]) + list(cont.encode())
        ids = ids[-(tiny_lms.CONTEXT + 1):]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids[:-1]])).logits[0].double(), -1).numpy()
        n = len(cont.encode())
        out.append(sum(logp[len(ids) - 1 - n + i, ids[len(ids) - n + i]] for i in range(n)))
    return out


def test_acc_is_the_argmax_of_the_sum_and_acc_norm_of_it_over_characters():
    # acc: -10 > -12 picks "ab"; acc_norm: -10/2 = -5 < -12/6 = -2 picks "abcdef".
    assert choice.predictions([-10.0, -12.0], ["ab", "abcdef"]) == (0, 1)
    # characters, not bytes: -3/2 < -5/4 picks "abcd"; by bytes ("éé" is 4) -3/4 > -5/4 would pick "éé".
    assert choice.predictions([-3.0, -5.0], ["éé", "abcd"]) == (0, 1)


def test_the_pair_split_is_the_harness_one():
    tok = ByteTokenizer()
    assert choice.encode_pair(tok, "Q: ", " x", EOT) == (list(b"Q:"), list(b"  x"))
    assert choice.encode_pair(tok, "", " yes", EOT) == ([EOT], list(b" yes"))
    rows = choice.question_rows(tok, {"context": "ab" * 40, "choices": ["cd"]}, prefix=EOT, context=32)
    assert [len(r.ids) for r in rows] == [33] and rows[0].scored == 3  # cut on the left to context + 1


def test_per_choice_logliks_and_accuracies_follow_the_torch_loop(gpt2, tmp_path, capsys):
    run, model = gpt2
    zmodel, params, tok, cfg = hf.from_pretrained(run)
    out = choice.evaluate(zmodel, params, tok, QUESTIONS, prefix=EOT, context=cfg.window, batch_size=4)
    ref = [reference_logliks(model, q) for q in QUESTIONS]
    for ours, theirs in zip(out["logliks"], ref):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4)
    acc = np.mean([np.argmax(r) == q["answer"] for q, r in zip(QUESTIONS, ref)])
    norm = np.mean([np.argmax(np.asarray(r) / [len(c) for c in q["choices"]]) == q["answer"]
                    for q, r in zip(QUESTIONS, ref)])
    assert acc != norm  # the questions tell the two apart
    assert (out["acc"], out["acc_norm"]) == (acc, norm)
    path = write_jsonl(tmp_path / "q.jsonl", QUESTIONS)
    assert zoo_eval.main([run, "--task", "choice", path, "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert (cli["questions"], cli["acc"], cli["acc_norm"]) == (len(QUESTIONS), acc, norm)
    assert zoo_eval.main([run, "--task", "choice", path, "--max-docs", "2"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split() == ["questions", "2"] and table[2].split()[0] == "acc"


@pytest.mark.parametrize("row, fragment", [
    ({"context": "a", "choices": ["b", "c"]}, ":2: no key 'answer' (keys: 'context', 'choices')"),
    ({"context": "a", "choices": ["b", "c"], "answer": 2}, ":2: key 'answer'=2 is not an index of its 2 choices"),
    ({"context": "a", "choices": "b", "answer": 0}, ":2: key 'choices' must be a list of at least 2"),
    ({"choices": ["b", "c"], "answer": 0}, ":2: no key 'context'"),
])
def test_a_bad_question_is_one_error_line_naming_file_line_and_key(tmp_path, capsys, row, fragment):
    path = write_jsonl(tmp_path / "q.jsonl", [QUESTIONS[0], row])
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # refused before any model is read
    assert zoo_eval.main([str(tmp_path / "run"), "--task", "choice", path]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.splitlines()) == 1
    assert cap.err.startswith(f"error: {path}{fragment}")


def test_a_line_that_is_not_json_is_named(tmp_path, capsys):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(QUESTIONS[0]) + "\n{oops\n")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert zoo_eval.main([str(tmp_path / "run"), "--task", "choice", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {path}:2 is not JSON")
