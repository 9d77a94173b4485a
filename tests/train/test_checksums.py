"""zoo.training.checksums.fingerprint: the checksum each checkpoint keeps per array and the finiteness check that
keeps a blown-up state from being saved, against a plain numpy statement of the same sums; the same values
however the arrays are sharded."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from zoo.training.checksums import fingerprint


def numpy_digest(a: np.ndarray) -> int:
    """Each element's bits (bool as a byte; 1- and 2-byte types zero-extended) times 2654435761 * position + 1,
    summed modulo 2**32."""
    a = np.asarray(a)
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    u = a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]).reshape(-1).astype(np.uint64)
    w = (np.arange(u.size, dtype=np.uint64) * 2654435761 + 1) % 2**32
    return int((u * w % 2**32).sum() % 2**32)


def tree(rng):
    return {"w": rng.normal(size=(16, 24)).astype(np.float32),
            "half": rng.normal(size=(8, 6)).astype(jnp.bfloat16),
            "step": np.int32(7),
            "ids": rng.integers(-5, 5, size=(4, 8)).astype(np.int32),
            "mask": rng.random((8, 8)) > 0.5,
            "key": jax.random.key_data(jax.random.PRNGKey(3))}


def with_optimizer_state(t, rng):
    """t and an optax state beside it (tuples and named tuples of arrays, as a train state holds)."""
    opt = optax.adamw(1e-3).init({"w": t["w"]}), optax.EmptyState()
    return {**t, "opt": opt, "pair": (rng.normal(size=(3,)).astype(np.float32), np.int32(1))}


def test_checksums_are_the_numpy_sums_and_every_float_counts_for_finiteness():
    t = tree(np.random.default_rng(0))
    digests, finite = fingerprint(jax.device_put(t, jax.devices()[0]))
    assert digests == {f"['{k}']": numpy_digest(v) for k, v in t.items()} and finite
    key = jax.random.PRNGKey(3)
    assert fingerprint({"k": jax.random.wrap_key_data(key)})[0] == {"['k']": numpy_digest(np.asarray(key))}
    for leaf, value in [("w", np.nan), ("w", np.inf), ("half", -np.inf), ("half", np.nan)]:
        bad = dict(t, **{leaf: t[leaf].copy()})
        bad[leaf][1, 2] = value
        got, finite = fingerprint(bad)
        assert not finite, (leaf, value)
        assert got["['w']"] == numpy_digest(bad["w"])
    swapped = dict(t, w=np.concatenate([t["w"][8:], t["w"][:8]]))  # the same values in another order
    assert fingerprint(swapped)[0]["['w']"] != digests["['w']"]
    assert fingerprint({"i": np.int32(2**31 - 1)})[1]  # integers are never "not finite"
    assert fingerprint({}) == ({}, True)
    full = with_optimizer_state(t, np.random.default_rng(5))
    digests, finite = fingerprint(full)
    flat = jax.tree_util.tree_flatten_with_path(full)[0]
    assert finite and digests == {jax.tree_util.keystr(p): numpy_digest(v) for p, v in flat} and len(digests) == 11
    blown = jax.tree_util.tree_map_with_path(  # a moment of the optimizer state blew up
        lambda p, v: v.at[0, 0].set(jnp.nan) if ".mu" in jax.tree_util.keystr(p) else v, full)
    assert not fingerprint(blown)[1]


@pytest.mark.parametrize("spec", [P("a"), P(None, "b"), P(("a", "b"), "c"), P(("a", "b", "c"))])
def test_the_same_checksums_under_any_sharding(spec):
    t = tree(np.random.default_rng(1))
    t["w"], t["wide"] = t["w"][:16, :16], np.random.default_rng(2).normal(size=(32, 8)).astype(np.float32)
    one = fingerprint(jax.device_put(t, jax.devices()[0]))
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("a", "b", "c"))
    sharded = {k: jax.device_put(v, NamedSharding(mesh, spec if k in ("w", "wide") else P())) for k, v in t.items()}
    assert not sharded["w"].sharding.is_fully_replicated
    assert fingerprint(sharded) == one
