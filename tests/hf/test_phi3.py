"""Phi-3 from and to Hugging Face, beside the parity of its rows in tests/hf/parity_table.py (phi3_window_gqa,
phi3_partial_tied: the fused qkv_proj split into unequal parts, a window shorter than the prompt, a partial
rotary; logits, KV-cached greedy continuations, export and back in tests/hf/test_parity_decoders.py): the export
fuses back to the checkpoint's tensors; the window and the fused layouts each move the logits when done
otherwise; export picks Phi-3 for a partial rotary; Phi-3-mini-4k's config.json converts to the phi3_mini preset,
whose parameter count is transformers'; longrope (the 128k models) and other variants are refused in one line.
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs  # noqa: E402
from tests.helpers.hf_runs import hf_refs_fixture  # noqa: F401,E402  (the session's references)
from zoo import hf  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from zoo.hf import io, phi3, table  # noqa: E402
from zoo.hf.convert import export_converter  # noqa: E402
from zoo.models.gpt import PHI3_MINI, Gpt, GptConfig  # noqa: E402

IDS = np.random.default_rng(0).integers(0, 300, (2, 12))  # 12 tokens: past the window of 5
one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread
edited = hf_runs.edited
hf_logits = hf_runs.hf_logits


def zoo_logits(model_cfg, params, ids=IDS):
    return np.asarray(Gpt(model_cfg).apply({"params": params}, jnp.asarray(ids)))


def test_phi3_export_fuses_back_to_the_checkpoint_tensors(hf_refs):
    """The Phi-3 key table joins query | key | value and gate | up into exactly the tensors it split."""
    src, run = hf_refs.directory("phi3_partial_tied"), hf_refs.converted("phi3_partial_tied")
    keys = io.Keys(io.read_tensors(src), phi3.PREFIXES)
    out = phi3.params_to_hf(run.params, run.config.model)
    for name in ("model.layers.1.self_attn.qkv_proj.weight", "model.layers.1.mlp.gate_up_proj.weight"):
        np.testing.assert_array_equal(out[name], keys[name.removeprefix("model.")])


def test_the_window_and_the_fused_layouts_each_move_the_logits(hf_refs):
    """What the parity above rests on: no window, q | k | v read as equal thirds, or up | gate swapped, each
    changes the logits far past 1e-4."""
    src, model = hf_refs.reference("phi3_window_gqa")
    run = hf_refs.converted("phi3_window_gqa")
    model_cfg, params = run.config.model, run.params
    theirs = hf_logits(model, IDS)
    assert np.abs(zoo_logits(model_cfg, params) - theirs).max() <= 1e-4
    swapped = dict(params, h_0=dict(params["h_0"], mlp=dict(params["h_0"]["mlp"], gate=params["h_0"]["mlp"]["fc"],
                                                            fc=params["h_0"]["mlp"]["gate"])))
    assert np.abs(zoo_logits(model_cfg, swapped) - theirs).max() > 1e-3
    assert np.abs(zoo_logits(dataclasses.replace(model_cfg, sliding_window=0), params) - theirs).max() > 1e-3
    thirds = [(p, n, dataclasses.replace(t, fusion=table.ROWS) if t.fusion is table.QKV_ROWS else t)
              for p, n, t in phi3.key_table(model_cfg)]
    with pytest.raises(ConversionError, match=r"qkv_proj.weight' has shape \(56, 40\), which does not fit"):
        table.from_hf(io.Keys(io.read_tensors(src), phi3.PREFIXES), thirds, model_cfg)  # 56 rows: no thirds of 8


# ---- export choice, presets, refusals ---------------------------------------------------------------
def phi3_model(**switches) -> GptConfig:
    return GptConfig(**{**dict(vocab_size=264, max_len=64, num_layers=2, d_model=40, num_heads=5, num_kv_heads=1,
                               d_ff=56, dropout=0.0, positions="rope", norm="rmsnorm", mlp="swiglu", qkv_bias=False,
                               out_bias=False, mlp_bias=False, tie_embeddings=False, rotary_fraction=0.5),
                        **switches})


@pytest.mark.parametrize("switches,arch", [
    ({}, "Phi3ForCausalLM"), (dict(sliding_window=8), "Phi3ForCausalLM"),
    (dict(rotary_fraction=1.0), "LlamaForCausalLM"), (dict(rotary_fraction=1.0, sliding_window=8), "MistralForCausalLM")])
def test_export_picks_phi3_for_a_partial_rotary_and_llama_like_without(switches, arch):
    assert export_converter(phi3_model(**switches)).ARCHITECTURES[0] == arch


@pytest.mark.parametrize("switches", [dict(qkv_bias=True), dict(qk_norm=True), dict(rope_scaling="llama3"),
                                      dict(parallel_residual=True), dict(num_experts=4)])
def test_a_partial_rotary_no_architecture_holds_is_refused_in_one_line(switches):
    with pytest.raises(ConversionError, match=r"this gpt model has no Hugging Face equivalent; .* or as Phi-3: "
                                              r"positions=rope \(rope_scaling=none\) with rotary_fraction < 1") as e:
        export_converter(phi3_model(**switches))
    assert "\n" not in str(e.value)


# config.json of microsoft/Phi-3-mini-4k-instruct (as published, transformers 4.40)
PHI3_MINI_JSON = {
    "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
    "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
    "sliding_window": 2047, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.2",
    "use_cache": True, "vocab_size": 32064}


def test_phi3_mini_config_converts_to_the_preset_whose_count_is_transformers():
    assert phi3.config_from_hf(PHI3_MINI_JSON, {"lm_head.weight"}) == PHI3_MINI
    shapes = jax.eval_shape(lambda: Gpt(PHI3_MINI).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
    ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    with torch.device("meta"):
        theirs = transformers.Phi3ForCausalLM(transformers.Phi3Config(**{
            k: v for k, v in PHI3_MINI_JSON.items() if k not in ("architectures", "torch_dtype",
                                                                  "transformers_version", "model_type")}))
    assert ours == sum(p.numel() for p in theirs.parameters()) == 3_821_079_552


LONGROPE = dict(long_factor=[1.0] * 2, short_factor=[1.0] * 2, original_max_position_embeddings=32)


@pytest.mark.parametrize("fields,message", [
    (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, **LONGROPE}),
     r"^Phi-3 rope type 'longrope' is not supported \(the long-context models' scaled frequencies\); "
     r"supported: default$"),
    (dict(rope_scaling={"type": "su", **LONGROPE}), r"^Phi-3 rope type 'su' is not supported"),
    (dict(hidden_act="gelu"), r"^Phi-3 hidden_act='gelu' is not supported"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.1}),
     r"^Phi-3 partial rotary 0.1 rotates 0 of each head's 8 dims; supported: an even, nonzero number")])
def test_what_zoo_cannot_hold_is_refused_in_one_line(hf_refs, tmp_path, fields, message):
    with pytest.raises(ConversionError, match=message) as e:
        hf.from_hf(edited(hf_refs.directory("phi3_window_gqa"), tmp_path / "bad", **fields), str(tmp_path / "run"), verbose=False)
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "run")
