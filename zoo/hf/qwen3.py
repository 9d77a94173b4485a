"""Qwen3 (`Qwen3ForCausalLM`, `Qwen3Model`) <-> zoo GPT: Llama's decoder (zoo.hf.llama, whose key table
and helpers this module shares) with an RMSNorm on each query and key head before rope (self_attn.q_norm
and k_norm, weight [H]: zoo's qk_norm, attn/q_norm and attn/k_norm), a head width of its own
(config.json `head_dim`: zoo's d_kv) and `attention_bias` on q/k/v and o alike (off in every released
Qwen3). Qwen3's sliding window covers only the layers `layer_types` marks "sliding_attention" (those from
`max_window_layers` on), which zoo's one `sliding_window` cannot say: a checkpoint that turns it on is
refused, as are rope types other than default and llama3 (zoo.hf.llama.rope_fields).
"""

from __future__ import annotations

from zoo.errors import ConversionError
from zoo.hf import llama
from zoo.hf.io import Keys
from zoo.models.gpt import GptConfig

ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3Model")
PREFIXES, IGNORED = llama.PREFIXES, llama.IGNORED
key_table, params_from_hf, params_to_hf = llama.key_table, llama.params_from_hf, llama.params_to_hf
task_for, data_fields, seq2seq_framing = llama.task_for, llama.data_fields, llama.seq2seq_framing
head_config, run_fields = llama.head_config, llama.run_fields


def config_from_hf(hf: dict, keys: Keys) -> GptConfig:
    if hf.get("use_sliding_window") or "sliding_attention" in (hf.get("layer_types") or ()):
        raise ConversionError("Qwen3 use_sliding_window=true is not supported (its window covers the layers "
                              "layer_types marks sliding_attention; zoo's sliding_window covers all); supported: "
                              "full attention in every layer")
    bias = bool(hf.get("attention_bias", False))
    return GptConfig(**llama.decoder_fields(hf, keys, "Qwen3"), qkv_bias=bias, out_bias=bias, mlp_bias=False,
                     qk_norm=True)


def config_to_hf(cfg: GptConfig) -> dict:
    return {**llama.decoder_to_hf(cfg, "Qwen3ForCausalLM", "qwen3"), "attention_bias": cfg.qkv_bias,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.num_layers}


def exports(model_cfg) -> bool:
    """Qwen3: positions=rope, norm=rmsnorm, mlp=swiglu, qk_norm on, qkv_bias == out_bias, no mlp_bias,
    sliding_window=0"""
    return llama.decoder(model_cfg, qk_norm=True) and model_cfg.qkv_bias == model_cfg.out_bias and \
        not model_cfg.mlp_bias and model_cfg.sliding_window == 0
