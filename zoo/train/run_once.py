"""Compiler options for the programs a run executes once or at checkpoints only: the state's
initialisation and the checksums of a saved or restored state.

On the CPU, XLA hands each fusion to LLVM at optimisation level 2 by default, and a tiny model's
initialisation (some thirty inlined threefry hashes) spends 5-7 s there. Level 1 compiles it in about
half that and gives the same bits (tests/train/test_run_once.py), while a program that runs once has no
use for the faster code. The training and evaluation steps keep XLA's defaults. Other platforms keep
them too: their compile times were not measured.
"""

from __future__ import annotations

import jax

CPU = {"xla_backend_optimization_level": 1}


def jit(fun, platform: str | None = None, **kw):
    """jax.jit(fun, **kw), compiled at level 1 when it runs on CPUs (`platform`; None: jax's default)."""
    return jax.jit(fun, compiler_options=CPU if (platform or jax.default_backend()) == "cpu" else None, **kw)
