"""zoo-eval --task generate: greedy answers scored by exact match and contains-answer (case and whitespace
normalised), the worst rows first, chat rows rendered with the run's template; bad rows are one error line."""

import json

import pytest

pytest.importorskip("transformers", reason="the tiny run is converted from a transformers model")

from tests.helpers import tiny_lms  # noqa: E402
from tests.helpers.runs import write_jsonl  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.cli import eval as zoo_eval  # noqa: E402
from zoo.eval import generation  # noqa: E402
from zoo.infer.chat import prompt_ids  # noqa: E402
from zoo.infer.sample import generate  # noqa: E402

CHAT = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_lms.gpt2_run(tmp_path_factory)


def greedy(run, prompt=None, messages=None):
    model, params, tok, cfg = hf.from_pretrained(run)
    ids = prompt_ids(tok, cfg.data.tokenizer, messages, run) if messages else tok.encode(prompt)
    return tok.decode(generate(model, params, ids, 12, temperature=0.0, eos_id=tok.eot_token, vocab_limit=tok.n_vocab,
                               window=cfg.window)[0])


def test_scores_are_exact_and_contains_after_normalising():
    assert generation.score("  The  Answer is Paris. ", ["paris"]) == (False, True)
    assert generation.score("PARIS.", ["Paris", "Lyon"]) == (True, True)
    assert generation.score("Lyon", ["Paris"]) == (False, False)


def test_answers_are_scored_and_the_worst_come_first(run, tmp_path, capsys):
    plain, chat = greedy(run, prompt="The cat"), greedy(run, messages=CHAT)
    assert len(generation.normalise(plain)) >= 4, plain  # the tiny model says something to cut a piece from
    rows = [{"prompt": "The cat", "answer": plain.upper()},  # exact after normalising
            {"prompt": "The cat", "answer": ["no such thing", plain.strip()[1:4]]},  # contained, not exact
            {"messages": CHAT, "answer": chat + " and more"},  # neither
            {"messages": CHAT, "answer": chat}]  # the chat template's prompt: exact
    path = write_jsonl(tmp_path / "qa.jsonl", rows)
    assert zoo_eval.main([run, "--task", "generate", str(path), "--max-new-tokens", "12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["items"], out["exact"], out["contained"]) == (4, 2, 3)
    assert [w["index"] for w in out["worst"]] == [2, 1]  # nothing contained, then contained only
    assert zoo_eval.main([run, "--task", "generate", str(path), "--max-new-tokens", "12", "--show", "1"]) == 0
    table = capsys.readouterr().out
    assert "exact match   0.5000  (2/4)" in table and "contains      0.7500  (3/4)" in table
    assert table.count(": expected") == 1 and "#2: expected" in table


@pytest.mark.parametrize("row, fragment", [
    ({"answer": "x"}, "give exactly one of 'messages' and 'prompt'"),
    ({"prompt": "a", "messages": CHAT, "answer": "x"}, "give exactly one of 'messages' and 'prompt'"),
    ({"prompt": "a"}, "'answer' must be a non-empty string or a list of them"),
    ({"prompt": "a", "answer": ["  "]}, "'answer' must be a non-empty string or a list of them"),
    ({"prompt": "", "answer": "x"}, "'prompt' must be a non-empty string"),
    ({"messages": [{"role": "robot", "content": "hi"}], "answer": "x"}, "message 0 has role 'robot'"),
    ([1, 2], "a row is a JSON object, not list"),
])
def test_a_bad_row_is_one_error_line_naming_file_and_line(run, tmp_path, capsys, row, fragment):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"prompt": "a", "answer": "b"}, row])
    assert zoo_eval.main([run, "--task", "generate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "qa.jsonl:2" in err and fragment in err and err.count("\n") == 1


def test_generate_needs_its_file(run, capsys):
    assert zoo_eval.main([run, "--task", "generate"]) == 2
    assert "--task generate needs the prompts and answers" in capsys.readouterr().err


def test_batches_answer_as_one_at_a_time(run):
    """The questions decode in batches sorted by length; each answer is the one it gets alone, in file order."""
    model, params, tok, cfg = hf.from_pretrained(run)
    items = [{"prompt": p, "answers": ["x"], "index": i}
             for i, p in enumerate(["The cat", "A", "Once upon a time there", "The", "Hello world"])]
    calls = []
    kw = dict(run_dir=run, window=cfg.window, max_new_tokens=8)
    batched = generation.evaluate(model, params, tok, cfg.data.tokenizer, items, batch_size=3, progress=calls.append,
                                  **kw)
    alone = generation.evaluate(model, params, tok, cfg.data.tokenizer, items, batch_size=1, **kw)
    assert batched["rows"] == alone["rows"] and calls == [3, 2]
    assert [r["answer"] for r in batched["rows"][:1]] == [greedy(run, prompt="The cat")[:len(batched["rows"][0]["answer"])]]
