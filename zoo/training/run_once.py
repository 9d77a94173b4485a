"""Compiler options for the programs a run executes once or at checkpoints only: the state's
initialisation and the checksums of a saved or restored state.

On the CPU, XLA hands each fusion to LLVM at optimisation level 2 by default, and a tiny model's
initialisation (some thirty inlined threefry hashes) spends 5-7 s there. Level 1 compiles it in about
half that and gives the same bits (tests/train/test_run_once.py), while a program that runs once has no
use for the faster code. The training and evaluation steps keep XLA's defaults. Other platforms keep
them too: their compile times were not measured. A process whose XLA_FLAGS ask for a lower level (zoo's
test suite asks for 0) gets that level here too: level 1 is a ceiling, never a raise.
"""

from __future__ import annotations

import os
import re

import jax

LEVEL = 1


def cpu_options() -> dict:
    """The compiler options of a run-once program on CPUs: level 1, or the lower level XLA_FLAGS asks for."""
    asked = re.findall(r"--xla_backend_optimization_level=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return {"xla_backend_optimization_level": min(LEVEL, int(asked[-1])) if asked else LEVEL}


def jit(fun, platform: str | None = None, **kw):
    """jax.jit(fun, **kw), compiled at level 1 (at most) when it runs on CPUs (`platform`; None: jax's default)."""
    return jax.jit(fun, compiler_options=cpu_options() if (platform or jax.default_backend()) == "cpu" else None, **kw)
