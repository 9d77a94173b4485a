"""Qwen3 and a head width apart from d_model / num_heads, from and to Hugging Face: small random
transformers models (Qwen3 with q/k norms and head_dim 24 over width 40 and 3 heads; Mistral with the
same head_dim) convert to zoo runs whose logits and KV-cached greedy continuations equal transformers';
`to-hf` loads back as the same architecture and converts back to identical params; export picks Qwen3
for q/k norms; what zoo cannot hold is refused in one line; such a GPT trains a step and counts its FLOPs
with its own head width.
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: HF parity tests need transformers (PyTorch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from tests.helpers import hf_runs, tiny_configs  # noqa: E402
from tests.helpers.runs import losses, run  # noqa: E402
from zoo import hf  # noqa: E402
from zoo.errors import ConfigError, ConversionError  # noqa: E402
from zoo.hf.convert import export_converter  # noqa: E402
from zoo.infer.sample import generate  # noqa: E402
from zoo.models.gpt import GptConfig  # noqa: E402
from zoo.tasks.lm import LmTask  # noqa: E402
from zoo.training import runs as run_reader  # noqa: E402

V = 300
# N * H = 72 != D = 40: every projection and reshape sees the head width, not D / N (13, odd).
# initializer_range 0.2: attention far from uniform, so a norm or rope applied wrongly moves the logits.
SMALL = dict(vocab_size=V, hidden_size=40, intermediate_size=56, num_hidden_layers=2, num_attention_heads=3,
             head_dim=24, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1,
             initializer_range=0.2, attn_implementation="eager")
# name -> (transformers class prefix, config fields beside SMALL, the zoo fields they convert to)
MODELS = {
    "qwen3": ("Qwen3", dict(num_key_value_heads=1, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
              dict(d_kv=24, num_kv_heads=1, qk_norm=True, qkv_bias=False, out_bias=False, tie_embeddings=False)),
    "qwen3_bias_tied": ("Qwen3", dict(num_key_value_heads=3, attention_bias=True, tie_word_embeddings=True),
                        dict(d_kv=24, num_kv_heads=0, qk_norm=True, qkv_bias=True, out_bias=True,
                             tie_embeddings=True)),
    "mistral": ("Mistral", dict(num_key_value_heads=1, sliding_window=4),
                dict(d_kv=24, num_kv_heads=1, qk_norm=False, sliding_window=4, tie_embeddings=False)),
}
IDS = np.random.default_rng(0).integers(0, V, (2, 12))
one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread
edited = hf_runs.edited
hf_logits = hf_runs.hf_logits


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """name -> (checkpoint directory, its transformers model); the q/k norm weights perturbed off 1."""
    out = {}
    for name, (prefix, fields, _) in MODELS.items():
        torch.manual_seed(0)
        model = getattr(transformers, f"{prefix}ForCausalLM")(
            getattr(transformers, f"{prefix}Config")(**SMALL, **fields)).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" in n or n.endswith(".bias"):  # ones / zeros at init: a swapped q/k norm would not show
                    p.add_(0.3 * torch.randn_like(p))
        d = tmp_path_factory.mktemp(name)
        model.save_pretrained(d)
        out[name] = (str(d), model)
    return out


@pytest.fixture(scope="module")
def runs(hf_dirs, tmp_path_factory):
    return hf_runs.convert_all(hf_dirs, tmp_path_factory)


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_and_kv_cached_greedy_decoding_equal_transformers(hf_dirs, runs, name):
    run_dir, report = runs[name]
    assert report["unused"] == []
    zmodel, params, _, cfg = run_reader.load_run(run_dir)
    assert {k: getattr(cfg.model, k) for k in MODELS[name][2]} == MODELS[name][2]
    assert params["h_0"]["attn"]["query"]["kernel"].shape == (40, 3, 24)
    ours = np.asarray(zmodel.apply({"params": params}, jnp.asarray(IDS)))
    diff = np.abs(ours - hf_logits(hf_dirs[name][1], IDS)).max()
    print(f"{name}: max abs logit diff {diff:.2e}")
    assert diff <= 1e-4
    prompt = [5, 17, 42, 8]  # 4 + 8 tokens: past mistral's window of 4
    with torch.no_grad():
        theirs = hf_dirs[name][1].generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                                           pad_token_id=1, eos_token_id=None)[0, len(prompt):].tolist()
    assert generate(zmodel, params, prompt, 8, temperature=0.0)[0] == theirs


@pytest.mark.parametrize("name", ["qwen3", "mistral"])
def test_export_loads_as_the_same_architecture_and_converts_back_identically(hf_dirs, runs, name, tmp_path):
    run_dir, report = runs[name]
    hf.to_hf(run_dir, str(tmp_path / "out"), verbose=False)
    hf_cfg = json.load(open(tmp_path / "out" / "config.json"))
    assert (hf_cfg["model_type"], hf_cfg["head_dim"]) == (MODELS[name][0].lower(), 24)
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert type(exported) is type(hf_dirs[name][1])
    np.testing.assert_allclose(hf_logits(exported, IDS), hf_logits(hf_dirs[name][1], IDS), atol=1e-5)
    again = hf.from_hf(str(tmp_path / "out"), str(tmp_path / "again"), verbose=False)
    assert again["unused"] == [] and again["config"].model == report["config"].model
    assert jax.tree.structure(again["params"]) == jax.tree.structure(report["params"])
    for x, y in zip(jax.tree.leaves(again["params"]), jax.tree.leaves(report["params"])):
        np.testing.assert_array_equal(x, y)


def qwen3_model(**switches) -> GptConfig:
    return GptConfig(**{**dict(vocab_size=264, max_len=64, num_layers=2, d_model=40, num_heads=3, num_kv_heads=1,
                               d_kv=24, d_ff=64, dropout=0.0, positions="rope", norm="rmsnorm", mlp="swiglu",
                               qkv_bias=False, out_bias=False, mlp_bias=False, tie_embeddings=False, qk_norm=True),
                        **switches})


@pytest.mark.parametrize("switches,arch", [
    ({}, "Qwen3ForCausalLM"), (dict(qkv_bias=True, out_bias=True, tie_embeddings=True), "Qwen3ForCausalLM"),
    (dict(qk_norm=False), "LlamaForCausalLM"), (dict(qk_norm=False, qkv_bias=True), "Qwen2ForCausalLM"),
    (dict(qk_norm=False, sliding_window=8), "MistralForCausalLM")])
def test_export_picks_qwen3_for_qk_norms_and_llama_like_without(switches, arch):
    assert export_converter(qwen3_model(**switches)).ARCHITECTURES[0] == arch


@pytest.mark.parametrize("switches", [dict(sliding_window=8), dict(mlp_bias=True), dict(qkv_bias=True),
                                      dict(positions="learned", norm="layernorm", mlp="gelu", num_kv_heads=0,
                                           qkv_bias=True, out_bias=True, mlp_bias=True, tie_embeddings=True)])
def test_qk_norms_no_architecture_holds_are_refused_in_one_line(switches):
    with pytest.raises(ConversionError, match=r"this gpt model has no Hugging Face equivalent; .* or as Qwen3: "
                                              r"positions=rope, norm=rmsnorm, mlp=swiglu, qk_norm on") as e:
        export_converter(qwen3_model(**switches))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("fields,message", [
    (dict(use_sliding_window=True, layer_types=["full_attention", "sliding_attention"]),
     r"^Qwen3 use_sliding_window=true is not supported .*; supported: full attention in every layer$"),
    (dict(layer_types=["full_attention", "sliding_attention"]), r"^Qwen3 use_sliding_window=true is not supported"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
     r"^Qwen3 rope type 'yarn' is not supported; supported: default, llama3$")])
def test_what_zoo_cannot_hold_is_refused_in_one_line(hf_dirs, tmp_path, fields, message):
    with pytest.raises(ConversionError, match=message) as e:
        hf.from_hf(edited(hf_dirs["qwen3"][0], tmp_path / "bad", **fields), str(tmp_path / "run"), verbose=False)
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "run")


def test_a_gpt_with_its_own_head_width_trains_a_step_and_counts_its_flops(cache_dir, tmp_path):
    cfg = tiny_configs.gpt_lm(cache_dir)
    cfg = dataclasses.replace(cfg, model=qwen3_model(vocab_size=384, num_kv_heads=3),
                              optim=dataclasses.replace(cfg.optim, warmup=0),
                              train=dataclasses.replace(cfg.train, steps=1, save_every=1))
    out = run(cfg, tmp_path / "run")
    assert np.isfinite(losses(tmp_path / "run")[1])
    params = out["state"].params
    assert params["h_0"]["attn"]["query"]["kernel"].shape == (40, 3, 24)
    k_norm = np.asarray(params["h_1"]["attn"]["k_norm"]["scale"])  # initialised to ones: the step reached it
    assert k_norm.shape == (24,) and 0 < np.abs(k_norm - 1).max() <= 2e-3
    # 6N + 12 L N H T with H = 24 (N * H = 72, not D = 40); N: every param but the untied wte lookup.
    D, F, H, L, T = 40, 64, 24, 2, cfg.data.seq_len
    block = D * 3 * H * 3 + 3 * H * D + 3 * D * F + 2 * D + 2 * H
    n = L * block + D + 384 * D
    assert LmTask(cfg).flops_per_token(T) == 6 * n + 12 * L * 3 * H * T


def test_the_head_width_is_checked_where_it_is_set():
    assert qwen3_model().head_dim == 24 and qwen3_model(d_kv=0, d_model=48).head_dim == 16
    with pytest.raises(ConfigError, match=r"model.d_model=40 is not divisible by model.num_heads=3 "
                                          r"\(or set model.d_kv\)"):
        qwen3_model(d_kv=0)
    with pytest.raises(ConfigError, match=r"model.positions=rope needs an even head dimension; got 25"):
        qwen3_model(d_kv=25)
