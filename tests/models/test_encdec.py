"""Encoder-decoder: published parameter counts, decoder causality, encoder padding invariance,
cached decoding equal to the full forward, and what each variant switch puts in the params."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.infer import decoding
from zoo.models.encdec import PRESETS, EncDec, EncDecConfig

# Hugging Face num_parameters() for t5-small and bart-base (tied embeddings once; bart's
# final_logits_bias is a buffer). transformer_base: Vaswani base with a 37,000 shared vocabulary.
COUNTS = {"t5_small": 60_506_624, "bart_base": 139_420_416, "transformer_base": 63_082_496,
          "encdec_tiny": 1_422_848}

SMALL = dict(vocab_size=100, max_len=32, num_encoder_layers=2, num_decoder_layers=2, d_model=32, num_heads=4,
             d_ff=64, dropout=0.0)
# One small config per lineage: every switch is exercised by at least one of them.
VARIANTS = {
    "vaswani": EncDecConfig(**SMALL, positions="sinusoidal", embed_scale=True),
    "t5": EncDecConfig(**SMALL, positions="relative", relative_buckets=8, relative_max_distance=16, norm="rmsnorm",
                       pre_ln=True, use_bias=False, attention_scale=False, output_scale=True, d_kv=4),
    "bart": EncDecConfig(**SMALL, positions="learned", position_offset=2, embed_norm=True, activation="gelu",
                         share_embeddings=False, tie_output=False, logits_bias=True),
    "gated_scan": EncDecConfig(**SMALL, positions="relative", relative_buckets=8, pre_ln=True, activation="gated_gelu",
                               scan_layers=True),
}


def n_params(cfg):
    ids = jnp.zeros((1, 8), jnp.int32)
    shapes = jax.eval_shape(lambda: EncDec(cfg).init(jax.random.PRNGKey(0), ids, jnp.ones((1, 8), bool), ids))
    return sum(x.size for x in jax.tree.leaves(shapes["params"]))


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_parameter_counts(name):
    assert n_params(PRESETS[name]) == COUNTS[name]


def test_scan_keeps_the_count():
    assert n_params(dataclasses.replace(PRESETS["t5_small"], scan_layers=True)) == COUNTS["t5_small"]


def _setup(cfg, B=2, S=10, T=12, seed=0):
    model = EncDec(cfg)
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed + 1))
    src = jax.random.randint(k1, (B, S), 0, cfg.vocab_size)
    valid = jnp.arange(S)[None] < jnp.array([[S], [S - 4]])
    tgt = jax.random.randint(k2, (B, T), 0, cfg.vocab_size)
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(seed), src, valid, tgt)["params"])
    return model, params, src, valid, tgt


def _apply(model):
    """model.apply jitted: one compile, not one per op."""
    return jax.jit(model.apply, static_argnames="method")


def test_variant_switches_shape_the_params():
    keys = {name: {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(_setup(cfg)[1])[0]}
            for name, cfg in VARIANTS.items()}
    assert not any("bias']" in k and "relative" not in k for k in keys["t5"])  # no projection biases
    assert any("relative_bias" in k for k in keys["t5"]) and not any("position" in k for k in keys["t5"])
    assert any("['encoder']['position']" in k for k in keys["bart"]) and any("ln_embed" in k for k in keys["bart"])
    assert any("target_embed" in k for k in keys["bart"]) and any("lm_head" in k for k in keys["bart"])
    assert not any("target_embed" in k or "lm_head" in k for k in keys["vaswani"])
    assert any("['mlp']['gate']" in k for k in keys["gated_scan"])
    assert any("ln_final" in k for k in keys["t5"]) and not any("ln_final" in k for k in keys["vaswani"])
    assert "['logits_bias']" in keys["bart"] and not any("logits_bias" in k for k in keys["t5"])


def test_logits_bias_is_added_to_every_position():
    model, params, src, valid, tgt = _setup(VARIANTS["bart"])
    apply = _apply(model)
    base = apply({"params": params}, src, valid, tgt)
    bias_V = jnp.arange(100, dtype=jnp.float32) / 10
    out = apply({"params": {**params, "logits_bias": bias_V}}, src, valid, tgt)
    np.testing.assert_allclose(out - base, jnp.broadcast_to(bias_V, base.shape), atol=1e-5)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_decoder_is_causal(name):
    model, params, src, valid, tgt = _setup(VARIANTS[name])
    apply = _apply(model)
    base = apply({"params": params}, src, valid, tgt)
    for t in (0, 6, 11):
        changed = tgt.at[:, t].set((tgt[:, t] + 1) % 100)
        out = apply({"params": params}, src, valid, changed)
        np.testing.assert_array_equal(out[:, :t], base[:, :t])  # earlier positions: bit-identical
        assert not np.allclose(out[:, t], base[:, t])  # the changed position itself does change


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_encoder_ignores_padding(name):
    model, params, src, valid, tgt = _setup(VARIANTS[name])
    apply = _apply(model)
    base = apply({"params": params}, src, valid, tgt)
    # Other ids in the padded source slots, and four more padded slots: row 1 (6 real tokens) keeps its output.
    src2 = jnp.concatenate([jnp.where(valid, src, 7), jnp.full((2, 4), 9)], axis=1)
    valid2 = jnp.concatenate([valid, jnp.zeros((2, 4), bool)], axis=1)
    out = apply({"params": params}, src2, valid2, tgt)
    np.testing.assert_allclose(out, base, atol=2e-5, rtol=1e-5)
    # ... while a real source token does matter.
    out3 = apply({"params": params}, src.at[1, 0].set((src[1, 0] + 1) % 100), valid, tgt)
    assert not np.allclose(out3[1], base[1], atol=1e-4)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_cached_decoding_equals_full_forward(name):
    model, params, src, valid, tgt = _setup(VARIANTS[name])
    apply = _apply(model)
    full = apply({"params": params}, src, valid, tgt)
    enc = apply({"params": params}, src, valid, method="encode")
    decode_call = jax.jit(functools.partial(decoding._decode_call, model))  # the cache's creation, then each step
    cache, _ = decode_call(params, None, jnp.zeros_like(tgt), enc, valid)
    steps = []
    for t in range(tgt.shape[1]):
        # The encoder output passed after the cache exists is unused: cross-attention K/V come from the cache.
        cache, logits_BV = decode_call(params, cache, tgt[:, t:t + 1], jnp.zeros_like(enc), valid)
        steps.append(logits_BV)
    np.testing.assert_allclose(jnp.stack(steps, 1), full, atol=2e-5, rtol=1e-5)
    assert any("cross_key" in jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(cache)[0])


def test_bfloat16_compute_keeps_float32_params_and_logits():
    cfg = dataclasses.replace(VARIANTS["t5"], dtype="bfloat16")
    model, params, src, valid, tgt = _setup(cfg)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    assert _apply(model)({"params": params}, src, valid, tgt).dtype == jnp.float32
