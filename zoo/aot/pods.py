"""The shipped presets compiled for the pods people rent, as one table in the README (issue #51):

    python -m zoo.aot.pods --out docs/aot/pods-DATE.jsonl --write README.md   # every row (~20-30 min on 2 cores)
    python -m zoo.aot.pods --only mistral_7b                                  # one row, printed
    python -m zoo.aot.pods --rows docs/aot/pods-DATE.jsonl --write README.md  # the table again, nothing compiled

Each row is a run as `train.py CONFIG --compile-for TARGET --set ...` compiles it (zoo.aot.train), its layers
scanned (minutes of compiling, not tens of them) and its compute in bfloat16. The step time and MFU are roofline
estimates (zoo.aot.report), set beside MaxText's measured MFU where MaxText publishes one for a comparable model
and chip. The largest batch is searched by the secant on the compiled bytes per device (memory grows about
linearly with the batch): 2-4 more compiles a row, where compile_for's doubling and halving take 6-9.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import sys
import time

from zoo.configuration import Config, DataConfig, TrainConfig
from zoo.overrides import apply_overrides

BEGIN, END = "<!-- pod-table -->", "<!-- /pod-table -->"
MAXTEXT = "https://github.com/AI-Hypercomputer/maxtext/blob/e591f30cbbf217ed67ef71263ec0538239f9c3b8/"
LLM = ("model.dtype=bfloat16", "model.scan_layers=true", "model.remat=true", "train.grad_accum=1")
GPT2 = ("model.vocab_size=50257", "model.dtype=bfloat16", "model.scan_layers=true", "train.grad_accum=1")


@dataclasses.dataclass(frozen=True)
class Row:
    name: str  # the table's first column, and --only's argument
    config: str  # a shipped config's name, or "preset:NAME": a GPT preset on the built-in corpus (its shape only)
    sets: tuple[str, ...]  # --set overrides
    target: str  # zoo.aot.target's form: "v5e-8", "v5p-16", "v5e-8/2"
    largest_batch: bool = False  # also search the largest train.batch_size that fits (2-4 more compiles)
    maxtext: str = ""  # MaxText's measured MFU for a comparable model and chip, as markdown with its source


ROWS = [
    Row("gpt2_small", "gpt2_small", GPT2 + ("train.batch_size=64",), "v5e-8", largest_batch=True),
    Row("bert_base", "bert_base_mlm", ("model.scan_layers=true", "train.batch_size=256"), "v5e-8"),
    Row("llama3_1b", "preset:llama3_1b", LLM + ("data.seq_len=2048", "train.batch_size=32", "mesh.data=1",
                                                "mesh.fsdp=8"), "v5e-8"),
    Row("mistral_7b", "preset:mistral_7b", LLM + ("data.seq_len=4096", "train.batch_size=32", "mesh.data=1",
                                                  "mesh.fsdp=8"), "v5p-16"),
    Row("mixtral_8x7b", "preset:mixtral_8x7b", LLM + ("data.seq_len=4096", "train.batch_size=64", "mesh.data=1",
                                                      "mesh.fsdp=4", "mesh.expert=8"), "v5p-64",
        maxtext=f"54.9%: Mixtral 8x7B on v5p-128 ([Run_Mixtral.md]({MAXTEXT}tests/end_to_end/tpu/mixtral/"
                f"Run_Mixtral.md))"),
    Row("gpt2_small, 2 slices", "gpt2_small", GPT2 + ("train.batch_size=128",), "v5e-8/2"),
]


def resolve(row: Row) -> Config:
    """The row's run config as `train.py` resolves it (nothing compiled, downloaded or written)."""
    from zoo.api.start import start
    config = row.config
    if config.startswith("preset:"):
        from zoo.models.gpt import PRESETS
        config = Config(task="gpt_lm", model=PRESETS[config[len("preset:"):]], data=DataConfig(),
                        train=TrainConfig(steps=1000))
    return start(config, workdir="unused", overrides=list(row.sets), dry=True).config


