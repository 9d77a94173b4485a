"""zoo-classify and zoo-fill-mask --file: .txt and .jsonl inputs, JSON lines out, batched results equal to
the one-text-at-a-time `predict` / `fill_mask` (texts of different lengths in one batch: padding must not
reach them), and bad lines named by number. The --text output: tests/cli/test_bert_cli.py."""

import dataclasses
import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import replace
from tests.helpers.runs import write_jsonl
from tests.helpers.tiny_configs import bert as cfg_for
import zoo
from zoo import tasks
from zoo.api import encoder as api_encoder
from zoo.cli import classify, fill_mask
from zoo.infer import encoder
from zoo.training import checkpoint

TEXTS = ["short", "A somewhat longer text, with a comma", "mid length one", "x" * 40]
NAMES = ["north", "east", "south", "west"]
MASKED = ["wh[MASK]le", "The [MASK]or statement iterates over [MASK] sequence", "[MASK]", "a[MASK]b[MASK]c[MASK]d"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache_dir):
    """(bert_cls run, bert_mlm run) of the tiny BERT (max_len 64), weights-only, no training: random params
    that give outputs far from uniform (a fresh classifier head is zero: every text would get the same
    probabilities, and padding that reached [CLS] would not show)."""
    root = tmp_path_factory.mktemp("batch_runs")
    cfgs = [replace(cfg_for(task, cache_dir), data=dict(label_names=",".join(NAMES)))
            for task in ("bert_cls", "bert_mlm")]
    mlm = nn.unbox(jax.jit(tasks.build(cfgs[1]).init)(jax.random.PRNGKey(0)))
    mlm["bert"]["embed"]["word"]["embedding"] *= 50  # also the tied output layer: logits x50
    # The classifier shares the encoder; its head's kernels (pooler, output layer) are drawn N(0, 1 / fan-in):
    # logits of unit scale, and a pooler short of tanh's flat ends (there it would hide a change in [CLS]).
    head = nn.unbox(jax.eval_shape(tasks.build(cfgs[0]).init, jax.random.PRNGKey(0)))["cls_head"]
    keys = iter(jax.random.split(jax.random.PRNGKey(1), len(jax.tree.leaves(head))))
    head = jax.tree.map(lambda a: jax.random.normal(next(keys), a.shape) * a.shape[0] ** -0.5 * (a.ndim == 2), head)
    cls = {"bert": mlm["bert"], "cls_head": head}
    out = []
    for cfg, params in zip(cfgs, (cls, mlm)):
        checkpoint.save_weights(str(root / cfg.task), params, cfg)
        out.append(str(root / cfg.task))
    return out


def jsonl_out(capsys):
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_bucket_and_batches():
    assert [encoder.bucket(n, 64, least=8) for n in (1, 8, 9, 33, 64)] == [8, 8, 16, 64, 64]
    assert [encoder.bucket(n, 12) for n in (1, 3, 5, 12)] == [1, 4, 8, 12]
    assert [b.tolist() for b in encoder.batches([3, 9, 1, 9, 4], 2)] == [[1, 3], [4, 0], [2]]
    assert [b.tolist() for b in encoder.length_batches([3, 9, 1, 9, 4], 2)] == [[1, 3], [4, 0], [2]]
    # a row half its batch's longest or shorter starts a batch of its own (under 8 tokens: counted as 8)
    lengths = [236, 100, 90, 60, 50, 40, 30, 20, 10, 9, 8, 3]
    assert [b.tolist() for b in encoder.length_batches(lengths, 4)] == [[0], [1, 2, 3], [4, 5, 6], [7],
                                                                        [8, 9, 10, 11]]
    assert sorted(np.concatenate(encoder.length_batches(lengths[::-1], 3)).tolist()) == list(range(12))


