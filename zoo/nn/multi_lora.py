"""LoRA adapters chosen per row: a batch whose rows each run their own adapter over one shared base (zoo-serve's
adapters per request, zoo.engine.adapters). Where zoo.nn.lora gives every row the model's one adapter, here each
targeted Einsum reads a table of stacked adapters and each row's index into it:

  a_N...r  [N, in..., r]     b_Nr...  [N, r, out...]     (the scale alpha / r already folded into b)
  index_B  [B]               which adapter each row of x runs; index 0 is the zero adapter: the base alone

`intercept(tables, index_B)` adds, to the output of every Einsum whose "/"-joined path is a key of `tables`, each
row's (x A[index]) B[index]: the rows' A and B are gathered ([B, in..., r], [B, r, out...]) and applied with two
batched einsums, so rows of different adapters share one program and one batch. A table's rank r is the largest
adapter's: a smaller adapter is zero-padded, which adds nothing. Nothing here creates params; the tables are
arguments of the jitted programs (zoo.engine.programs), so a new adapter written into a free slot of the table
changes no shape and compiles nothing.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from zoo.nn.layers import Einsum, split_eqn


def delta(m: Einsum, x, a, b, index_B):
    """Each row's (x A[index]) B[index] for Einsum `m` (x's first axis the rows, as every zoo Einsum's is)."""
    xs, w, out = split_eqn(m.eqn)
    n_in = sum(c in xs and c not in out for c in w)
    rows = xs[0]
    a_B = jnp.take(a, index_B, axis=0).astype(m.dtype)  # [B, in..., r]
    b_B = jnp.take(b, index_B, axis=0).astype(m.dtype)  # [B, r, out...]
    mid = "".join(c for c in xs if c not in w[:n_in]) + "r"  # x's letters left after the contraction, then r
    h = jnp.einsum(f"{xs},{rows}{w[:n_in]}r->{mid}", x.astype(m.dtype), a_B)
    return jnp.einsum(f"{mid},{rows}r{w[n_in:]}->{out}", h, b_B)


def intercept(tables: dict, index_B):
    """A context manager under which each Einsum at a path of `tables` ({"h_0/attn/query": (a, b)}) adds its rows'
    adapters (`index_B`: one index per row of the batch applied)."""
    def interceptor(next_fun, args, kwargs, context):
        m = context.module
        if context.method_name != "__call__" or not isinstance(m, Einsum):
            return next_fun(*args, **kwargs)
        y = next_fun(*args, **kwargs)
        ab = tables.get("/".join(m.scope.path))
        return y if ab is None else y + delta(m, args[0], *ab, index_B).astype(y.dtype)
    return nn.intercept_methods(interceptor)
