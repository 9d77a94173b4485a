"""Gemma 1, 2 and 3 (text), from and to Hugging Face, beside the parity of their rows in tests/hf/parity_table.py
(width 42, 3 heads of width 20, a 4-token window so local and global layers differ, soft-caps that bite: logits,
KV-cached greedy continuations, export and back in tests/hf/test_parity_decoders.py): export picks the Gemma
version by its switches; what zoo cannot hold is refused in one line; a tiny Gemma trains (its loss falls)
through the soft-capped fused loss, whose gradient equals the plain logits' one; scanned layers (local flags
traced) equal looped ones; the presets have the published parameter counts.
"""

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs, tiny_configs  # noqa: E402
from tests.helpers.hf_runs import hf_refs_fixture  # noqa: F401,E402  (the session's references)
from tests.helpers.runs import losses, run  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.errors import ConfigError, ConversionError  # noqa: E402
from zoo.hf.convert import export_converter  # noqa: E402
from zoo.models.gpt import PRESETS, Gpt, GptConfig  # noqa: E402
from zoo.nn import losses as zoo_losses  # noqa: E402

IDS = np.random.default_rng(0).integers(0, 300, (2, 12))
one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread
edited = hf_runs.edited


def gemma_model(**switches) -> GptConfig:
    """A tiny Gemma 2 (Gemma 3 with qk_norm): 3 layers, width 42, 3 heads of 20, window 4, both caps."""
    return GptConfig(**{**dict(vocab_size=264, max_len=64, num_layers=3, d_model=42, num_heads=3, num_kv_heads=1,
                               d_kv=20, d_ff=56, dropout=0.0, positions="rope", norm="rmsnorm_plus1", mlp="geglu",
                               qkv_bias=False, out_bias=False, mlp_bias=False, embed_scale=True, post_norms=True,
                               query_pre_attn_scalar=18, attn_softcap=5.0, final_softcap=3.0, sliding_window=4,
                               global_every=2), **switches})


@pytest.mark.parametrize("switches,arch", [
    ({}, "Gemma2ForCausalLM"),
    (dict(qk_norm=True, global_every=6, rope_local_theta=1e4, attn_softcap=0.0), "Gemma3ForCausalLM"),
    (dict(post_norms=False, attn_softcap=0.0, final_softcap=0.0, sliding_window=0, global_every=0,
          query_pre_attn_scalar=0), "GemmaForCausalLM"),
    (dict(norm="rmsnorm", mlp="swiglu", embed_scale=False, post_norms=False, attn_softcap=0.0, final_softcap=0.0,
          global_every=0, query_pre_attn_scalar=0), "MistralForCausalLM")])
def test_export_picks_the_gemma_version_by_its_switches(switches, arch):
    assert export_converter(gemma_model(**switches)).ARCHITECTURES[0] == arch


@pytest.mark.parametrize("switches", [dict(rope_local_theta=100.0), dict(mlp_bias=True), dict(post_norms=False),
                                      dict(norm="rmsnorm", mlp="swiglu"), dict(embed_scale=False),
                                      dict(qk_norm=True), dict(rope_scaling="linear")])
def test_gemma_switches_no_architecture_holds_are_refused_in_one_line(switches):
    with pytest.raises(ConversionError, match=r"this gpt model has no Hugging Face equivalent; .* or as Gemma 2: "
                                              r"positions=rope, norm=rmsnorm_plus1, mlp=geglu, embed_scale") as e:
        export_converter(gemma_model(**switches))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name,fields,message", [
    ("gemma2", dict(layer_types=["full_attention", "sliding_attention", "sliding_attention"]),
     r"^Gemma2 layer_types .* is not supported; supported: every Nth layer full_attention, the others "
     r"sliding_attention$"),
    ("gemma3", dict(rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     r"^Gemma3 full_attention rope type 'yarn' is not supported; supported: default, linear$"),
    ("gemma2", dict(hidden_activation="gelu"), r"^Gemma2 hidden_activation='gelu' is not supported; supported: "
                                               r"gelu_pytorch_tanh"),
    ("gemma3", dict(use_bidirectional_attention=True), r"^Gemma3 use_bidirectional_attention=true is not supported"),
    ("gemma3", dict(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"]),
     r"^unsupported architecture Gemma3ForConditionalGeneration \(model_type='gemma3'\); supported: .*"
     r"Gemma3ForCausalLM")])
def test_what_zoo_cannot_hold_is_refused_in_one_line(hf_refs, tmp_path, name, fields, message):
    with pytest.raises(ConversionError, match=message) as e:
        hf.from_hf(edited(hf_refs.directory(name), tmp_path / "bad", **fields), str(tmp_path / "run"), verbose=False)
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "run")


