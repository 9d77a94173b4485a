"""zoo's einsum attention (the CPU path) against jax.nn.dot_product_attention's XLA backend."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.nn import attention as layers


def _qkv(B=2, T=6, S=6, N=4, K=4, H=8, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    return (jax.random.normal(k[0], (B, T, N, H)), jax.random.normal(k[1], (B, S, K, H)),
            jax.random.normal(k[2], (B, S, K, H)), jax.random.normal(k[3], (1, N, T, S)))


@pytest.mark.parametrize("case", ["causal", "padding", "bias", "grouped", "grouped_bias", "cross", "unscaled"])
def test_einsum_attention_equals_jax_xla_with_gradients(case):
    S = 9 if case == "cross" else 6
    q, k, v, bias = _qkv(S=S, K=2 if case.startswith("grouped") else 4)
    valid_BS = jnp.arange(S)[None, :] < jnp.array([[S], [S - 2]])
    kw = {"causal": dict(is_causal=True), "padding": dict(mask=valid_BS[:, None, None, :]),
          "bias": dict(bias=bias, mask=valid_BS[:, None, None, :]), "grouped": dict(is_causal=True),
          "grouped_bias": dict(bias=bias, mask=valid_BS[:, None, None, :], is_causal=True),
          "cross": dict(mask=valid_BS[:, None, None, :]), "unscaled": dict(is_causal=True, scale=1.0)}[case]
    # Both sides jitted: one compile each, not one per op.
    ours = jax.jit(lambda q, k, v: layers.attention(q, k, v, implementation="einsum", **kw))
    ref = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla", **kw))
    np.testing.assert_allclose(ours(q, k, v), ref(q, k, v), rtol=1e-5, atol=1e-6)
    w = jax.random.normal(jax.random.PRNGKey(9), q.shape)
    g1 = jax.jit(jax.grad(lambda *a: jnp.sum(ours(*a) * w), (0, 1, 2)))(q, k, v)
    g0 = jax.jit(jax.grad(lambda *a: jnp.sum(ref(*a) * w), (0, 1, 2)))(q, k, v)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_grouped_keys_and_values_are_never_repeated_to_the_query_heads():
    """Each key/value head is read by its query heads where it lies: no array of the program holds the keys or
    values of all N query heads ([B, S, N, H]), which repeating them made (a decoding step's whole cache, G times)."""
    q, k, v, _ = _qkv(B=2, T=1, S=64, N=6, K=2, H=8)
    jaxpr = jax.make_jaxpr(lambda q, k, v: layers.attention(q, k, v, implementation="einsum"))(q, k, v)
    shapes = {tuple(var.aval.shape) for eqn in jaxpr.eqns for var in eqn.outvars}
    assert (2, 64, 6, 8) not in shapes and (2, 64, 2, 8) not in shapes - {k.shape}
    assert (2, 2, 3, 1, 64) in shapes  # the scores: [B, K, G, T, S]


def test_a_query_with_every_key_masked_stays_finite():
    q, k, v, _ = _qkv()
    out = layers.einsum_attention(q, k, v, mask=jnp.zeros((1, 1, 6, 6), bool))
    assert bool(jnp.all(jnp.isfinite(out)))
    np.testing.assert_allclose(out, jnp.broadcast_to(v.mean(1, keepdims=True), out.shape), rtol=1e-5, atol=1e-6)


def test_auto_is_einsum_on_cpu():
    q, k, v, _ = _qkv()
    assert jax.default_backend() == "cpu"
    np.testing.assert_array_equal(layers.attention(q, k, v, is_causal=True),
                                  layers.einsum_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("case", ["causal", "padding", "grouped"])
def test_the_weights_einsum_attention_returns_are_the_softmax_rows_of_its_output(case):
    S = 6
    q, k, v, _ = _qkv(S=S, K=2 if case == "grouped" else 4)
    valid_BS = jnp.arange(S)[None, :] < jnp.array([[S], [S - 2]])
    kw = dict(mask=valid_BS[:, None, None, :]) if case == "padding" else dict(is_causal=True)
    out, w_BNTS = layers.einsum_attention(q, k, v, weights=True, **kw)
    np.testing.assert_array_equal(out, layers.einsum_attention(q, k, v, **kw))  # the same output, computed the same way
    v_BSNH = jnp.repeat(v, q.shape[2] // v.shape[2], axis=2)
    np.testing.assert_allclose(jnp.einsum("BNTS,BSNH->BTNH", w_BNTS, v_BSNH), out, rtol=1e-5, atol=1e-6)
    # An independent softmax of the scaled, masked logits.
    logits = jnp.einsum("BTNH,BSNH->BNTS", q, jnp.repeat(k, q.shape[2] // k.shape[2], axis=2)) / np.sqrt(q.shape[-1])
    allowed = kw["mask"] if case == "padding" else jnp.tril(jnp.ones((6, S), bool))
    np.testing.assert_allclose(w_BNTS, jax.nn.softmax(jnp.where(allowed, logits, -jnp.inf), axis=-1), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(w_BNTS.sum(-1), 1.0, atol=1e-6)
    assert not jnp.any(jnp.where(allowed, 0.0, w_BNTS))  # exactly 0 on every key a query may not see


def test_segment_ids_keep_each_query_in_its_example_on_every_cpu_backend():
    q, k, v, _ = _qkv(T=8, S=8, K=2)
    seg = jnp.asarray([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1, 2, 2]])
    for impl in ("einsum", "xla"):
        out = layers.attention(q, k, v, is_causal=True, implementation=impl, segment_ids_BT=seg)
        for b, (lo, hi) in ((0, (3, 7)), (1, (6, 8))):  # the second example of each row, alone
            alone = layers.attention(q[b:b + 1, lo:hi], k[b:b + 1, lo:hi], v[b:b + 1, lo:hi], is_causal=True,
                                     implementation=impl)
            np.testing.assert_allclose(out[b:b + 1, lo:hi], alone, rtol=1e-5, atol=1e-6)


def test_packed_layout_is_each_examples_length_and_start():
    seg = jnp.asarray([[1, 2, 3, 0], [1, 1, 2, 0], [1, 1, 1, 1]])
    seqlen, offsets = layers.packed_layout(seg, 3)
    # jax's cuDNN docstring example: segments of size 1 -> offsets [0, 1, 2, -1]; absent segments -1.
    np.testing.assert_array_equal(seqlen, [[1, 1, 1], [2, 1, -1], [4, -1, -1]])
    np.testing.assert_array_equal(offsets, [[0, 1, 2, -1], [0, 2, -1, -1], [0, -1, -1, -1]])


def test_a_decoding_step_reads_the_cache_by_sums_with_the_numbers_of_the_dot_products(monkeypatch):
    """One query per row over a grouped cache: products and sums over the cache as it lies (from
    DECODE_REDUCE_ROWS rows on) give the outputs of the two dot products, masked keys included."""
    q, k, v, _ = _qkv(B=3, T=1, S=40, N=6, K=2, H=8)
    mask_B11S = (jnp.arange(40)[None, :] <= jnp.array([[5], [39], [0]]))[:, None, None, :]
    run = lambda: jax.jit(lambda q, k, v: layers.einsum_attention(q, k, v, mask=mask_B11S))(q, k, v)  # noqa: E731
    monkeypatch.setattr(layers, "DECODE_REDUCE_ROWS", 3)
    got = run()
    monkeypatch.setattr(layers, "DECODE_REDUCE_ROWS", 4)
    np.testing.assert_allclose(got, run(), rtol=1e-5, atol=1e-6)
