"""GPT and the modern decoders (Llama, Qwen2, Qwen3, Mistral switches): published parameter counts, causality,
cached decoding, rotary positions, the sliding window, scan/remat equivalence."""

import dataclasses

import flax.linen as nn
import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.errors import ConfigError
from zoo.models.gpt import GPT_TINY, LLAMA_TINY, PRESETS, Gpt, GptConfig
from zoo.nn.positions import Rope

# Published counts (Hugging Face's models, a tied head counted once): GPT2LMHeadModel; SmolLM2-135M,
# Llama-3.2-1B, Qwen2-0.5B, Qwen3-0.6B and Mistral-7B-v0.1 as their model cards and num_parameters() give them.
COUNTS = {"gpt2_small": 124_439_808, "gpt2_medium": 354_823_168, "gpt2_large": 774_030_080,
          "gpt2_xl": 1_557_611_200, "gpt_tiny": 875_264, "smollm2_135m": 134_515_008,
          "llama3_1b": 1_235_814_400, "qwen2_0_5b": 494_032_768, "qwen3_0_6b": 596_049_920,
          "mistral_7b": 7_241_732_096, "phi3_mini": 3_821_079_552, "pythia_160m": 162_322_944,
          "gemma2_2b": 2_614_341_888, "gemma3_1b": 999_885_952, "mixtral_8x7b": 46_702_792_704,
          "qwen3_30b_a3b": 30_532_122_624}


def n_params(cfg):
    shapes = jax.eval_shape(lambda: Gpt(cfg).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
    return sum(x.size for x in jax.tree.leaves(shapes["params"]))


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_parameter_counts(name):
    assert n_params(PRESETS[name]) == COUNTS[name]


@pytest.mark.parametrize("name", ["gpt2_small"])
def test_scan_keeps_the_count(name):
    assert n_params(dataclasses.replace(PRESETS[name], scan_layers=True)) == COUNTS[name]


def _tiny(**kw):
    return dataclasses.replace(GPT_TINY, **{"num_layers": 2, "d_model": 64, "d_ff": 128, "max_len": 32, **kw})


# Each decoder variant zoo builds: GPT-2; Llama (rope, RMSNorm, SwiGLU, GQA, untied); Qwen2's q/k/v
# biases with multi-query attention; Mistral's sliding window; Llama 3's scaled rope; Qwen3's q/k norms and
# a head width of its own (4 heads of 24 over d_model 64).
VARIANTS = {
    "gpt2": {},
    "llama": dict(positions="rope", norm="rmsnorm", mlp="swiglu", num_kv_heads=2, qkv_bias=False, out_bias=False,
                  mlp_bias=False, tie_embeddings=False, dropout=0.0),
    "qwen2": dict(positions="rope", norm="rmsnorm", mlp="swiglu", num_kv_heads=1, out_bias=False, mlp_bias=False,
                  rope_theta=1e6),
    "mistral": dict(positions="rope", norm="rmsnorm", mlp="swiglu", num_kv_heads=2, qkv_bias=False, out_bias=False,
                    mlp_bias=False, sliding_window=4),
    "llama3": dict(positions="rope", norm="rmsnorm", mlp="swiglu", num_kv_heads=2, rope_scaling="llama3",
                   rope_factor=32.0, rope_original_max_len=16),
    "qwen3": dict(positions="rope", norm="rmsnorm", mlp="swiglu", num_kv_heads=2, d_kv=24, qk_norm=True,
                  qkv_bias=False, out_bias=False, mlp_bias=False),
    "neox": dict(positions="rope", rotary_fraction=0.25, mlp="gelu_exact", parallel_residual=True,
                 tie_embeddings=False, dropout=0.0),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_causality(variant):
    model = Gpt(_tiny(**VARIANTS[variant]))
    apply = jax.jit(model.apply)  # one compile, not one per op
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 384)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), ids)["params"]
    base = apply({"params": params}, ids)
    for t in (0, 7, 15):
        changed = ids.at[:, t].set((ids[:, t] + 1) % 384)
        out = apply({"params": params}, changed)
        np.testing.assert_array_equal(out[:, :t], base[:, :t])  # earlier positions: bit-identical
        assert not np.allclose(out[:, t], base[:, t])  # the changed position itself does change


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cached_decoding_equals_full_forward(variant):
    model = Gpt(_tiny(**VARIANTS[variant]))
    ids = jax.random.randint(jax.random.PRNGKey(2), (2, 12), 0, 384)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), ids)["params"]
    full = jax.jit(model.apply)({"params": params}, ids)
    cache = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.PRNGKey(0), jnp.zeros((2, 12), jnp.int32),
                                                       decode=True)["cache"]))
    cache = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), cache)
    # One compile for the prefill, one for every single-token step (not one per op).
    decode = jax.jit(lambda p, c, x: model.apply({"params": p, "cache": c}, x, decode=True, mutable=["cache"]))
    prefill, upd = decode(params, cache, ids[:, :5])
    steps = [prefill]
    cache = upd["cache"]
    for t in range(5, 12):
        out, upd = decode(params, cache, ids[:, t:t + 1])
        cache = upd["cache"]
        steps.append(out)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=2e-5, rtol=1e-5)


