"""The layer stack: L blocks as a Python loop or one `nn.scan`, with optional remat (and its policy).

Block modules called through `stack_blocks` take `(x, mask, deterministic, decode, *more)` and
return `x` (or `(x, None)` when `scanned`), so one stack serves every family.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

# model.remat_policy -> the jax.checkpoint policy: what the backward pass keeps instead of recomputing.
# full: nothing (recompute the whole block); dots: every matmul output; dots_no_batch: the matmul outputs
# without a batch dimension in the contraction (the projections and MLP, not the attention scores).
REMAT_POLICIES = {"full": None, "dots": jax.checkpoint_policies.dots_saveable,
                  "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def stack_blocks(block_cls, num_layers: int, *, scan: bool, remat: bool, name: str, remat_policy: str = "full",
                 per_layer: dict | None = None, **block_kw):
    """L blocks as a Python loop (params h_0..h_{L-1}) or as one nn.scan (params h[L, ...]).

    Returns a callable (x, *args) -> x. Positional args after x are broadcast to every layer. `per_layer`
    ({attribute: L values}, e.g. Gemma's local/global layers) sets block attributes that differ by layer:
    looped, block i gets value i as a (static) attribute; scanned, the block is called with one more
    positional arg, the dict of this layer's values (traced scalars), which it reads in their place.
    The looped stack's callable also takes `skip_weights` (n <= L/2 values; modded-nanogpt's U-net): the
    output of block i < n is added, times skip_weights[i], to the input of its mirror, block L-1-i; and
    `layer_kw`, L dicts (or None) of keyword arguments for each block's call alone (modded-nanogpt's value
    embeddings).
    """
    cls = block_cls
    if remat:
        # deterministic and decode (args 3, 4 counting self) are Python bools: static.
        cls = nn.remat(cls, static_argnums=(3, 4), prevent_cse=not scan, policy=REMAT_POLICIES[remat_policy])
    if scan:
        def scanned(in_axes):
            # "intermediates": what a block sows (attention weights, when asked) comes back stacked [L, ...];
            # "moe" likewise (zoo.nn.moe: the router's statistics for the load-balancing loss).
            return nn.scan(cls, variable_axes={"params": 0, "cache": 0, "intermediates": 0, "moe": 0},
                           split_rngs={"params": True, "dropout": True},
                           in_axes=in_axes, length=num_layers,
                           metadata_params={nn.PARTITION_NAME: "layers"})(scanned=True, name=name, **block_kw)
        if per_layer:
            def run_per_layer(x, *args):  # built at the call, when the number of broadcast args is known
                values = {k: jnp.asarray(v) for k, v in per_layer.items()}
                return scanned((nn.broadcast,) * len(args) + (0,))(x, *args, values)[0]
            return run_per_layer
        stack = scanned(nn.broadcast)

        def run_scanned(x, *args):
            return stack(x, *args)[0]
        return run_scanned
    per_layer = per_layer or {}
    blocks = [cls(name=f"{name}_{i}", **block_kw, **{k: v[i] for k, v in per_layer.items()})
              for i in range(num_layers)]

    def run(x, *args, skip_weights=None, layer_kw=None):
        n = 0 if skip_weights is None else skip_weights.shape[0]
        skips = []  # the outputs of blocks 0..n-1, the last on top: block L-1-i pops block i's
        for i, b in enumerate(blocks):
            if i >= num_layers - n:
                x = x + skip_weights[num_layers - 1 - i].astype(x.dtype) * skips.pop()
            x = b(x, *args, **((layer_kw[i] or {}) if layer_kw else {}))
            if i < n:
                skips.append(x)
        return x
    return run


def residual_std(num_layers: int, std: float = 0.02) -> float:
    """GPT-2: residual projections scaled by 1/sqrt(2L) so the residual stream's variance stays O(1)."""
    return std / math.sqrt(2 * num_layers)
