"""Tokens-to-loss: how many training tokens (and seconds) each recipe needs to reach a validation loss, on one fixed
offline corpus, tokenisation and held-out split, several seeds each.

    python -m zoo.bench.tokens_to_loss --out docs/bench/tokens_to_loss            # 5 rows x 2 seeds
    python -m zoo.bench.tokens_to_loss --steps 600 --seeds 3 --out /tmp/t2l

Rows, all on gpt_tiny's shape (4 layers, width 128, 4 heads, 16 x 128 tokens a step), all reading the same batches
(zoo.data.batches of the built-in corpus, Python's pydoc topics, byte tokens, zoo's train/val split by document):
the zoo AdamW baseline (configs/gpt_tiny.py), zoo Muon (the same model with configs/gpt_speedrun_tiny.py's optim
section), zoo Muon + the speedrun's architecture switches (configs/gpt_speedrun_tiny.py), a control (Muon's row with
AdamW in Muon's place: the same rate, warmup-stable-decay schedule, betas and decay), and the nanoGPT recipe
re-implemented in torch (zoo.bench.nanogpt_torch) at the AdamW baseline's shape, peak lr and warmup. The target is
the nanoGPT row's final validation loss (mean over seeds) at the token budget; each row reports the tokens and
seconds to reach it and its own loss at the budget (zoo.bench.loss_curves). Writes results.json, table.md and
loss_vs_tokens.png to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import tempfile

import zoo
from zoo.bench import loss_curves
from zoo.errors import ConfigError, Interrupted, ZooError

NANOGPT = "nanoGPT recipe (re-implemented in torch)"
# Row name -> how its Config is made from the shipped configs (None: the torch row).
ROWS = {"zoo AdamW (gpt_tiny)": lambda: zoo.config("gpt_tiny"),
        "zoo Muon (gpt_tiny + speedrun optim)": lambda: dataclasses.replace(
            zoo.config("gpt_tiny"), optim=zoo.config("gpt_speedrun_tiny").optim),
        "zoo Muon + speedrun switches (gpt_speedrun_tiny)": lambda: zoo.config("gpt_speedrun_tiny"),
        # the control: Muon's row with AdamW in Muon's place (the same rate, schedule, betas and decay)
        "zoo AdamW, speedrun optim's rate and schedule": lambda: dataclasses.replace(
            zoo.config("gpt_tiny"), optim=dataclasses.replace(zoo.config("gpt_speedrun_tiny").optim, name="adamw")),
        NANOGPT: None}
EVAL_BATCHES = 8  # held-out batches per evaluation: the same 8 x 16 x 128 validation tokens for every row


def tokens_per_step(cfg) -> int:
    return cfg.train.batch_size * cfg.data.seq_len


def run_zoo(cfg, steps: int, eval_every: int, seed: int, devices=None) -> list[dict]:
    """One zoo.train run; its curve: {step, tokens, eval_loss, seconds} at each evaluation, seconds the trainer's
    interval times summed (from the end of the first, compiling, step)."""
    sets = {"train.steps": steps, "train.seed": seed, "train.eval_every": eval_every, "train.log_every": eval_every,
            "train.eval_batches": EVAL_BATCHES, "train.save_every": steps, "train.sample_tokens": 0}
    with tempfile.TemporaryDirectory() as tmp:
        run = zoo.train(cfg, workdir=os.path.join(tmp, "run"), overrides=sets, quiet=True, devices=devices)
    if run.interrupted:  # SIGTERM / Ctrl-C: zoo.train saved and returned; the bench stops, its curve half made
        raise Interrupted(f"stopped by a signal at step {run.step} of {steps}")
    curve, seconds = [], 0.0
    for r in run.records:
        seconds += r.get("seconds", 0.0)
        if "eval_loss" in r:
            curve.append({"step": r["step"], "tokens": r["step"] * tokens_per_step(cfg), "eval_loss": r["eval_loss"],
                          "seconds": seconds})
    return curve


def run_nanogpt(cfg, steps: int, eval_every: int, seed: int, threads: int) -> list[dict]:
    """The torch row on the AdamW baseline's batches (the same seed draws the same batches), shape, lr and warmup."""
    from zoo.bench import nanogpt_torch
    from zoo.data import batches, store

    _, tokens = store.prepare(cfg.data)
    train = batches.Batches(tokens.train, cfg.data.seq_len, cfg.train.batch_size, seed)
    evals = batches.eval_batches(tokens.val, cfg.data.seq_len, cfg.train.batch_size, EVAL_BATCHES)
    m = cfg.model
    shape = nanogpt_torch.NanoGptConfig(vocab_size=m.vocab_size, block_size=m.max_len, n_layer=m.num_layers,
                                        n_head=m.num_heads, n_embd=m.d_model)
    curve = nanogpt_torch.train(shape, train, evals, steps, eval_every, seed, cfg.optim.lr,
                                cfg.optim.warmup_steps(steps), threads)
    return [{**p, "tokens": p["step"] * tokens_per_step(cfg)} for p in curve]


