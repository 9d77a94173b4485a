"""The train step compiled ahead for the first batch (zoo.training.trainer runs the compiled program every step), so a
run says what is compiling and what it cost before its first step: a big model's first step spends minutes here
before anything else prints. Its compile apart, the first step's own time says how long the rest will take
(`time_left`), so a short run of slow steps knows it at step 1 (the user's: at step 10 of 16, 12 minutes in)."""

from __future__ import annotations

import time

import jax

from zoo.configuration import Config
from zoo.training import programs
from zoo.training.records import duration


def compile_ahead(step_fn, state, batch, cfg: Config, say, kept: dict | None = None):
    """step_fn lowered and compiled for the first batch (the compiled program runs every step), the two costs said:
    a big model's first step spends minutes here before anything else prints. `kept` (a setup's programs,
    zoo.training.programs) keeps the compiled program for the next run of the config on batches of this layout."""
    if not hasattr(step_fn, "lower"):  # not a jitted function (a stand-in of a test): it runs as it is
        return step_fn
    first = batch.get("inputs") if isinstance(batch, dict) else None
    shape = tuple(getattr(first if first is not None else jax.tree.leaves(batch)[0], "shape", ()))
    what = (f"the train step (batch {' x '.join(map(str, shape)) or '?'}"
            f"{f', LoRA rank {cfg.model.lora_rank}' if cfg.model.lora_rank else ''}"
            f"{f', {cfg.train.grad_accum} microbatches' if cfg.train.grad_accum > 1 else ''})")
    key = ("train_compiled", programs.batch_key(state, batch)) if kept is not None else None
    if key is not None and key in kept:
        say(f"{what} compiled by an earlier run of this config in this process: reused")
        return kept[key]
    say(f"compiling {what}")
    t0 = time.perf_counter()
    lowered = step_fn.lower(state, batch)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    say(f"compiled the train step in {t2 - t0:.1f} s ({t1 - t0:.1f} s to trace and lower, {t2 - t1:.1f} s in XLA)")
    if key is not None:
        kept[key] = compiled
    return compiled


def time_left(per: float, left: int) -> str:
    """The line saying how long the `left` steps still to run take at `per` seconds a step."""
    return f"{per:.2f} s a step: about {duration(per * left)} for the {left} steps left"
