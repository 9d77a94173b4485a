"""Checksums and finiteness of a tree of arrays, computed on the device(s) where the arrays live.

`fingerprint(tree)` gives one uint32 checksum per array (its path -> value) and whether every float in
the tree is finite. The checksum weights each element's bits by its position, so swapped blocks differ
too; integer sums wrap exactly, so the value is the same under any sharding and on any number of
devices. zoo.train.checkpoint saves the checksums beside each checkpoint and verifies them on every
read; a state that is not finite is never saved.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from zoo.train import run_once


def _leaf_digest(x) -> jax.Array:
    """A uint32 checksum of an array's bits, weighted by position (so swapped blocks differ too). Integer
    sums wrap exactly, so the value is the same under any sharding and on any number of devices."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    width = {1: jnp.uint8, 2: jnp.uint16}.get(x.dtype.itemsize, jnp.uint32)
    u = jax.lax.bitcast_convert_type(x, width).astype(jnp.uint32).reshape(-1)
    weight = jnp.arange(u.size, dtype=jnp.uint32) * jnp.uint32(2654435761) + jnp.uint32(1)
    return jnp.sum(u * weight, dtype=jnp.uint32)


def _leaf_check(x):
    """(the digest of one array, whether it is finite)."""
    return _leaf_digest(x), jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.bool_(True)


@functools.cache
def _checker(platform):
    """_leaf_check jitted for arrays on `platform`'s devices (None: numpy arrays, on jax's default devices).
    One small program per array shape, dtype and sharding, not one per tree: a model's layers, its optimizer
    moments and the next run of the same model (a resume, an evaluation, another test) reuse them, where a
    program for the whole tree was compiled again for every new tree."""
    return run_once.jit(_leaf_check, platform)


def fingerprint(tree) -> tuple[dict[str, int], bool]:
    """({array path: checksum}, whether every float in `tree` is finite)."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    devices = [d for _, x in flat if isinstance(x, jax.Array) for d in x.devices()][:1]
    check = _checker(devices[0].platform if devices else None)
    results = jax.device_get([check(x) for _, x in flat])  # dispatched together, fetched once
    return ({jax.tree_util.keystr(p): int(v) for (p, _), (v, _) in zip(flat, results)},
            all(bool(ok) for _, ok in results))
