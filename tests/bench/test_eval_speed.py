"""zoo-bench's eval_score workload end to end on a shrunken CPU shape, beside lm-eval's `hf` model: the row's
rates and ratios, one compiled scoring program and no compilation in the timed rounds, both sides scoring the
same exported weights (the same NLL), the shared weights removed after the run. Behaviour only: no timings."""

import json
import math
import os
import tempfile

import pytest

pytest.importorskip("torch", reason="torch is not installed: the peer is the harness's hf model")
pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install lm-eval)")

from zoo.cli import bench  # noqa: E402

V, T, B = 512, 32, 4
SMALL = ["model.num_layers=1", "model.d_model=64", "model.num_heads=2", "model.d_ff=128", f"model.vocab_size={V}",
         f"data.seq_len={T}", f"train.batch_size={B}"]
SHAPE = "L6-D384-T128-B16-V8192"


def test_eval_score_rates_ratios_and_compilations(tmp_path, capsys, one_device):
    out = tmp_path / "bench.jsonl"
    args = ["--workload", "eval_score", "--shapes", "cpu", "--rounds", "1", "--peer", "lm-eval-hf", "--out", str(out)]
    assert bench.main(args + [f"--set={o}" for o in SMALL]) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (row["workload"], row["shape"], row["device_kind"], row["dtype"]) == ("eval_score", SHAPE, "cpu", "float32")
    assert row["tokens_per_s"] > 0 and row["forward_tokens_per_s"] > 0
    assert row["score_vs_forward"] == pytest.approx(row["tokens_per_s"] / row["forward_tokens_per_s"], rel=1e-12)
    assert row["score_s_min"] <= row["score_s_median"] and row["forward_step_s_min"] <= row["forward_step_s_median"]
    # two batches of B documents of T tokens, every token scored once
    assert (row["documents"], row["scored_tokens"]) == (2 * B, 2 * B * T)
    # warm-up and timed rounds scored every document again: one program for the one [B, T], no compilation
    assert row["score_programs"] == 1 and row["round_compiles"] == 0
    peer = row["peers"]["lm-eval-hf"]
    assert peer["device"] == "cpu" and peer["versions"].startswith("lm-eval ") and peer["tokens_per_s"] > 0
    assert row["ratio_tokens_per_s"] == pytest.approx(row["tokens_per_s"] / peer["tokens_per_s"], rel=1e-12)
    # the same model on both sides (zoo's exporter), a random one: about log V nats a token, equal to 1e-5
    assert peer["nll_per_token"] == pytest.approx(row["nll_per_token"], rel=1e-5)
    assert abs(row["nll_per_token"] - math.log(V)) < 0.5
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), f"zoo-bench-eval-{os.getpid()}-{SHAPE}"))
    assert f"eval_score | {SHAPE} | cpu" in capsys.readouterr().out  # the table, with the zoo / lm-eval-hf column


def test_each_peer_names_the_workloads_it_runs():
    from zoo.bench import torch_peer
    with pytest.raises(ValueError, match="eval_score's peers are lm-eval-hf"):
        torch_peer.make("hf-torch", {"workload": "eval_score"})
    with pytest.raises(ValueError, match="gpt_train's peers are hf-torch and hf-torch-compile"):
        torch_peer.make("lm-eval-hf", {"workload": "gpt_train"})
