"""The pod table (zoo.aot.pods) without compiling a model: every row's config, overrides and target resolve as
the command would run them; the table, the README's rewrite and --rows come from stub reports; the largest-batch
search finds the exact size on a stub memory line in few compiles; the collectives inside a counted loop (a
scanned layer stack) are counted once a trip, which the table's step estimates rest on."""

import json
import os

import pytest

from zoo.aot import pods, report, target as targets
from zoo.training import sharding

EXPECT = {  # row -> (model layers, seq_len, chips, slices, mesh (data, fsdp, tensor, expert))
    "gpt2_small": (12, 1024, 8, 1, (8, 1, 1, 1)),
    "bert_base": (12, 128, 8, 1, (8, 1, 1, 1)),
    "llama3_1b": (16, 2048, 8, 1, (1, 8, 1, 1)),
    "mistral_7b": (32, 4096, 8, 1, (1, 8, 1, 1)),
    "mixtral_8x7b": (32, 4096, 32, 1, (1, 4, 1, 8)),
    "gpt2_small, 2 slices": (12, 1024, 16, 2, (16, 1, 1, 1)),
}


@pytest.mark.parametrize("row", pods.ROWS, ids=lambda r: r.name)
def test_every_row_resolves_offline_with_its_target_and_mesh(row):
    layers, seq_len, chips, slices, mesh = EXPECT[row.name]
    cfg = pods.resolve(row)  # as train.py resolves it: no tokenizer download (vocab_size given or not needed)
    t = targets.parse(row.target)
    assert (cfg.model.num_layers, cfg.data.seq_len, t.chips, t.slices) == (layers, seq_len, chips, slices)
    assert cfg.model.scan_layers and cfg.model.dtype == "bfloat16"  # minutes of compiling, TPU compute
    assert sharding.mesh_shape(cfg.mesh, t.chips) == mesh
    data, fsdp, _, expert = mesh
    assert cfg.train.batch_size % (data * fsdp * expert * cfg.train.grad_accum) == 0  # the batch splits evenly


def test_the_presets_are_the_published_models():
    cfg = {r.name: pods.resolve(r) for r in pods.ROWS if r.config.startswith("preset:")}
    assert cfg["mixtral_8x7b"].model.num_experts == 8 and cfg["mixtral_8x7b"].model.experts_per_token == 2
    assert cfg["mistral_7b"].model.sliding_window == 4096 and cfg["llama3_1b"].model.vocab_size == 128256
    assert all(c.model.remat for c in cfg.values())


def _report(**kw):
    r = {"row": "mistral_7b", "target": "v5p-16", "chips": 8, "slices": 1, "mesh": {"data": 1, "fsdp": 8, "tensor": 1,
         "expert": 1}, "batch_size": 32, "seq_len": 4096, "bytes_per_device": {"total": 32.51e9},
         "hbm_per_device": 95e9, "fits": True, "estimate": {"step_s": 1.7584, "mfu": 0.4449}, "compile_seconds": 118.4,
         "maxtext": ""}
    return {**r, **kw}


def test_the_table_has_a_line_a_report():
    two = _report(row="gpt2_small, 2 slices", target="v5e-8/2", chips=16, slices=2, fits=False,
                  mesh={"data": 16, "fsdp": 1, "tensor": 1, "expert": 1}, largest_batch="none fits", estimate=None,
                  maxtext="54.9%: x")
    failed = {"row": "mixtral_8x7b", "target": "v5p-64", "batch_size": 64, "seq_len": 4096, "maxtext": "",
              "error": "ConfigError: no"}
    lines = pods.table([_report(), two, failed]).splitlines()
    assert len(lines) == 5 and lines[0].count("|") == lines[1].count("|") == 12
    assert lines[2] == ("| mistral_7b | v5p-16 (8) | fsdp=8 | 32 x 4096 | 32.5 of 95.0 | yes | not searched | "
                        "1,758 ms | 44% | 118 |  |")
    assert lines[3] == ("| gpt2_small, 2 slices | v5e-8/2 (16, 2 slices) | data=16 | 32 x 4096 | 32.5 of 95.0 | no | "
                        "none fits |  |  | 118 | 54.9%: x |")
    assert lines[4].startswith("| mixtral_8x7b | v5p-64 | | 64 x 4096 | ConfigError: no |")
    assert all(line.count("|") == 12 for line in lines)


README = "# zoo\n\ntext before\n\n<!-- pod-table -->\nold table\n| a |\n<!-- /pod-table -->\n\ntext after\n"


