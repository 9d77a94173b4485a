"""The GPT-2 speedrun's switches (KellerJordan/modded-nanogpt) as GPT options: the relu2 MLP, zero-initialised
residual projections, U-net skips and value embeddings each do what they say, and with every switch off the
model is the one zoo built before they existed (parameters and logits fingerprinted at that commit)."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.errors import ConfigError
from zoo.models.gpt import GPT_TINY, MLP_ACTIVATIONS, Gpt, GptConfig
from zoo.nn import layers
from zoo.nn.attention import Attention
from zoo.nn.stack import stack_blocks

IDS = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 384)


def _tiny(**kw):
    return dataclasses.replace(GPT_TINY, **{"num_layers": 2, "d_model": 64, "d_ff": 128, "max_len": 32, **kw})


def _init(cfg, ids=IDS):
    model = Gpt(cfg)
    return model, nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), ids)["params"])


def _flat(params) -> dict:
    return {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(params)}


# zoo at b8648ef, before these switches, under tests/conftest.py's XLA flags: (parameter arrays, float64 sum of
# every parameter, float64 sum of the logits of IDS, logits[1, -1, :3]). The GPT-2 block looped, and a scanned one
# with qk_norm and final_softcap.
BEFORE = {
    "gpt2": ({}, 36, 318.4767742458203, 25.526437463397997,
             [0.003246946958824992, -0.032593972980976105, -0.12290040403604507]),
    "scanned": (dict(scan_layers=True, qk_norm=True, final_softcap=15.0), 22, 381.3729279943081, 28.74390795427098,
                [0.18987028300762177, -0.028986820951104164, -0.08631345629692078]),
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_every_switch_off_changes_nothing(name):
    """Equal to the bit here; the tolerances leave room for XLA:CPU rounding differently at another optimisation
    level or on another CPU (level 2 moves the parameter sum by 4e-11, the logits by 3e-7, relative), far below
    what a changed initialisation or block moves."""
    kw, n_arrays, param_sum, logit_sum, logits_3 = BEFORE[name]
    model, params = _init(_tiny(**kw))
    flat = _flat(params)
    assert len(flat) == n_arrays and not any("skip" in k for k in flat)
    assert sum(float(np.sum(np.asarray(v, np.float64))) for v in flat.values()) == pytest.approx(param_sum, rel=1e-9)
    logits = np.asarray(jax.jit(model.apply)({"params": params}, IDS), np.float64)
    assert float(logits.sum()) == pytest.approx(logit_sum, rel=1e-5)
    # atol: a logit near zero (0.0032 in gpt2's row) moves by float32 rounding of its neighbours' size (3e-8 on
    # another CPU), which rtol alone calls a 1e-5 change
    np.testing.assert_allclose(logits[1, -1, :3], logits_3, rtol=1e-5, atol=1e-6)


def test_relu2_squares_the_positive_part():
    np.testing.assert_array_equal(layers.relu_squared(jnp.array([-2.0, -0.0, 0.5, 3.0])), [0.0, 0.0, 0.25, 9.0])
    assert MLP_ACTIVATIONS["relu2"] is layers.relu_squared


def test_relu2_is_a_two_matrix_mlp_with_its_own_activation():
    gelu, params = _init(_tiny(num_layers=1))
    relu2 = Gpt(_tiny(num_layers=1, mlp="relu2"))
    _, params2 = _init(_tiny(num_layers=1, mlp="relu2"))
    assert set(params2["h_0"]["mlp"]) == {"fc", "proj"}  # not gated: fc and proj, as GPT-2's
    assert jax.tree.map(jnp.shape, params2) == jax.tree.map(jnp.shape, params)
    mlp = params["h_0"]["mlp"]
    x_BTD = jax.random.normal(jax.random.PRNGKey(2), (1, 4, 64))
    want = (jnp.maximum(x_BTD @ mlp["fc"]["kernel"] + mlp["fc"]["bias"], 0) ** 2 @ mlp["proj"]["kernel"]
            + mlp["proj"]["bias"])
    got = layers.Mlp(128, MLP_ACTIVATIONS["relu2"]).apply({"params": mlp}, x_BTD)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # The same weights through the whole model: the activation is what changes the logits.
    assert not np.allclose(relu2.apply({"params": params}, IDS), gelu.apply({"params": params}, IDS), atol=1e-4)


def test_an_unknown_mlp_lists_relu2():
    with pytest.raises(ConfigError, match="model.mlp='reglu' is unknown; choose one of gelu, swiglu, gelu_exact, "
                                          "geglu, relu2"):
        _tiny(mlp="reglu")


def test_zero_init_proj_zeroes_the_residual_projections_and_nothing_else():
    _, off = _init(_tiny())
    _, on = _init(_tiny(zero_init_proj=True))
    zeroed = {f"['h_{i}']['{m}']['{p}']['kernel']" for i in range(2) for m, p in (("attn", "out"), ("mlp", "proj"))}
    f_off, f_on = _flat(off), _flat(on)
    assert set(f_on) == set(f_off) and zeroed <= set(f_on)
    for k in f_on:
        if k in zeroed:
            assert np.all(f_on[k] == 0) and np.std(f_off[k]) > 0.001, k
        else:  # normal(0) draws the keys normal(std) would: every other parameter as with the switch off
            np.testing.assert_array_equal(f_on[k], f_off[k], err_msg=k)


def test_zero_init_blocks_start_as_the_identity():
    """Every block adds zero at init, so no token sees another: changing token 0 changes only position 0."""
    changed = IDS.at[:, 0].set((IDS[:, 0] + 1) % 384)
    for zero_init in (True, False):
        model, params = _init(_tiny(zero_init_proj=zero_init))
        apply = jax.jit(model.apply)
        base, out = apply({"params": params}, IDS), apply({"params": params}, changed)
        assert not np.allclose(out[:, 0], base[:, 0])
        assert np.array_equal(out[:, 1:], base[:, 1:]) == zero_init


class _Affine(nn.Module):
    """x -> 2x + 1, no parameters: the stack's wiring alone decides the output."""

    @nn.compact
    def __call__(self, x, *args):
        return 2 * x + 1


