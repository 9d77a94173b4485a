"""zoo.bench end to end on a shrunken CPU shape: one JSON line per shape with the reported fields."""

import json

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
