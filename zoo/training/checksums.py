"""Checksums and finiteness of a tree of arrays, computed on the device(s) where the arrays live.

`fingerprint(tree)` gives one uint32 checksum per array (its path -> value) and whether every float in
the tree is finite. The checksum weights each element's bits by its position, so swapped blocks differ
too; integer sums wrap exactly, so the value is the same under any sharding and on any number of
devices. zoo.training.checkpoint saves the checksums beside each checkpoint and verifies them on every
read; a state that is not finite is never saved.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from zoo.training import run_once


def _bits(x) -> jax.Array:
    """x's bits as a flat uint32 vector (each element's own bytes, zero-extended)."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    width = {1: jnp.uint8, 2: jnp.uint16}.get(x.dtype.itemsize, jnp.uint32)
    return jax.lax.bitcast_convert_type(x, width).astype(jnp.uint32).reshape(-1)


def _sum_and_any(a, b):
    return a[0] + b[0], a[1] | b[1]


def _leaf_check(x) -> tuple[jax.Array, jax.Array]:
    """(a uint32 checksum of x's bits, weighted by position so swapped blocks differ too; 1 if a float of x
    is not finite, else 0). Integer sums wrap exactly, so the checksum is the same under any sharding and on
    any number of devices. Both come from one reduction over x (a float leaf's two separate reductions
    took twice as long to compile: 1.0-1.1 vs 0.5-0.65 s for a tiny model's 151-leaf train state)."""
    u = _bits(x)
    weighted = u * (jnp.arange(u.size, dtype=jnp.uint32) * jnp.uint32(2654435761) + jnp.uint32(1))
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.sum(weighted, dtype=jnp.uint32), jnp.uint32(0)
    bad = jnp.logical_not(jnp.isfinite(x)).reshape(-1).astype(jnp.uint32)
    return jax.lax.reduce((weighted, bad), (jnp.uint32(0), jnp.uint32(0)), _sum_and_any, (0,))


def _check(tree):
    leaves, treedef = jax.tree.flatten(tree)
    checks = [_leaf_check(x) for x in leaves]
    bad = [c[1] for c in checks]
    return (jax.tree.unflatten(treedef, [c[0] for c in checks]),
            jnp.logical_not(jnp.any(jnp.stack(bad) != 0)) if bad else jnp.bool_(True))


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