class _Stack(nn.Module):
    num_layers: int

    @nn.compact
    def __call__(self, x, skip_weights):
        return stack_blocks(_Affine, self.num_layers, scan=False, remat=False, name="h")(x, skip_weights=skip_weights)


@pytest.mark.parametrize("num_layers, want", [(4, -50.0), (5, -18.0), (2, 10.0)])
def test_unet_skips_feed_block_i_to_its_mirror(num_layers, want):
    """L = 4, weights [0.5, -3]: o0 = 3, o1 = 7, block 2 reads o1 - 3 o1 = -14 (o2 = -27), block 3 reads
    o2 + 0.5 o0 = -25.5: -50. L = 5: the middle block (2) gets no skip. L = 2: block 1 reads o0 + 0.5 o0 = 4.5: 10."""
    w = jnp.array([0.5, -3.0][:num_layers // 2])
    assert float(_Stack(num_layers).apply({}, jnp.ones(()), w)) == want


def test_unet_skip_weights_start_at_one_and_zero_is_the_plain_model():
    cfg = _tiny(num_layers=4, unet_skips=True)
    model, params = _init(cfg)
    np.testing.assert_array_equal(params["skip_weights"], np.ones(2, np.float32))
    plain, plain_params = _init(_tiny(num_layers=4))
    assert set(params) == set(plain_params) | {"skip_weights"}
    params = {**plain_params, "skip_weights": jnp.zeros(2)}
    np.testing.assert_allclose(model.apply({"params": params}, IDS), plain.apply({"params": plain_params}, IDS),
                               rtol=1e-6, atol=1e-6)
    params["skip_weights"] = jnp.ones(2)
    assert not np.allclose(model.apply({"params": params}, IDS), plain.apply({"params": plain_params}, IDS),
                           atol=1e-4)


def test_value_embeds_add_tables_and_lambdas_to_the_first_and_last_layers():
    model, params = _init(_tiny(num_layers=5, value_embeds=2, num_kv_heads=2))  # 2 key/value heads of 16
    tables = {k: v["embedding"] for k, v in params.items() if k.startswith("value_embed")}
    assert {k: t.shape for k, t in tables.items()} == {"value_embed_0": (384, 32), "value_embed_1": (384, 32)}
    assert 0.9 < float(jnp.std(tables["value_embed_0"])) < 1.1  # N(0, 1), as modded-nanogpt's nn.Embedding
    with_lambdas = [i for i in range(5) if "value_lambdas" in params[f"h_{i}"]["attn"]]
    assert with_lambdas == [0, 1, 3, 4]  # the middle layer reads no table
    np.testing.assert_array_equal(params["h_3"]["attn"]["value_lambdas"], [0.5, 0.5])
    # Lambdas (1, 0) everywhere: the plain model, whatever the tables hold.
    plain, plain_params = _init(_tiny(num_layers=5, num_kv_heads=2))
    mixed = {**plain_params, **{k: {"embedding": t} for k, t in tables.items()}}
    for i in with_lambdas:
        mixed[f"h_{i}"] = {**mixed[f"h_{i}"], "attn": {**mixed[f"h_{i}"]["attn"], "value_lambdas": jnp.array([1., 0.])}}
    want = plain.apply({"params": plain_params}, IDS)
    np.testing.assert_allclose(model.apply({"params": mixed}, IDS), want, rtol=1e-6, atol=1e-6)
    assert not np.allclose(model.apply({"params": params}, IDS), want, atol=1e-4)


def test_value_lambdas_mix_the_values_linearly():
    """Attention is linear in its values: with value_lambdas (a, b), out = a out(v) + b out(value embedding),
    each read apart (lambdas (1, 0) and (0, 1)); no biases, so nothing else adds."""
    attn = Attention(2, 8, use_bias=False, out_bias=False)
    x_BTD, ve_BTKH = jax.random.normal(jax.random.PRNGKey(3), (1, 6, 16)), jax.random.normal(jax.random.PRNGKey(4),
                                                                                              (1, 6, 2, 8))
    params = nn.unbox(attn.init(jax.random.PRNGKey(0), x_BTD, is_causal=True, value_embed_BTKH=ve_BTKH)["params"])

    def out(a, b):
        p = {**params, "value_lambdas": jnp.array([a, b])}
        return attn.apply({"params": p}, x_BTD, is_causal=True, value_embed_BTKH=ve_BTKH)
    np.testing.assert_allclose(out(1.0, 0.0), attn.apply({"params": params}, x_BTD, is_causal=True), rtol=1e-6)
    np.testing.assert_allclose(out(0.3, 2.0), 0.3 * out(1.0, 0.0) + 2.0 * out(0.0, 1.0), rtol=1e-5, atol=1e-6)
    assert not np.allclose(out(0.0, 1.0), 0, atol=1e-3)


def test_unet_skips_and_value_embeds_keep_causality_and_cached_decoding():
    cfg = _tiny(num_layers=4, unet_skips=True, value_embeds=1, mlp="relu2", qk_norm=True, positions="rope")
    model, params = _init(cfg, IDS[:, :12])
    params["skip_weights"] = jnp.array([0.7, 1.3])
    apply = jax.jit(model.apply)
    full = apply({"params": params}, IDS[:, :12])
    changed = apply({"params": params}, IDS[:, :12].at[:, 6].set(0))
    np.testing.assert_array_equal(changed[:, :6], full[:, :6])
    cache = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.PRNGKey(0), jnp.zeros((2, 12), jnp.int32),
                                                       decode=True)["cache"]))
    cache = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), cache)
    decode = jax.jit(lambda p, c, x: model.apply({"params": p, "cache": c}, x, decode=True, mutable=["cache"]))
    prefill, upd = decode(params, cache, IDS[:, :8])
    last, _ = decode(params, upd["cache"], IDS[:, 8:9])
    np.testing.assert_allclose(jnp.concatenate([prefill, last], 1), full[:, :9], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("bad, fragment", [
    (dict(unet_skips=True, scan_layers=True), "model.unet_skips=true needs model.scan_layers=false"),
    (dict(unet_skips=True, num_layers=1), "model.unet_skips=true needs model.num_layers >= 2"),
    (dict(value_embeds=3), r"model.value_embeds=3 must be in 0..num_layers/2 \(the first and last E layers; "
                           r"num_layers=4\)"),
    (dict(value_embeds=-1), "model.value_embeds=-1 must be in 0..num_layers/2"),
    (dict(value_embeds=1, scan_layers=True), "model.value_embeds > 0 needs model.scan_layers=false"),
])
def test_bad_speedrun_switches_are_one_line_errors(bad, fragment):
    with pytest.raises(ConfigError, match=fragment):
        GptConfig(**{**dataclasses.asdict(GPT_TINY), **bad})


@pytest.mark.parametrize("switch", [dict(unet_skips=True), dict(value_embeds=1)])
def test_a_hugging_face_export_of_the_zoo_only_parts_is_refused_in_one_line(switch):
    """No Hugging Face architecture has U-net skips or value embeddings: an export would drop their weights."""
    from zoo.errors import ConversionError
    from zoo.hf.convert import export_converter
    cfg = _tiny(num_layers=4, positions="rope", norm="rmsnorm", mlp="swiglu", qkv_bias=False, out_bias=False,
                mlp_bias=False, tie_embeddings=False, **switch)
    assert export_converter(dataclasses.replace(cfg, unet_skips=False, value_embeds=0)).__name__ == "zoo.hf.llama"
    name = next(iter(switch))
    with pytest.raises(ConversionError, match=rf"^this gpt model has no Hugging Face equivalent: .*model\.{name} "
                                              r"\(=.*\).*; save it with format='zoo'$"):
        export_converter(cfg)