def test_lengths_pad_to_an_eighth_of_their_power_of_two():
    got = {n: encoder.length_bucket(n, 512) for n in (1, 8, 9, 17, 19, 28, 43, 64, 65, 75, 200, 256, 300, 600)}
    assert got == {1: 8, 8: 8, 9: 16, 17: 24, 19: 24, 28: 32, 43: 48, 64: 64, 65: 80, 75: 80, 200: 224, 256: 256,
                   300: 320, 600: 512}
    lengths = {encoder.length_bucket(n, 512) for n in range(1, 513)}
    assert len(lengths) == 20
    assert all(n <= encoder.length_bucket(n, 512) < n + max(8, n / 4) for n in range(1, 513))


def test_classify_file_equals_one_at_a_time(runs, tmp_path, capsys):
    rows = [{"text": t} if i % 2 else {"text": t, "pair": t[::-1][:9], "id": i} for i, t in enumerate(TEXTS)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    assert classify.main([runs[0], "--file", src, "--batch-size", "2"]) == 0
    got = jsonl_out(capsys)
    lm = zoo.load(runs[0])
    assert [{k: g[k] for k in g if k in ("text", "pair")} for g in got] == [
        {k: r[k] for k in r if k != "id"} for r in rows]
    for g, r in zip(got, rows):
        alone = lm.classify(r["text"], r.get("pair"))  # a batch of one
        want = np.asarray([alone["probs"][n] for n in NAMES])
        assert list(g["probs"]) == NAMES
        np.testing.assert_allclose([g["probs"][n] for n in NAMES], want, atol=1e-5)
        assert g["label"] == NAMES[int(np.argmax(want))]
        assert np.abs(want - 0.25).max() > 0.05  # far from uniform: padding seen by [CLS] would show
    # .txt: one text a line, blank lines skipped, all in one batch; --out writes the lines to a file.
    txt = tmp_path / "in.txt"
    txt.write_text(f"{TEXTS[1]}\n\n  \n{TEXTS[3]}\n")
    assert classify.main([runs[0], "--file", str(txt), "--out", str(tmp_path / "out.jsonl")]) == 0
    again = [json.loads(line) for line in open(tmp_path / "out.jsonl")]
    assert capsys.readouterr().out == "" and [g["text"] for g in again] == [TEXTS[1], TEXTS[3]]
    for g, want in zip(again, (got[1], got[3])):
        assert g["label"] == want["label"]
        np.testing.assert_allclose([g["probs"][n] for n in NAMES], [want["probs"][n] for n in NAMES], atol=1e-5)


def test_fill_mask_file_equals_one_at_a_time(runs, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(MASKED[:2]) + "\n\n" + "\n".join(MASKED[2:]))
    assert fill_mask.main([runs[1], "--file", str(src), "--top-k", "3", "--batch-size", "2"]) == 0
    got = jsonl_out(capsys)
    lm = zoo.load(runs[1])
    tok = lm.tokenizer
    assert [g["text"] for g in got] == MASKED
    for g, text in zip(got, MASKED):
        want = api_encoder.fill_mask_ids(lm, [text], 3)[0]  # a batch of one
        assert [[m["id"] for m in row] for row in g["masks"]] == [[i for i, _ in row] for row in want]
        np.testing.assert_allclose([[m["prob"] for m in row] for row in g["masks"]],
                                   [[p for _, p in row] for row in want], atol=1e-5)
        assert max(p for row in want for _, p in row) > 0.1  # far from uniform (1/257)
        assert [[m["token"] for m in row] for row in g["masks"]] == [[tok.decode([i]) for i, _ in row] for row in want]
        assert g["filled"] == api_encoder.filled(text, want, tok) and "[MASK]" not in g["filled"]
    # .jsonl input (other fields ignored), all in one batch: the same results.
    jl = write_jsonl(tmp_path / "in.jsonl", [{"text": t, "other": 1} for t in MASKED])
    assert fill_mask.main([runs[1], "--file", jl, "--top-k", "3"]) == 0
    again = jsonl_out(capsys)
    assert [(g["text"], g["filled"], [[m["id"] for m in row] for row in g["masks"]]) for g in again] == [
        (g["text"], g["filled"], [[m["id"] for m in row] for row in g["masks"]]) for g in got]
    np.testing.assert_allclose([m["prob"] for g in again for row in g["masks"] for m in row],
                               [m["prob"] for g in got for row in g["masks"] for m in row], atol=1e-5)


@pytest.mark.parametrize("which, lines, ext, culprit", [
    ("cls", ['{"text": "a"}', '{"text": "b"'], "jsonl", "line 2 of {path} is not JSON (Expecting ',' delimiter "
                                                        "at column 13)"),
    ("cls", ['{"text": "a"}', "", '{"txt": "b"}'], "jsonl", 'line 3 of {path} has no "text" string field'),
    ("cls", ['{"text": "a", "pair": 3}'], "jsonl", 'line 1 of {path}: "pair" holds int, not a string'),
    ("cls", ['{"text": " "}'], "jsonl", 'line 1 of {path}: "text" is empty'),
    ("cls", ["ok", "", "y" * 63], "txt", "line 3 of {path} is 65 tokens with [CLS] and [SEP], more than the model's "
                                        "max_len=64; shorten it"),
    ("cls", ["", " "], "txt", "--file={path!r} has no texts (only blank lines)"),
    ("cls", ["a"], "csv", "--file={path!r} has unsupported type .csv; supported: .txt (one text a line); "
                          '.jsonl (one JSON object a line with a "text" field)'),
    ("mlm", ["[MASK] one", "none here"], "txt", "line 2 of {path} has no [MASK]; put one where a token should be "
                                                "predicted"),
    ("mlm", ["[MASK]" + "z" * 70], "txt", "line 1 of {path} is 73 tokens with [CLS] and [SEP]"),
])
def test_bad_lines_are_named(runs, tmp_path, capsys, which, lines, ext, culprit):
    path = tmp_path / f"in.{ext}"
    path.write_text("\n".join(lines) + "\n")
    main, workdir = (classify.main, runs[0]) if which == "cls" else (fill_mask.main, runs[1])
    assert main([workdir, "--file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + culprit.format(path=str(path))) and err.count("\n") == 1


def test_bad_arguments(runs, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("a\n")
    assert classify.main([runs[0], "--file", str(src), "--pair", "b"]) == 2
    assert fill_mask.main([runs[1], "--file", str(src), "--batch-size", "0"]) == 2
    assert classify.main([runs[0], "--file", str(src), "--out", str(tmp_path / "no" / "out.jsonl")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ['error: --pair goes with --text; with --file give each .jsonl line a "pair" field',
                   "error: --batch-size=0 must be >= 1",
                   f"error: --out={str(tmp_path / 'no' / 'out.jsonl')!r}: no such folder {str(tmp_path / 'no')!r}"]
    for argv in ([runs[0], "--file", str(src), "--text", "x"], [runs[0]]):  # exactly one of --text / --file
        with pytest.raises(SystemExit) as e:
            classify.main(argv)
        assert e.value.code == 2
    assert "one of the arguments --text --file is required" in capsys.readouterr().err


def test_class_probs_keeps_row_order_across_batches():
    """Rows sorted by length inside, returned in the order given (a model that reports its input length)."""

    @dataclasses.dataclass(frozen=True)
    class Lengths:
        cfg: object

        def apply(self, variables, ids_BT, segment_ids_BT, valid_BT):
            return jax.numpy.stack([valid_BT.sum(1), segment_ids_BT.sum(1)], -1).astype(np.float32) * 0.01

    model = Lengths(cfg=type("Cfg", (), {"max_len": 64})())
    rows = [[1] * n for n in (5, 17, 2, 9, 30)]
    probs_NC = encoder.class_probs(model, {}, rows, [3, 17, 2, 4, 30], pad_id=0, batch_size=2)
    logits_NC = np.log(probs_NC)
    diff = logits_NC[:, 0] - logits_NC[:, 1]  # (length - segment-1 length) / 100
    np.testing.assert_allclose(diff, [0.03, 0.17, 0.02, 0.04, 0.30], atol=1e-5)
