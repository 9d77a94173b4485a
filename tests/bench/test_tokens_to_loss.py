"""The tokens-to-loss bench end to end on a shrunken shape and a few steps: every row (four zoo.train runs and the
torch nanoGPT row) evaluated on the same schedule of tokens, the target taken from the nanoGPT row, results.json,
table.md and the PNG written. Behaviour only: no timings."""

import json
import math

import jax
import pytest

pytest.importorskip("torch", reason="torch is not installed: the nanoGPT row is torch")

from zoo.bench import tokens_to_loss  # noqa: E402

B, T = 4, 32
SMALL = ["model.num_layers=2", "model.d_model=32", "model.num_heads=2", "model.d_ff=128", "model.max_len=64",
         f"data.seq_len={T}", f"train.batch_size={B}", "optim.warmup=1"]


def test_every_row_writes_its_curve_the_table_and_the_png(tmp_path, cache_dir):
    sets = SMALL + [f"data.cache_dir={cache_dir}"]
    results = tokens_to_loss.bench(steps=4, seeds=1, eval_every=2, sets=sets, devices=jax.devices()[:1],
                                   say=lambda line: None)
    paths = tokens_to_loss.write(results, str(tmp_path / "out"))
    saved = json.loads(open(paths[0]).read())
    assert list(saved["curves"]) == list(tokens_to_loss.ROWS) == list(saved["summary"])
    for name, (curve,) in saved["curves"].items():
        assert [p["tokens"] for p in curve] == [2 * B * T, 4 * B * T], name
        assert all(math.isfinite(p["eval_loss"]) and p["eval_loss"] < math.log(384) + 0.5 for p in curve), name
    nanogpt = saved["curves"][tokens_to_loss.NANOGPT][0]
    assert saved["target_row"] == tokens_to_loss.NANOGPT
    assert saved["target_loss"] == pytest.approx(nanogpt[-1]["eval_loss"])
    assert saved["budget_tokens"] == 4 * B * T
    assert saved["summary"][tokens_to_loss.NANOGPT]["reached"] == 1  # its own final loss: reached at the budget
    table = open(paths[1]).read().splitlines()
    assert [line.split(" | ")[0] for line in table[4:]] == list(tokens_to_loss.ROWS)
    assert open(paths[2], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_rows_that_step_different_tokens_are_refused():
    with pytest.raises(tokens_to_loss.ConfigError, match="rows differ"):
        tokens_to_loss.check_shapes({"a": tokens_to_loss.ROWS["zoo AdamW (gpt_tiny)"](),
                                     "b": tokens_to_loss.zoo.config("gpt_tiny", overrides=["train.batch_size=8"])})
