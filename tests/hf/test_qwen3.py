"""Qwen3 and a head width apart from d_model / num_heads, beside the parity of their rows in
tests/hf/parity_table.py (qwen3, qwen3_bias_tied, mistral_head24: head_dim 24 over width 40 and 3 heads; logits,
KV-cached greedy continuations, export and back in tests/hf/test_parity_decoders.py): export picks Qwen3 for q/k
norms; what zoo cannot hold is refused in one line; such a GPT trains a step and counts its FLOPs with its own
head width.
"""

import dataclasses
import os

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
from zoo.models.gpt import GptConfig  # noqa: E402
from zoo.tasks.lm import LmTask  # noqa: E402

one_torch_thread = hf_runs.one_torch_thread  # autouse: torch on one thread
edited = hf_runs.edited


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
def test_what_zoo_cannot_hold_is_refused_in_one_line(hf_refs, tmp_path, fields, message):
    with pytest.raises(ConversionError, match=message) as e:
        hf.from_hf(edited(hf_refs.directory("qwen3"), tmp_path / "bad", **fields), str(tmp_path / "run"), verbose=False)
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
