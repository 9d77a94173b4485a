"""Gemma 2 (`Gemma2ForCausalLM`, `Gemma2Model`) <-> zoo GPT: Gemma's decoder (zoo.hf.gemma, whose key table
and helpers this module shares) with a norm after each sublayer too, the attention scale
1/sqrt(query_pre_attn_scalar), soft-capped attention and output logits, and sliding-window layers beside
global ones (`layer_types`: every other layer global in every released Gemma 2). Its rope is one for all
layers: default or llama3 (zoo.hf.llama.rope_fields); other rope types are refused.
"""

from __future__ import annotations

from zoo.hf import gemma, llama
from zoo.hf.io import Keys
from zoo.models.gpt import GptConfig

ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma2Model")
PREFIXES, IGNORED = gemma.PREFIXES, gemma.IGNORED
key_table, params_from_hf, params_to_hf = gemma.key_table, gemma.params_from_hf, gemma.params_to_hf
task_for, data_fields, seq2seq_framing = gemma.task_for, gemma.data_fields, gemma.seq2seq_framing
head_config, run_fields = gemma.head_config, gemma.run_fields


def config_from_hf(hf: dict, keys: Keys) -> GptConfig:
    return GptConfig(**gemma.base_fields(hf, keys, "Gemma2", "hidden_activation"), post_norms=True,
                     **gemma.local_fields(hf, "Gemma2", 2), **llama.rope_fields(hf, "Gemma2"))


def config_to_hf(cfg: GptConfig) -> dict:
    return {**gemma.base_to_hf(cfg, "Gemma2ForCausalLM", "gemma2", "hidden_activation"), **gemma.local_to_hf(cfg)}


def exports(model_cfg) -> bool:
    """Gemma 2: positions=rope, norm=rmsnorm_plus1, mlp=geglu, embed_scale, post_norms, no qk_norm or mlp_bias,
    qkv_bias == out_bias, one rope base (rope_local_theta 0)"""
    return gemma.gemma(model_cfg, post_norms=True, qk_norm=False) and \
        model_cfg.rope_local_theta in (0, model_cfg.rope_theta)
