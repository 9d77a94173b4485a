"""What a run reports: a console line per evaluation (none when quiet), eval_ppl only where perplexity
means something, strict-JSON metrics.jsonl (null for non-finite values), readers that skip a torn last
line, and a resumed run's metrics.jsonl without the steps the killed run logged after its checkpoint."""

import json
import math
import re

import pytest

from conftest import replace
from tests.helpers import tiny_configs
from tests.helpers.runs import losses, run
from zoo.training import trainer
from zoo.training.metrics import MetricsWriter, read_records

LINE = re.compile(r"^step (\d+): loss [\d.e+-]+, eval_loss [\d.e+-]+(, eval_ppl [\d.e+-]+)?, "
                  r"eval_accuracy [\d.e+-]+(, \w+ [\d.e+-]+)*, tokens/s \d+, peak memory \d+ MB$")


def eval_lines(text):
    return [line for line in text.splitlines() if line.startswith("step ")]


def test_a_line_per_evaluation_with_loss_eval_metrics_and_throughput(tiny_cfg, tmp_path, capsys):
    cfg = replace(tiny_cfg, train=dict(steps=6, eval_every=2, eval_batches=1, log_every=1))
    trainer.train(cfg, str(tmp_path), quiet=False)  # stdout is not a terminal here: no bar, plain lines
    out, err = capsys.readouterr()
    lines = eval_lines(out)
    assert [int(LINE.match(line).group(1)) for line in lines] == [2, 4, 6], out
    assert all("eval_ppl" in line for line in lines)
    assert "/6 [" not in out + err  # no training bar (0/6 [00:01<...]) in a redirected log
    records = list(map(json.loads, open(tmp_path / "metrics.jsonl")))
    assert f"eval_loss {records[-1]['eval_loss']:.4g}" in lines[-1]
    assert f"peak memory {records[-1]['peak_memory_mb']:.0f} MB" in lines[-1]
    assert all(r["peak_memory_mb"] > 100 for r in records)  # the process's peak RSS on CPU: jax alone is more
    # The first step says at once what it cost and where the loss starts, before the first evaluation.
    first, = [line for line in out.splitlines() if line.startswith("first step:")]
    assert out.index(first) < out.index(lines[0])
    assert re.fullmatch(r"first step: loss [\d.]+ \(compiled and ran in [\d.]+ s\)", first)
    assert records[0]["step"] == 1 and f"loss {records[0]['loss']:.4g} " in first
    assert f"{records[0]['compile_s']:.1f} s)" in first


def test_quiet_prints_no_eval_lines(tiny_cfg, tmp_path, capsys):
    cfg = replace(tiny_cfg, train=dict(steps=4, eval_every=2, eval_batches=1))
    trainer.train(cfg, str(tmp_path), quiet=True)
    assert eval_lines(capsys.readouterr().out) == []


def test_classification_reports_no_perplexity(cache_dir, tmp_path, capsys):
    cfg = replace(tiny_configs.TINY["bert_cls"](cache_dir), train=dict(steps=2, eval_every=2))
    out = trainer.train(cfg, str(tmp_path), quiet=False)
    assert "eval_ppl" not in out["eval"] and "eval_macro_f1" in out["eval"]
    line, = eval_lines(capsys.readouterr().out)
    assert LINE.match(line) and "eval_ppl" not in line and "eval_macro_f1" in line
    assert not any("eval_ppl" in r for r in map(json.loads, open(tmp_path / "metrics.jsonl")))


def test_seq2seq_line_shows_exact_match_and_bleu(s2s_cfg, tmp_path, capsys):
    cfg = replace(s2s_cfg, train=dict(steps=2, eval_every=2, eval_batches=1))
    trainer.train(cfg, str(tmp_path), quiet=False)
    line, = eval_lines(capsys.readouterr().out)
    assert LINE.match(line) and "eval_exact_match" in line and "eval_bleu" in line


def test_eval_line_format():
    record = {"step": 250, "loss": 1.6213, "lr": 1e-3, "eval_loss": 1.6512, "eval_accuracy": 0.52,
              "eval_macro_f1": 0.4, "tokens_per_s": 13012.4, "mfu": 0.3}
    assert trainer.eval_line(record) == ("step 250: loss 1.621, eval_loss 1.651, eval_accuracy 0.52, "
                                         "eval_macro_f1 0.4, tokens/s 13012")
    assert trainer.eval_line({**record, "peak_memory_mb": 812.4}).endswith("tokens/s 13012, peak memory 812 MB")


def test_non_finite_values_are_written_as_null(tmp_path):
    w = MetricsWriter(str(tmp_path))
    w.write({"step": 1, "loss": float("nan"), "mfu": float("inf"), "lr": 1e-3})
    w.close()
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    rec = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert rec == {"step": 1, "loss": None, "mfu": None, "lr": 1e-3}
    assert math.isnan(w.records[0]["loss"])  # the in-memory record keeps the float


def test_a_torn_last_line_is_skipped_by_readers(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    assert read_records(str(path)) == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]
    w = MetricsWriter(str(tmp_path), start_step=3)  # a resume from step 3 drops the torn line
    w.write({"step": 4, "loss": 1.0})
    assert w.plot().endswith("loss.png")
    w.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 4]


def test_resume_drops_records_logged_after_the_checkpoint(tiny_cfg, tmp_path):
    cfg = replace(tiny_cfg, train=dict(steps=8, save_every=4, log_every=1))
    run(cfg, tmp_path / "full")
    run(cfg, tmp_path / "part", stop_at_step=4)
    path = tmp_path / "part" / "metrics.jsonl"
    # What a run killed at step 6 (last checkpoint: 4) leaves: records of steps 5 and 6, a torn line.
    with open(path, "a") as f:
        f.write('{"step": 5, "loss": 9.0}\n{"step": 6, "loss": 9.0}\n{"step": 7, "lo')
    run(cfg, tmp_path / "part", resume=True)
    steps = [r["step"] for r in map(json.loads, open(path))]  # every line parses
    assert steps == list(range(1, 9))
    assert losses(tmp_path / "part") == losses(tmp_path / "full")


def test_a_fresh_run_does_not_append_to_a_dead_runs_metrics(tiny_cfg, tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 40, "loss": 3.0}\n')  # no checkpoint was saved
    run(replace(tiny_cfg, train=dict(steps=2)), tmp_path)
    assert [r["step"] for r in map(json.loads, open(tmp_path / "metrics.jsonl"))] == [1, 2]
