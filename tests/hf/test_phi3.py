"""Phi-3 from and to Hugging Face: small random transformers models (grouped-query attention, so the fused
qkv_proj splits into unequal parts; a sliding window shorter than the prompt; a partial rotary; tied and
untied heads) convert to zoo runs whose logits and KV-cached greedy continuations equal transformers';
`to-hf` writes a model transformers computes the same (Phi-3 with a partial rotary, else the Llama or
Mistral it equals) that converts back to identical params; the window and the fused layouts each move the
logits when done otherwise; Phi-3-mini-4k's config.json converts to the phi3_mini preset, whose parameter
count is transformers'; longrope (the 128k models) and other variants are refused in one line.
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
from zoo import hf  # noqa: E402
from zoo.errors import ConversionError  # noqa: E402
from zoo.hf import io, phi3, table  # noqa: E402
from zoo.hf.convert import export_converter  # noqa: E402
from zoo.infer.sample import generate  # noqa: E402
from zoo.models.gpt import PHI3_MINI, Gpt, GptConfig  # noqa: E402
from zoo.training import runs as run_reader  # noqa: E402

V = 300
# 5 query heads of width 8 over width 40, MLP width 56; initializer_range 0.2: attention far from uniform.
SMALL = dict(vocab_size=V, hidden_size=40, intermediate_size=56, num_hidden_layers=2, num_attention_heads=5,
             max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=1, initializer_range=0.2,
             attn_implementation="eager")
# name -> (Phi3Config fields beside SMALL, the zoo fields they convert to, the architecture it exports as)
MODELS = {
    # as Phi-3-mini-4k (whole heads rotated, a window) but grouped: qkv_proj rows 40 | 8 | 8
    "window_gqa": (dict(num_key_value_heads=1, sliding_window=5),
                   dict(num_kv_heads=1, sliding_window=5, rotary_fraction=1.0, tie_embeddings=False),
                   "MistralForCausalLM"),
    "partial_tied": (dict(num_key_value_heads=1, partial_rotary_factor=0.5, tie_word_embeddings=True),
                     dict(num_kv_heads=1, sliding_window=0, rotary_fraction=0.5, tie_embeddings=True),
                     "Phi3ForCausalLM"),
}
IDS = np.random.default_rng(0).integers(0, V, (2, 12))  # 12 tokens: past the window of 5
one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread
edited = hf_runs.edited
hf_logits = hf_runs.hf_logits


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """name -> (checkpoint directory, its transformers model); the norms perturbed off their init."""
    out = {}
    for name, (fields, _, _) in MODELS.items():
        torch.manual_seed(0)
        model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**SMALL, **fields)).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" in n:  # ones at init: a swapped norm would not show
                    p.add_(0.3 * torch.randn_like(p))
        d = tmp_path_factory.mktemp(name)
        model.save_pretrained(d)
        out[name] = (str(d), model)
    return out


@pytest.fixture(scope="module")
def runs(hf_dirs, tmp_path_factory):
    return hf_runs.convert_all(hf_dirs, tmp_path_factory)


def zoo_logits(model_cfg, params, ids=IDS):
    return np.asarray(Gpt(model_cfg).apply({"params": params}, jnp.asarray(ids)))


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_and_kv_cached_greedy_decoding_equal_transformers(hf_dirs, runs, name):
    run_dir, report = runs[name]
    assert report["unused"] == []
    zmodel, params, _, cfg = run_reader.load_run(run_dir)
    assert {k: getattr(cfg.model, k) for k in MODELS[name][1]} == MODELS[name][1]
    attn = params["h_0"]["attn"]
    assert (attn["query"]["kernel"].shape, attn["key"]["kernel"].shape) == ((40, 5, 8), (40, 1, 8))
    assert params["h_0"]["mlp"]["gate"]["kernel"].shape == params["h_0"]["mlp"]["fc"]["kernel"].shape == (40, 56)
    diff = np.abs(zoo_logits(cfg.model, params) - hf_logits(hf_dirs[name][1], IDS)).max()
    print(f"{name}: max abs logit diff {diff:.2e}")
    assert diff <= 1e-4
    prompt = [5, 17, 42, 8, 99, 3, 250]  # 7 + 8 tokens: the prompt alone is past the window of 5
    with torch.no_grad():
        theirs = hf_dirs[name][1].generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                                           pad_token_id=1, eos_token_id=None)[0, len(prompt):].tolist()
    assert generate(zmodel, params, prompt, 8, temperature=0.0)[0] == theirs


@pytest.mark.parametrize("name", list(MODELS))
def test_export_loads_as_the_same_function_and_converts_back_identically(hf_dirs, runs, name, tmp_path):
    run_dir, report = runs[name]
    hf.to_hf(run_dir, str(tmp_path / "out"), verbose=False)
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert type(exported).__name__ == MODELS[name][2]
    np.testing.assert_allclose(hf_logits(exported, IDS), hf_logits(hf_dirs[name][1], IDS), atol=1e-5)
    again = hf.from_hf(str(tmp_path / "out"), str(tmp_path / "again"), verbose=False)
    assert again["unused"] == [] and again["config"].model == report["config"].model
    assert jax.tree.structure(again["params"]) == jax.tree.structure(report["params"])
    for x, y in zip(jax.tree.leaves(again["params"]), jax.tree.leaves(report["params"])):
        np.testing.assert_array_equal(x, y)


def test_phi3_export_fuses_back_to_the_checkpoint_tensors(hf_dirs, runs):
    """The Phi-3 key table joins query | key | value and gate | up into exactly the tensors it split."""
    src, _ = hf_dirs["partial_tied"]
    report = runs["partial_tied"][1]
    keys = io.Keys(io.read_tensors(src), phi3.PREFIXES)
    out = phi3.params_to_hf(report["params"], report["config"].model)
    for name in ("model.layers.1.self_attn.qkv_proj.weight", "model.layers.1.mlp.gate_up_proj.weight"):
        np.testing.assert_array_equal(out[name], keys[name.removeprefix("model.")])


def test_the_window_and_the_fused_layouts_each_move_the_logits(hf_dirs, runs):
    """What the parity above rests on: no window, q | k | v read as equal thirds, or up | gate swapped, each
    changes the logits far past 1e-4."""
    src, model = hf_dirs["window_gqa"]
    model_cfg, params = runs["window_gqa"][1]["config"].model, runs["window_gqa"][1]["params"]
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
def test_what_zoo_cannot_hold_is_refused_in_one_line(hf_dirs, tmp_path, fields, message):
    with pytest.raises(ConversionError, match=message) as e:
        hf.from_hf(edited(hf_dirs["window_gqa"][0], tmp_path / "bad", **fields), str(tmp_path / "run"), verbose=False)
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "run")
