"""zoo.bench end to end on a shrunken CPU shape: one JSON line per shape with the reported fields."""

import json

import pytest

from zoo.cli import bench

SMALL = ["model.num_layers=1", "model.d_model=64", "model.num_heads=2", "model.d_ff=128", "model.vocab_size=512",
         "data.seq_len=32", "train.batch_size=8"]


def test_gpt_train_reports_throughput_mfu_and_settings(tmp_path, capsys, one_device):
    out = tmp_path / "bench.jsonl"
    args = ["--workload", "gpt_train", "--shapes", "cpu", "--rounds", "2", "--out", str(out)]
    assert bench.main(args + [f"--set={o}" for o in SMALL]) == 0
    row = json.loads(out.read_text().splitlines()[0])
    assert row["workload"] == "gpt_train" and row["device_kind"] == "cpu" and row["device_count"] == 1
    assert row["tokens_per_s"] > 0 and 0 < row["mfu"] < 1
    assert row["step_s_min"] <= row["step_s_median"] and 0 <= row["input_wait_frac"] < 1
    assert row["settings"] == {"dtype": "float32", "attention": "einsum", "remat": "none", "scan_layers": False}
    assert "gpt_train | L4-D256-T256-B8-V8192" in capsys.readouterr().out  # the table after the JSON lines


def test_a_bad_override_is_one_line_naming_the_key(capsys):
    assert bench.main(["--workload", "gpt_train", "--shapes", "cpu", "--set", "model.bogus=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown config key 'model.bogus'" in err and "\n" not in err


def test_dpo_train_beside_trls_dpo_trainer_counts_both_rows_of_every_pair(tmp_path, monkeypatch, one_device):
    """dpo_train on a tiny shape through zoo-bench's real workers: zoo's task=dpo with LoRA on its frozen base
    beside TRL's DPOTrainer with PEFT; both count 2 * B * T positions a step (B pairs of two rows of T)."""
    trl = pytest.importorskip("trl", reason="dpo_train's peer is TRL's DPOTrainer")
    from zoo.bench import shapes
    B, T = 2, 32
    tiny = shapes._dpo(shapes._lora(shapes._llama(L=1, D=64, N=2, K=1, F=128, V=512, T=T, B=B)))
    monkeypatch.setitem(shapes.SHAPES, ("dpo_train", "cpu"), [("tiny", tiny)])
    out = tmp_path / "bench.jsonl"
    args = ["--workload", "dpo_train", "--shapes", "cpu", "--rounds", "1", "--peer", "hf-torch", "--out", str(out)]
    assert bench.main(args) == 0
    row = json.loads(out.read_text().splitlines()[0])
    peer = row["peers"]["hf-torch"]
    assert row["workload"] == "dpo_train" and peer["versions"].endswith(f"/ trl {trl.__version__}")
    for r in (row, peer):  # one timed round: its step time is the median's
        assert r["tokens_per_s"] > 0 and r["tokens_per_s"] == pytest.approx(r["sequences_per_s"] * 2 * T)
        assert r["tokens_per_s"] * r["step_s_median"] == pytest.approx(2 * B * T)
    assert row["trainable_params"] == peer["trainable_params"] == 16384  # the same adapters on both sides
    assert row["ratio_tokens_per_s"] == pytest.approx(row["tokens_per_s"] / peer["tokens_per_s"])


def test_grpo_train_beside_trls_grpo_trainer_samples_the_same_tokens_a_step(tmp_path, monkeypatch, one_device):
    """grpo_train on a tiny shape through zoo-bench's real workers: zoo's whole GRPO step (the in-loop sampler, the
    reward, the LoRA train step) beside TRL's GRPOTrainer with PEFT; neither ends a completion early, so both sample
    B * G * new tokens a step and train B * G rows of prompt + new. zoo's in-loop sampler draws, on the base, the
    tokens zoo.load(...).generate draws."""
    trl = pytest.importorskip("trl", reason="grpo_train's peer is TRL's GRPOTrainer")
    from zoo.bench import shapes
    B, G, P, N = 2, 2, 8, 8
    tiny = shapes._llama(L=1, D=64, N=2, K=1, F=128, V=512, T=P + N, B=B)
    tiny = shapes._grpo(shapes._lora(tiny), G=G, prompt=P, new=N)
    monkeypatch.setitem(shapes.SHAPES, ("grpo_train", "cpu"), [("tiny", tiny)])
    out = tmp_path / "bench.jsonl"
    args = ["--workload", "grpo_train", "--shapes", "cpu", "--rounds", "1", "--peer", "hf-torch", "--out", str(out)]
    assert bench.main(args) == 0
    row = json.loads(out.read_text().splitlines()[0])
    peer = row["peers"]["hf-torch"]
    assert row["workload"] == "grpo_train" and peer["versions"].endswith(f"/ trl {trl.__version__}")
    for r in (row, peer):  # one timed round: its step time is the median's
        assert r["completion_tokens_per_step"] == B * G * N and r["train_tokens_per_step"] == B * G * (P + N)
        assert r["tokens_per_s"] * r["step_s_median"] == pytest.approx(B * G * N)
        assert r["decode_tokens_per_s"] > r["tokens_per_s"] > 0 and 0 < r["gen_frac"] < 1
    assert row["trainable_params"] == peer["trainable_params"] == 16384  # the same adapters on both sides
    assert row["in_loop_same_tokens"] is True and row["in_loop_tokens_per_s"] > 0
    loop, load = row["in_loop_sample_s_median"], row["load_generate_s_median"]
    assert row["in_loop_vs_load_generate"] == pytest.approx(load / loop)
    assert row["ratio_tokens_per_s"] == pytest.approx(row["tokens_per_s"] / peer["tokens_per_s"])
