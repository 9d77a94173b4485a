"""GPT-NeoX / Pythia from and to Hugging Face, beside the parity of their rows in tests/hf/parity_table.py (pythia,
neox_sequential_half: rope on a quarter or half of each head, parallel residual on and off, exact and tanh GELU,
biases on and off, tied and untied heads; logits, KV-cached greedy continuations, export and back in
tests/hf/test_parity_decoders.py): the per-head fused query_key_value, the partial rotary and the parallel
residual each move the logits when done otherwise; Pythia-160M's config.json converts to the pythia_160m preset,
whose parameter count is transformers'; variants zoo cannot hold are refused in one line; such a GPT trains,
scanned as looped.
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
from zoo.errors import ConversionError  # noqa: E402
from zoo.hf import gpt_neox, io, table  # noqa: E402
from zoo.hf.convert import export_converter  # noqa: E402
from zoo.models.gpt import PYTHIA_160M, Gpt, GptConfig  # noqa: E402

IDS = np.random.default_rng(0).integers(0, 300, (2, 12))
one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread
edited = hf_runs.edited
hf_logits = hf_runs.hf_logits


def zoo_logits(model_cfg, params, ids=IDS):
    return np.asarray(jax.jit(Gpt(model_cfg).apply)({"params": params}, jnp.asarray(ids)))  # one program, not one per op


def test_the_fused_layout_partial_rotary_and_parallel_residual_each_move_the_logits(hf_refs):
    """What the parity above rests on: reading query_key_value as q | k | v slabs of rows instead of per head,
    rotating whole heads, or chaining the residual, each changes the logits far past 1e-4."""
    src, model = hf_refs.reference("pythia")
    run = hf_refs.converted("pythia")
    model_cfg, params = run.config.model, run.params
    slab_rows = [(p, n, dataclasses.replace(t, fusion=table.ROWS) if t.fusion is table.PER_HEAD_QKV else t)
                 for p, n, t in gpt_neox.key_table(model_cfg)]
    slabs = table.from_hf(io.Keys(io.read_tensors(src), gpt_neox.PREFIXES), slab_rows, model_cfg)
    theirs = hf_logits(model, IDS)
    assert np.abs(zoo_logits(model_cfg, params) - theirs).max() <= 1e-4
    for cfg, p in [(model_cfg, slabs), (dataclasses.replace(model_cfg, rotary_fraction=1.0), params),
                   (dataclasses.replace(model_cfg, parallel_residual=False), params),
                   (dataclasses.replace(model_cfg, mlp="gelu"), params)]:
        assert np.abs(zoo_logits(cfg, p) - theirs).max() > 1e-3


# ---- export choice, presets, refusals ---------------------------------------------------------------
def neox_model(**switches) -> GptConfig:
    return GptConfig(**{**dict(vocab_size=264, max_len=64, num_layers=2, d_model=48, num_heads=3, d_ff=100,
                               dropout=0.0, positions="rope", rotary_fraction=0.25, mlp="gelu_exact",
                               parallel_residual=True, tie_embeddings=False), **switches})


@pytest.mark.parametrize("switches,arch", [
    ({}, "GPTNeoXForCausalLM"), (dict(parallel_residual=False, rotary_fraction=1.0, mlp="gelu"), "GPTNeoXForCausalLM"),
    (dict(positions="learned", parallel_residual=False, mlp="gelu", tie_embeddings=True), "GPT2LMHeadModel")])
def test_export_picks_gpt_neox_for_rope_with_layernorm(switches, arch):
    assert export_converter(neox_model(**switches)).ARCHITECTURES[0] == arch


@pytest.mark.parametrize("switches", [
    dict(positions="learned", tie_embeddings=True, mlp="gelu"),  # GPT-2 but for the parallel residual
    dict(norm="rmsnorm", mlp="swiglu", qkv_bias=False, out_bias=False, mlp_bias=False),  # Llama but for it
    dict(num_kv_heads=1), dict(mlp_bias=False), dict(sliding_window=8), dict(rope_scaling="llama3")])
def test_what_no_architecture_holds_is_refused_in_one_line(switches):
    with pytest.raises(ConversionError, match=r"this gpt model has no Hugging Face equivalent; .* or as GPT-NeoX: "
                                              r"positions=rope \(rope_scaling=none, any rotary_fraction\)") as e:
        export_converter(neox_model(**switches))
    assert "\n" not in str(e.value)


# config.json of EleutherAI/pythia-160m (as published, transformers 4.24)
PYTHIA_160M_JSON = {
    "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 12, "num_hidden_layers": 12,
    "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.24.0", "use_cache": True, "use_parallel_residual": True, "vocab_size": 50304}


def test_pythia_160m_config_converts_to_the_preset_whose_count_is_transformers():
    assert gpt_neox.config_from_hf(PYTHIA_160M_JSON, {"embed_out.weight"}) == PYTHIA_160M
    shapes = jax.eval_shape(lambda: Gpt(PYTHIA_160M).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
    ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    with torch.device("meta"):
        theirs = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**{
            k: v for k, v in PYTHIA_160M_JSON.items() if k not in ("architectures", "torch_dtype",
                                                                    "transformers_version", "model_type")}))
    assert ours == sum(p.numel() for p in theirs.parameters()) == 162_322_944


@pytest.mark.parametrize("fields,message", [
    (dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}),
     r"^GPT-NeoX rope type 'linear' is not supported; supported: default$"),
    (dict(rope_scaling={"type": "dynamic", "factor": 2.0}), r"^GPT-NeoX rope type 'dynamic' is not supported"),
    (dict(hidden_act="relu"),
     r"^GPT-NeoX hidden_act='relu' is not supported; supported: gelu, gelu_new, gelu_pytorch_tanh$"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.2}),
     r"^GPT-NeoX partial rotary 0.2 rotates 3 of each head's 16 dims; supported: an even, nonzero number "
     r"\(fraction in \(0, 1\]\)$"),
    (dict(rope_parameters=None, rotary_pct=0.05), r"^GPT-NeoX partial rotary 0.05 rotates 0 of each head's 16 dims")])
def test_what_zoo_cannot_hold_is_refused_in_one_line(hf_refs, tmp_path, fields, message):
    with pytest.raises(ConversionError, match=message) as e:
        hf.from_hf(edited(hf_refs.directory("pythia"), tmp_path / "bad", **fields), str(tmp_path / "run"), verbose=False)
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "run")


def test_a_tiny_neox_trains_and_its_loss_falls(cache_dir, tmp_path):
    cfg = tiny_configs.gpt_lm(cache_dir)
    cfg = dataclasses.replace(cfg, model=neox_model(vocab_size=384, dropout=0.1),
                              train=dataclasses.replace(cfg.train, steps=8, save_every=8))
    run(cfg, tmp_path / "run")
    got = losses(tmp_path / "run")
    assert all(np.isfinite(v) for v in got.values())
    print("losses", got)
    assert got[8] < got[1] - 0.2, got


def test_a_neox_scans_and_remats_as_its_loop():
    """Parallel residual and partial rotary under nn.scan + remat: the loop's logits."""
    ids = jax.random.randint(jax.random.PRNGKey(3), (2, 16), 0, 264)
    loop = Gpt(neox_model())
    params = nn.unbox(jax.jit(loop.init)(jax.random.PRNGKey(0), ids)["params"])
    scanned = Gpt(neox_model(scan_layers=True, remat=True))
    layers = [params[f"h_{i}"] for i in range(2)]
    sparams = {**{k: v for k, v in params.items() if not k.startswith("h_")},
               "h": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}
    np.testing.assert_allclose(jax.jit(scanned.apply)({"params": sparams}, ids), jax.jit(loop.apply)({"params": params}, ids),
                               atol=1e-5, rtol=1e-5)
