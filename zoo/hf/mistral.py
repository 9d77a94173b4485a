"""Mistral (`MistralForCausalLM`, `MistralModel`) <-> zoo GPT: Llama's decoder (zoo.hf.llama, whose key
table and helpers this module shares) without biases, and a sliding window over every layer
(config.json `sliding_window`, null for none: zoo's `sliding_window`, 0 for none).
"""

from __future__ import annotations

from zoo.hf import llama
from zoo.hf.io import Keys
from zoo.models.gpt import GptConfig

ARCHITECTURES = ("MistralForCausalLM", "MistralModel")
PREFIXES, IGNORED = llama.PREFIXES, llama.IGNORED
key_table, params_from_hf, params_to_hf = llama.key_table, llama.params_from_hf, llama.params_to_hf
task_for, data_fields, seq2seq_framing = llama.task_for, llama.data_fields, llama.seq2seq_framing
head_config, run_fields = llama.head_config, llama.run_fields


def config_from_hf(hf: dict, keys: Keys) -> GptConfig:
    return GptConfig(**llama.decoder_fields(hf, keys, "Mistral"), qkv_bias=False, out_bias=False, mlp_bias=False,
                     sliding_window=hf.get("sliding_window") or 0)


def config_to_hf(cfg: GptConfig) -> dict:
    return {**llama.decoder_to_hf(cfg, "MistralForCausalLM", "mistral"), "sliding_window": cfg.sliding_window}


def exports(model_cfg) -> bool:
    """Mistral: positions=rope, norm=rmsnorm, mlp=swiglu, no biases, sliding_window > 0, qk_norm off"""
    return llama.decoder(model_cfg) and not (model_cfg.qkv_bias or model_cfg.out_bias or model_cfg.mlp_bias) \
        and model_cfg.sliding_window > 0