def recipe(cfg, sets=()):
    """A shipped config at any token budget: its warmup (steps in the file) keeps its share of the shipped run
    (gpt_tiny: 50 of 800 steps), so a short budget is not mostly warmup; then the `--set` assignments."""
    if cfg.optim.warmup >= 1:
        cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, warmup=cfg.optim.warmup / cfg.train.steps))
    return zoo.config(cfg, overrides=list(sets))


def check_shapes(cfgs: dict) -> None:
    """Every zoo row steps the same tokens on the same data, or tokens-to-loss compares nothing."""
    keys = {name: (c.train.batch_size, c.data.seq_len, c.data.source, c.data.tokenizer) for name, c in cfgs.items()}
    if len(set(keys.values())) > 1:
        raise ConfigError(f"rows differ in (batch, seq_len, source, tokenizer): {keys}")


def bench(steps: int, seeds: int, eval_every: int, rows=None, threads: int | None = None, sets=(), devices=None,
          say=print, partial: str | None = None) -> dict:
    """Every row (default: all of ROWS) for seeds 0..seeds-1; the results: curves, target, summary, table. `sets`:
    `--set` assignments over every row's config (the torch row takes its shape and data from the AdamW row's);
    devices: the jax devices the zoo rows train on (default: all); partial: a JSON file rewritten with the curves
    after each run."""
    rows = list(rows or ROWS)
    base = recipe(ROWS["zoo AdamW (gpt_tiny)"](), sets)
    cfgs = {name: recipe(ROWS[name](), sets) for name in rows if ROWS[name] is not None}
    check_shapes({**cfgs, "base": base})
    threads = threads or os.cpu_count()
    curves = {name: [] for name in rows}  # the table's order; the target's row runs first (a stopped run keeps it)
    for name in sorted(rows, key=lambda n: n != NANOGPT):
        for seed in range(seeds):
            curve = (run_nanogpt(base, steps, eval_every, seed, threads) if name == NANOGPT
                     else run_zoo(cfgs[name], steps, eval_every, seed, devices))
            curves[name].append(curve)
            if partial:  # the curves so far, for a long run stopped before its end
                with open(partial, "w") as f:
                    json.dump(curves, f)
            say(f"{name}, seed {seed}: eval_loss {curve[-1]['eval_loss']:.4f} at {curve[-1]['tokens']:,} tokens, "
                f"{curve[-1]['seconds']:.0f} s")
    return results(curves, steps * tokens_per_step(base), steps=steps, seeds=seeds, eval_every=eval_every,
                   sets=list(sets), threads=threads)


def results(curves: dict, budget: int, **meta) -> dict:
    """The results of curves (row -> one curve per seed) at a token budget: the target (the nanoGPT row's mean
    final loss, else the first row's), each row's summary and the table; `meta` (steps, seeds, ...) kept beside."""
    reference = NANOGPT if curves.get(NANOGPT) else next(iter(curves))
    target = loss_curves.spread([c[-1]["eval_loss"] for c in curves[reference]])["mean"]
    summary = loss_curves.summarise(curves, target, budget)
    return {"date": datetime.date.today().isoformat(), **meta, "budget_tokens": budget, "target_row": reference,
            "target_loss": target, "summary": summary, "curves": curves,
            "table": loss_curves.table(summary, target, budget)}


def write(results: dict, out: str) -> list[str]:
    """results.json, table.md and loss_vs_tokens.png under `out`; their paths."""
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, n) for n in ("results.json", "table.md", "loss_vs_tokens.png")]
    with open(paths[0], "w") as f:
        json.dump(results, f, indent=1)
    with open(paths[1], "w") as f:
        f.write(results["table"] + "\n")
    loss_curves.plot(results["curves"], results["target_loss"], paths[2])
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.bench.tokens_to_loss", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="the token budget, in steps of 16 x 128 tokens (300)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per row, 0..N-1 (2)")
    ap.add_argument("--eval-every", type=int, default=25, help="steps between validation passes (25)")
    ap.add_argument("--row", action="append", choices=list(ROWS), help="repeatable; default: every row")
    ap.add_argument("--threads", type=int, help="torch threads for the nanoGPT row (default: the CPU count)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="repeatable: an override of every row's config (e.g. model.num_layers=2)")
    ap.add_argument("--out", default="tokens_to_loss", help="directory for results.json, table.md, the PNG")
    a = ap.parse_args(argv)
    for flag in ("steps", "seeds", "eval_every"):
        if getattr(a, flag) < 1:
            print(f"error: --{flag.replace('_', '-')}={getattr(a, flag)} must be >= 1", file=sys.stderr)
            return 2
    try:
        os.makedirs(a.out, exist_ok=True)
        results = bench(a.steps, a.seeds, a.eval_every, a.row, a.threads, a.set,
                        partial=os.path.join(a.out, "curves.partial.json"))
    except ZooError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    paths = write(results, a.out)
    print(results["table"])
    print("wrote " + ", ".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