def largest_batch(cfg: Config, devices, first: dict, compiles: int = 4) -> str:
    """The largest train.batch_size that fits ("N", or ">= N" when `compiles` more did not settle it): each guess
    where the line through the two nearest compiled sizes' bytes per device meets the chip's HBM."""
    from zoo.aot import train
    mesh, hbm = first["mesh"], first["hbm_per_device"]
    unit = mesh["data"] * mesh["fsdp"] * mesh["expert"] * cfg.train.grad_accum
    seen = {cfg.train.batch_size: first["bytes_per_device"]["total"]}  # batch -> bytes per device
    for _ in range(compiles):
        lo = max((b for b, y in seen.items() if y <= hbm), default=0)
        hi = min((b for b, y in seen.items() if y > hbm), default=None)
        if hi is not None and hi - lo <= unit:
            break
        points = sorted(seen.items(), key=lambda p: abs(p[1] - hbm))[:2]
        if len(points) == 1:  # the first line: from the state alone (batch 0) through the row's own batch
            points.insert(0, (0, first["bytes_per_device"]["params"] + first["bytes_per_device"]["optimizer"]))
        (b0, y0), (b1, y1) = points
        guess = b1 + (hbm - y1) * (b1 - b0) / (y1 - y0) if y1 != y0 else 2 * b1
        guess = min(max(int(guess) // unit * unit, lo + unit), hi - unit if hi else 4 * max(seen))  # 4x: a bad line
        fig, _ = train.compile_step(apply_overrides(cfg, [f"train.batch_size={guess}"]), devices)
        seen[guess] = fig["bytes_per_device"]["total"]
    lo = max((b for b, y in seen.items() if y <= hbm), default=0)
    hi = min((b for b, y in seen.items() if y > hbm), default=None)
    return ("none fits" if not lo else str(lo)) if hi is not None and hi - lo <= unit else f">= {lo}"


def compile_row(row: Row) -> dict:
    """The row's compile_for report, with the run's batch and length, the largest batch, and its own seconds."""
    from zoo.aot import target as targets, train
    t0 = time.perf_counter()
    cfg = resolve(row)
    out = {"row": row.name, "config": row.config, "sets": list(row.sets), "batch_size": cfg.train.batch_size,
           "seq_len": cfg.data.seq_len, "maxtext": row.maxtext}
    try:
        out.update(train.compile_for(cfg, row.target))
        if row.largest_batch:
            out["largest_batch"] = largest_batch(cfg, targets.devices(targets.parse(row.target)), out)
    except Exception as e:  # one row's failure is that row's cell, not the end of a 25-minute table
        out.update(target=row.target, error=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}")
    out["wall_s"] = time.perf_counter() - t0
    return out


def table(reports: list[dict]) -> str:
    """The reports as a markdown table, one line a row."""
    head = ("| model | target (chips) | mesh | batch x length | GB per chip (of HBM) | fits | largest batch | "
            "est. step | est. MFU | compile s | MaxText MFU (measured) |")
    lines = [head, "|" + "---|" * head.count(" |")]
    for r in reports:
        first = f"| {r['row']} | {r['target']}"
        if r.get("error"):
            lines.append(f"{first} | | {r['batch_size']} x {r['seq_len']} | {r['error']} | | | | | | {r['maxtext']} |")
            continue
        slices = f", {r['slices']} slices" if r["slices"] > 1 else ""
        mesh = " ".join(f"{k}={v}" for k, v in r["mesh"].items() if v > 1) or "1 device"
        mem = f"{r['bytes_per_device']['total'] / 1e9:.1f} of {r['hbm_per_device'] / 1e9:.1f}"
        e = r["estimate"]
        step, mfu = (f"{e['step_s'] * 1e3:,.0f} ms", f"{e['mfu'] * 100:.0f}%") if e else ("", "")
        lines.append(f"{first} ({r['chips']}{slices}) | {mesh} | {r['batch_size']} x {r['seq_len']} | {mem} | "
                     f"{'yes' if r['fits'] else 'no'} | {r.get('largest_batch', 'not searched')} | {step} | {mfu} | "
                     f"{r['compile_seconds']:.0f} | {r['maxtext']} |")
    return "\n".join(lines)


def versions() -> str:
    import importlib.metadata as md
    return f"jax {md.version('jax')}, libtpu {md.version('libtpu')}"


def section(reports: list[dict], meta: dict) -> str:
    """What stands between the README's markers: how the table was made, then the table."""
    return (f"Made by `python -m zoo.aot.pods --out docs/aot/pods-{meta['date']}.jsonl --write README.md` on "
            f"{meta['date']} ({meta['versions']}): {meta['wall_s'] / 60:.0f} min on a 2-core CPU host with no TPU. "
            f"Step times and MFU are **roofline estimates** of the compiled program (`zoo/aot/report.py`), not "
            f"measurements; MaxText's MFU is measured on the chips.\n\n" + table(reports))


def rewrite(text: str, body: str) -> str:
    """`text` with what stands between the marker lines replaced by `body`; an error where there is not one pair."""
    pattern = re.compile(rf"(^{re.escape(BEGIN)}\n).*?(^{re.escape(END)}$)", re.S | re.M)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"expected one pair of {BEGIN} ... {END} lines")
    return pattern.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m zoo.aot.pods", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", help="a row's name (repeatable); default: every row")
    p.add_argument("--out", help="write each row's report to this JSONL file as it is made")
    p.add_argument("--rows", help="read the reports from this JSONL file (an --out) instead of compiling")
    p.add_argument("--write", help="replace what stands between the pod-table marker lines of this file")
    a = p.parse_args(argv)
    if a.rows:
        with open(a.rows) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        reports, meta = [r for r in lines if "row" in r], [r for r in lines if "row" not in r][-1]
    else:
        rows = [r for r in ROWS if not a.only or r.name in a.only]
        if a.only and len(rows) != len(set(a.only)):
            p.error(f"--only: the rows are {', '.join(r.name for r in ROWS)}")
        t0, out, reports = time.perf_counter(), open(a.out, "w") if a.out else None, []
        for row in rows:  # each row written as it is made: a run cut short keeps what it compiled
            reports.append(compile_row(row))
            print(table(reports[-1:]).splitlines()[-1], f"({reports[-1]['wall_s']:.0f} s)", flush=True)
            if out:
                out.write(json.dumps(reports[-1]) + "\n")
                out.flush()
        meta = {"date": datetime.date.today().isoformat(), "wall_s": time.perf_counter() - t0, "versions": versions()}
        if out:
            out.write(json.dumps(meta) + "\n")
            out.close()
    print(section(reports, meta))
    if a.write:
        with open(a.write) as f:
            text = f.read()
        with open(a.write, "w") as f:
            f.write(rewrite(text, section(reports, meta)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
