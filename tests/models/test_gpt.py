"""GPT: published parameter counts, causality, cached decoding, scan/remat equivalence."""

import dataclasses

import flax.linen as nn
import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.models.gpt import GPT_TINY, PRESETS, Gpt

# Published counts (Hugging Face GPT2LMHeadModel, tied head counted once).
COUNTS = {"gpt2_small": 124_439_808, "gpt2_medium": 354_823_168, "gpt2_large": 774_030_080,
          "gpt2_xl": 1_557_611_200, "gpt_tiny": 875_264}


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
    return dataclasses.replace(GPT_TINY, num_layers=2, d_model=64, d_ff=128, max_len=32, **kw)


def test_causality():
    model = Gpt(_tiny())
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 384)
    params = model.init(jax.random.PRNGKey(0), ids)["params"]
    base = model.apply({"params": params}, ids)
    for t in (0, 7, 15):
        changed = ids.at[:, t].set((ids[:, t] + 1) % 384)
        out = model.apply({"params": params}, changed)
        np.testing.assert_array_equal(out[:, :t], base[:, :t])  # earlier positions: bit-identical
        assert not np.allclose(out[:, t], base[:, t])  # the changed position itself does change


def test_cached_decoding_equals_full_forward():
    model = Gpt(_tiny())
    ids = jax.random.randint(jax.random.PRNGKey(2), (2, 12), 0, 384)
    params = model.init(jax.random.PRNGKey(0), ids)["params"]
    full = model.apply({"params": params}, ids)
    cache = nn.unbox(model.init(jax.random.PRNGKey(0), jnp.zeros((2, 12), jnp.int32), decode=True)["cache"])
    cache = jax.tree.map(jnp.zeros_like, cache)
    prefill, upd = model.apply({"params": params, "cache": cache}, ids[:, :5], decode=True, mutable=["cache"])
    steps = [prefill]
    cache = upd["cache"]
    for t in range(5, 12):
        out, upd = model.apply({"params": params, "cache": cache}, ids[:, t:t + 1], decode=True, mutable=["cache"])
        cache = upd["cache"]
        steps.append(out)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=2e-5, rtol=1e-5)


def _stack(params, L):
    """Loop params h_0..h_{L-1} -> scanned params h[L, ...]."""
    layers = [params.pop(f"h_{i}") for i in range(L)]
    params["h"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    return params


@pytest.mark.parametrize("remat,policy", [(False, "full"), (True, "full"), (True, "dots"), (True, "dots_no_batch")])
def test_scan_and_remat_match_the_loop(remat, policy):
    ids = jax.random.randint(jax.random.PRNGKey(3), (2, 16), 0, 384)
    loop = Gpt(_tiny())
    params = nn.unbox(loop.init(jax.random.PRNGKey(0), ids)["params"])
    scanned = Gpt(_tiny(scan_layers=True, remat=remat, remat_policy=policy))
    sparams = _stack(dict(params), 2)
    np.testing.assert_allclose(scanned.apply({"params": sparams}, ids), loop.apply({"params": params}, ids),
                               atol=1e-5, rtol=1e-5)
    g_loop = jax.grad(lambda p: loop.apply({"params": p}, ids).sum())(params)
    g_scan = jax.grad(lambda p: scanned.apply({"params": p}, ids).sum())(sparams)
    np.testing.assert_allclose(g_scan["h"]["mlp"]["fc"]["kernel"][1], g_loop["h_1"]["mlp"]["fc"]["kernel"],
                               atol=1e-4, rtol=1e-4)


def test_bfloat16_compute_keeps_float32_params_and_logits():
    model = Gpt(_tiny(dtype="bfloat16"))
    ids = jnp.zeros((1, 8), jnp.int32)
    v = model.init(jax.random.PRNGKey(0), ids)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(v["params"]))
    assert model.apply(v, ids).dtype == jnp.float32


def test_remat_policies_save_what_they_name(capsys):
    """full saves the least for the backward pass, dots the most; dots_no_batch recomputes attention scores."""
    ids = jax.random.randint(jax.random.PRNGKey(3), (2, 16), 0, 384)

    def saved(**kw):
        model = Gpt(_tiny(**kw))
        params = nn.unbox(model.init(jax.random.PRNGKey(0), ids)["params"])
        jax.ad_checkpoint.print_saved_residuals(lambda p: model.apply({"params": p}, ids).sum(), params)
        return capsys.readouterr().out.count("\n")

    full, no_batch, dots = (saved(remat=True, remat_policy=p) for p in ("full", "dots_no_batch", "dots"))
    assert full < no_batch < dots <= saved(remat=False)