def test_llama_parameters_are_what_the_switches_say():
    shapes = jax.eval_shape(lambda: Gpt(LLAMA_TINY).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
    p = nn.unbox(shapes["params"])
    assert "wpe" not in p and p["lm_head"]["embedding"].shape == (384, 128)  # rope: no table; untied head
    attn = p["h_0"]["attn"]
    assert attn["query"]["kernel"].shape == (128, 4, 32) and attn["key"]["kernel"].shape == (128, 2, 32)
    assert set(attn["query"]) == {"kernel"} and set(p["h_0"]["ln_1"]) == {"scale"}  # no biases; RMSNorm
    assert set(p["h_0"]["mlp"]) == {"gate", "fc", "proj"}


def test_rope_depends_only_on_the_offset():
    rope = Rope(8, theta=100.0)
    q, k = jax.random.normal(jax.random.PRNGKey(0), (2, 1, 1, 1, 8))
    score = lambda i, j: float(jnp.sum(rope(q, jnp.array([i])) * rope(k, jnp.array([j]))))  # noqa: E731
    assert score(5, 2) == pytest.approx(score(13, 10), rel=1e-5) == pytest.approx(score(3, 0), rel=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-3)
    np.testing.assert_allclose(rope(q, jnp.array([0])), q)  # position 0: no rotation


def test_llama3_scaling_keeps_high_frequencies_and_divides_low_ones():
    plain, scaled = Rope(64, 500000.0), Rope(64, 500000.0, "llama3", factor=32.0, original_max_len=8192)
    a, b = plain.inv_freq(), scaled.inv_freq()
    assert a[0] == b[0]  # wavelength 2 pi, far below 8192 / 4: unchanged
    assert b[-1] == pytest.approx(a[-1] / 32)  # wavelength beyond 8192: divided by the factor
    assert np.all(b <= a)


def test_the_sliding_window_hides_older_tokens():
    model = Gpt(_tiny(**VARIANTS["mistral"], num_layers=1))  # one layer: a window of 4 sees 4 tokens back
    apply = jax.jit(model.apply)
    ids = jax.random.randint(jax.random.PRNGKey(1), (1, 16), 0, 384)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), ids)["params"]
    base = apply({"params": params}, ids)
    changed = apply({"params": params}, ids.at[:, 2].set((ids[:, 2] + 1) % 384))
    np.testing.assert_array_equal(changed[:, 6:], base[:, 6:])  # position 6 sees 3..6: token 2 is gone
    assert not np.allclose(changed[:, 5], base[:, 5])


@pytest.mark.parametrize("bad, fragment", [
    (dict(positions="alibi"), "model.positions='alibi' is unknown; choose one of learned, rope"),
    (dict(num_kv_heads=3), "model.num_kv_heads=3 must divide model.num_heads=4"),
    (dict(mlp="reglu"), "model.mlp='reglu' is unknown; choose one of gelu, swiglu"),
    (dict(norm="batchnorm"), "model.norm='batchnorm' is unknown"),
    (dict(sliding_window=-1), "model.sliding_window=-1 must be >= 0"),
    (dict(positions="rope", d_model=60, num_heads=4), "needs an even head dimension"),
])
def test_bad_switches_are_one_line_errors(bad, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        GptConfig(**{**dataclasses.asdict(GPT_TINY), **bad})


def _stack(params, L):
    """Loop params h_0..h_{L-1} -> scanned params h[L, ...]."""
    layers = [params.pop(f"h_{i}") for i in range(L)]
    params["h"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    return params


@pytest.mark.parametrize("remat,policy", [(False, "full"), (True, "full"), (True, "dots"), (True, "dots_no_batch")])
def test_scan_and_remat_match_the_loop(remat, policy):
    ids = jax.random.randint(jax.random.PRNGKey(3), (2, 16), 0, 384)
    loop = Gpt(_tiny())
    params = nn.unbox(jax.jit(loop.init)(jax.random.PRNGKey(0), ids)["params"])
    scanned = Gpt(_tiny(scan_layers=True, remat=remat, remat_policy=policy))
    sparams = _stack(dict(params), 2)
    # Both sides jitted: one compile each, not one per op.
    np.testing.assert_allclose(jax.jit(scanned.apply)({"params": sparams}, ids),
                               jax.jit(loop.apply)({"params": params}, ids), atol=1e-5, rtol=1e-5)
    g_loop = jax.jit(jax.grad(lambda p: loop.apply({"params": p}, ids).sum()))(params)
    g_scan = jax.jit(jax.grad(lambda p: scanned.apply({"params": p}, ids).sum()))(sparams)
    np.testing.assert_allclose(g_scan["h"]["mlp"]["fc"]["kernel"][1], g_loop["h_1"]["mlp"]["fc"]["kernel"],
                               atol=1e-4, rtol=1e-4)


def test_bfloat16_compute_keeps_float32_params_and_logits():
    model = Gpt(_tiny(dtype="bfloat16"))
    ids = jnp.zeros((1, 8), jnp.int32)
    v = jax.jit(model.init)(jax.random.PRNGKey(0), ids)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(v["params"]))
    assert jax.jit(model.apply)(v, ids).dtype == jnp.float32


def test_remat_policies_save_what_they_name(capsys):
    """full saves the least for the backward pass, dots the most; dots_no_batch recomputes attention scores."""
    ids = jax.random.randint(jax.random.PRNGKey(3), (2, 16), 0, 384)

    def saved(**kw):
        model = Gpt(_tiny(**kw))
        params = nn.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), ids)["params"])  # shapes suffice
        jax.ad_checkpoint.print_saved_residuals(lambda p: model.apply({"params": p}, ids).sum(), params)
        return capsys.readouterr().out.count("\n")

    full, no_batch, dots = (saved(remat=True, remat_policy=p) for p in ("full", "dots_no_batch", "dots"))
    assert full < no_batch < dots <= saved(remat=False)
