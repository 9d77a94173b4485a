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


def _check(tree):
    floats = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jax.tree.map(_leaf_digest, tree), jnp.all(jnp.stack(floats)) if floats else jnp.bool_(True)


@functools.cache
def _checker(platform):
    """_check jitted for arrays on `platform`'s devices (None: numpy arrays, on jax's default devices)."""
    return run_once.jit(_check, platform)


def fingerprint(tree) -> tuple[dict[str, int], bool]:
    """({array path: checksum}, whether every float in `tree` is finite)."""
    devices = [d for x in jax.tree.leaves(tree) if isinstance(x, jax.Array) for d in x.devices()][:1]
    digests, finite = jax.device_get(_checker(devices[0].platform if devices else None)(tree))
    return ({jax.tree_util.keystr(p): int(v) for p, v in jax.tree_util.tree_flatten_with_path(digests)[0]},
            bool(finite))