def test_the_readme_rewrite_replaces_only_what_stands_between_the_markers():
    out = pods.rewrite(README, "new\n| b |\n")
    assert out == "# zoo\n\ntext before\n\n<!-- pod-table -->\nnew\n| b |\n<!-- /pod-table -->\n\ntext after\n"
    assert pods.rewrite(out, "new\n| b |") == out  # idempotent
    with pytest.raises(ValueError, match="expected one pair"):
        pods.rewrite("no markers here\n", "x")
    with pytest.raises(ValueError, match="expected one pair"):
        pods.rewrite(README + README, "x")


def test_rows_from_a_file_rewrite_the_readme_without_compiling(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pods, "compile_row", lambda row: pytest.fail("--rows compiled a row"))
    rows, readme = tmp_path / "rows.jsonl", tmp_path / "README.md"
    meta = {"date": "2026-11-28", "wall_s": 1234.0, "versions": "jax 0.10.2, libtpu 0.0.42.1"}
    rows.write_text(json.dumps(_report()) + "\n" + json.dumps(meta) + "\n")
    readme.write_text(README)
    assert pods.main(["--rows", str(rows), "--write", str(readme)]) == 0
    text = readme.read_text()
    assert "--out docs/aot/pods-2026-11-28.jsonl" in text and "on 2026-11-28 (jax 0.10.2, libtpu 0.0.42.1): 21 min" in text
    assert "roofline estimates" in text and "| mistral_7b | v5p-16 (8) |" in text
    assert text.startswith("# zoo\n\ntext before\n") and text.endswith("<!-- /pod-table -->\n\ntext after\n")
    assert "| mistral_7b |" in capsys.readouterr().out


def test_the_shipped_readme_holds_the_table_of_every_row():
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as f:
        text = f.read()
    inside = text.split(pods.BEGIN + "\n")[1].split(pods.END)[0]
    for row in pods.ROWS:
        assert f"\n| {row.name} | {row.target} " in inside, row.name
    assert pods.rewrite(text, inside) == text


def test_largest_batch_meets_the_memory_line_in_few_compiles(monkeypatch):
    from zoo.aot import train
    calls = []

    def compile_step(cfg, devices):  # 3 GB of state and gradients + 0.7 GB a row beyond 8 rows' 1 GB of code
        calls.append(cfg.train.batch_size)
        return {"bytes_per_device": {"total": 3e9 + 0.7e9 * cfg.train.batch_size + (1e9 if cfg.train.batch_size > 8
                                                                                     else 0)}}, 1.0
    monkeypatch.setattr(train, "compile_step", compile_step)
    cfg = pods.resolve(pods.ROWS[0])  # gpt2_small: 8-way data parallel, batch 64
    first = {"mesh": {"data": 8, "fsdp": 1, "tensor": 1, "expert": 1}, "hbm_per_device": 16e9,
             "bytes_per_device": {"total": 3e9 + 1e9 + 0.7e9 * 64, "params": 0.5e9, "optimizer": 1e9}}
    # 64 rows: 48.8 GB, no fit; 16 rows: 15.2 GB fits, 24 rows: 20.8 GB does not (8-row steps)
    assert pods.largest_batch(cfg, None, first) == "16" and len(calls) <= 3
    calls.clear()
    assert pods.largest_batch(cfg, None, first, compiles=1) == ">= 16" and calls == [16]  # not settled: said so


def test_a_counted_loops_collectives_count_once_a_trip():
    hlo = """HloModule m

%cond (p: (s32[], bf16[1024])) -> pred[] {
  %p = (s32[], bf16[1024]{0}) parameter(0)
  %c = s32[]{:T(128)} constant(32)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  ROOT %lt = pred[]{:T(512)} compare(%i, %c), direction=LT
}

%body (p: (s32[], bf16[1024])) -> (s32[], bf16[1024]) {
  %p = (s32[], bf16[1024]{0}) parameter(0)
  %x = bf16[1024]{0} get-tuple-element(%p), index=1
  %ag = bf16[4096]{0} all-gather(%x), replica_groups={}, dimensions={0}
  ROOT %t = (s32[], bf16[1024]{0}) tuple(%i, %x)
}

ENTRY %main (a: bf16[1024]) -> bf16[1024] {
  %a = bf16[1024]{0} parameter(0)
  %w = (s32[], bf16[1024]{0}) while(%t0), condition=%cond, body=%body
  %ar = f32[256]{0} all-reduce(%a), replica_groups={}, to_apply=%add
  ROOT %o = bf16[1024]{0} get-tuple-element(%w), index=1
}
"""
    c = report.collectives(hlo)
    assert c["all-gather"] == 4096 * 2 * 32  # the body's gather, 32 trips
    assert c["all-reduce"] == 256 * 4  # outside the loop: once
