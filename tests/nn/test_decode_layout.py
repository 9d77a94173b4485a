"""zoo.nn.decode_layout: a decoder's kernels stored [out, in] for decoding on a CPU, a self-attention's query, key
and value as one weight, give the logits of the plain params (float rounding), looped and scanned; adapted kernels
are left alone (and their siblings apart); off the CPU the params come back as they are."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.infer.sample import scanned, unscanned
from zoo.models import PRESETS
from zoo.models.gpt import Gpt
from zoo.nn import decode_layout, layers


def names(params) -> set:
    return {jax.tree_util.keystr(p).split("'")[-2] for p, _ in jax.tree_util.tree_leaves_with_path(params)}


@pytest.mark.parametrize("preset,scan", [("gpt_tiny", False), ("llama_tiny", True)])  # biases and tied; GQA, SwiGLU
def test_transposed_kernels_give_the_same_logits_looped_and_scanned(preset, scan):
    model = Gpt(PRESETS[preset])
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
    params = nn.unbox(params)
    rng = np.random.default_rng(0)  # biases start at 0: random ones, so that a bias dropped or misplaced shows
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.asarray(rng.normal(0, 0.5, x.shape), x.dtype) if "bias" in jax.tree_util.keystr(p) else x,
        params)
    model, params = (scanned if scan else unscanned)(model, params)
    moved = decode_layout.transposed(model, params, platform="cpu")
    apart = decode_layout.transposed(model, params, platform="cpu", fuse=False)
    assert "kernel_t" in names(moved) and "kernel" not in names(moved)  # every projection, attention and MLP
    assert "kernel" in names(params)  # a copy: the plain params stay as they were
    # query, key and value one weight (with their biases, GPT-2's); or apart if asked
    attn = (moved["h"] if scan else moved["h_0"])["attn"]
    assert set(attn) == {"qkv_t", "out"} | ({"qkv_bias"} if preset == "gpt_tiny" else set())
    cfg = PRESETS[preset]
    K = cfg.num_kv_heads or cfg.num_heads
    assert attn["qkv_t"].shape[-2:] == ((cfg.num_heads + 2 * K) * cfg.d_model // cfg.num_heads, cfg.d_model)
    assert not {"query", "key", "value"} & names_of_modules(moved)
    assert {"query", "key", "value"} <= names_of_modules(apart) and "qkv_t" not in names(apart)
    for rows in (1, 8, 80):  # one row; a decoding batch ([out, rows] product); a prompt (the plain product)
        ids = jnp.asarray(np.random.default_rng(rows).integers(0, 200, (rows, 1 if rows < 80 else 3)), jnp.int32)
        want = model.apply({"params": params}, ids)
        for other in (moved, apart):
            got = model.apply({"params": other}, ids)
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)


def names_of_modules(params) -> set:
    return {str(getattr(k, "key", k)) for p, _ in jax.tree_util.tree_leaves_with_path(params) for k in p}


def test_adapted_kernels_and_other_backends_are_left_as_they_are():
    model = Gpt(PRESETS["gpt_tiny"])
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
    params = nn.unbox(params)
    query = params["h_0"]["attn"]["query"]
    query["lora_a"] = jnp.zeros((query["kernel"].shape[0], 2))  # an adapter beside the kernel: LoRA reads both
    moved = decode_layout.transposed(model, params, platform="cpu")
    assert set(moved["h_0"]["attn"]["query"]) == {"kernel", "lora_a"} | ({"bias"} & set(query))
    assert "kernel_t" in moved["h_0"]["attn"]["key"]  # transposed, but not fused with an adapted query
    assert "qkv_t" not in moved["h_0"]["attn"] and "qkv_t" in moved["h_1"]["attn"]
    assert decode_layout.transposed(model, params, platform="gpu") is params  # their matrix units take either
    assert decode_layout.transposed(model, params, platform="tpu") is params


def test_dense_t_equals_dense_for_every_simple_einsum():
    rng = np.random.default_rng(0)
    for eqn, x_shape, w_shape in (("BTD,DF->BTF", (2, 4, 6), (6, 10)), ("BTD,DNH->BTNH", (3, 1, 6), (6, 2, 5)),
                                  ("BTNH,NHD->BTD", (40, 2, 2, 5), (2, 5, 6))):
        x, w = jnp.asarray(rng.normal(size=x_shape), jnp.float32), jnp.asarray(rng.normal(size=w_shape), jnp.float32)
        n_in = sum(c in eqn.split(",")[0] and c not in eqn.split("->")[1] for c in eqn.split(",")[1].split("->")[0])
        w_t = w.reshape(int(np.prod(w_shape[:n_in])), -1).T
        np.testing.assert_allclose(layers.dense_t(eqn, x, w_t, w_shape), jnp.einsum(eqn, x, w), atol=1e-5)


def test_the_environment_may_keep_the_kernels_plain_and_a_wrong_value_is_named(monkeypatch):
    from zoo.errors import ConfigError
    model = Gpt(PRESETS["gpt_tiny"])
    params = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"])
    monkeypatch.setenv("ZOO_KERNEL_LAYOUT", "plain")
    assert decode_layout.transposed(model, params, platform="cpu") is params
    monkeypatch.setenv("ZOO_KERNEL_LAYOUT", "columns")
    with pytest.raises(ConfigError, match="ZOO_KERNEL_LAYOUT='columns' is unknown; choose one of out_in, plain"):
        decode_layout.transposed(model, params, platform="cpu")