def test_scanned_layers_equal_looped_ones_with_local_and_global_layers():
    cfg = gemma_model(qk_norm=True, rope_local_theta=100.0, num_layers=3)
    ids = jnp.asarray(IDS % 264)
    looped = nn.unbox(jax.jit(Gpt(cfg).init)(jax.random.PRNGKey(0), ids)["params"])  # jitted: one program each
    # eager: one small program per leaf shape (a jitted tree of threefry hashes compiles for seconds)
    looped = jax.tree.map(lambda x: x + 0.2 * jax.random.normal(jax.random.PRNGKey(1), x.shape), looped)
    scanned = {k: v for k, v in looped.items() if not k.startswith("h_")}
    scanned["h"] = jax.tree.map(lambda *xs: jnp.stack(xs), *[looped[f"h_{i}"] for i in range(3)])
    want = jax.jit(Gpt(cfg).apply)({"params": looped}, ids)
    got = jax.jit(Gpt(dataclasses.replace(cfg, scan_layers=True, remat=True)).apply)({"params": scanned}, ids)
    np.testing.assert_allclose(got, want, atol=1e-5)
    flat = jax.jit(Gpt(dataclasses.replace(cfg, global_every=0, sliding_window=0)).apply)({"params": looped}, ids)
    assert np.abs(np.asarray(flat) - np.asarray(want)).max() > 1e-2  # the window and local base matter here


def test_soft_capped_fused_loss_and_gradient_equal_the_plain_logits_ones():
    rng = np.random.default_rng(0)
    h, w = jnp.asarray(rng.normal(size=(2, 6, 8)), jnp.float32), jnp.asarray(rng.normal(size=(37, 8)), jnp.float32)
    t, wt = jnp.asarray(rng.integers(0, 37, (2, 6))), jnp.asarray(rng.uniform(size=(2, 6)), jnp.float32)

    def plain(h, w):
        z = 3.0 * jnp.tanh(jnp.einsum("btd,vd->btv", h, w) / 3.0)
        return -jnp.sum(wt * jnp.take_along_axis(jax.nn.log_softmax(z), t[..., None], -1)[..., 0])

    def fused(h, w):
        return zoo_losses.linear_cross_entropy(h, w, t, wt, chunks=2, vocab_multiple=16, logit_cap=3.0)[0]
    for a, b in zip(jax.jit(jax.value_and_grad(fused, (0, 1)))(h, w), jax.jit(jax.value_and_grad(plain, (0, 1)))(h, w)):
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_a_tiny_gemma_trains_and_its_loss_falls(cache_dir, tmp_path):
    cfg = tiny_configs.gpt_lm(cache_dir)
    cfg = dataclasses.replace(cfg, model=gemma_model(vocab_size=384, qk_norm=True, rope_local_theta=100.0),
                              optim=dataclasses.replace(cfg.optim, lr=3e-3, warmup=0),
                              train=dataclasses.replace(cfg.train, steps=8, save_every=8))
    run(cfg, tmp_path / "run")
    got = losses(tmp_path / "run")
    assert all(np.isfinite(v) for v in got.values())
    assert got[max(got)] < got[min(got)] - 0.3, got


def test_gemma_fields_are_checked_where_they_are_set():
    with pytest.raises(ConfigError, match=r"model.global_every=2 needs model.sliding_window > 0"):
        gemma_model(sliding_window=0)
    with pytest.raises(ConfigError, match=r"model.attn_softcap=5.0 cannot run on model.attention_impl=cudnn"):
        gemma_model(attention_impl="cudnn")
    with pytest.raises(ConfigError, match=r"model.norm='rmsnorm_1' is unknown; choose one of .*rmsnorm_plus1"):
        gemma_model(norm="rmsnorm_1")
    assert gemma_model().layer_local == (True, False, True)
    assert gemma_model(global_every=6, num_layers=7).layer_local == (True,) * 5 + (False, True)


# Published counts (Hugging Face's models, the tied head counted once), checked against transformers' own
# count of the config.json values on the meta device.
COUNTS = {"gemma2_2b": (2_614_341_888, "Gemma2ForCausalLM"), "gemma3_1b": (999_885_952, "Gemma3ForCausalLM")}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_presets_have_the_published_parameter_counts_and_export_as_their_architecture(name):
    cfg = PRESETS[name]
    shapes = jax.eval_shape(lambda: Gpt(cfg).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
    assert sum(x.size for x in jax.tree.leaves(shapes["params"])) == COUNTS[name][0]
    assert export_converter(cfg).ARCHITECTURES[0] == COUNTS[name][1]
