"""Qwen2 (`Qwen2ForCausalLM`, `Qwen2Model`) <-> zoo GPT: Llama's decoder (zoo.hf.llama, whose key table
and helpers this module shares) with biases on q_proj/k_proj/v_proj only. Qwen2's sliding window
covers only the layers from `max_window_layers` on, which zoo's one `sliding_window` cannot say: a
checkpoint that turns it on is refused.
"""

from __future__ import annotations

from zoo.errors import ConversionError
from zoo.hf import llama
from zoo.hf.io import Keys
from zoo.models.gpt import GptConfig

ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen2Model")
PREFIXES, IGNORED = llama.PREFIXES, llama.IGNORED
key_table, params_from_hf, params_to_hf = llama.key_table, llama.params_from_hf, llama.params_to_hf
task_for, data_fields, seq2seq_framing = llama.task_for, llama.data_fields, llama.seq2seq_framing
head_config, run_fields = llama.head_config, llama.run_fields


def config_from_hf(hf: dict, keys: Keys) -> GptConfig:
    if hf.get("use_sliding_window") or "sliding_attention" in (hf.get("layer_types") or ()):
        raise ConversionError("Qwen2 use_sliding_window=true is not supported (its window covers the layers from "
                              "max_window_layers on; zoo's sliding_window covers all)")
    return GptConfig(**llama.decoder_fields(hf, keys, "Qwen2"), qkv_bias=True, out_bias=False, mlp_bias=False)


def config_to_hf(cfg: GptConfig) -> dict:
    return {**llama.decoder_to_hf(cfg, "Qwen2ForCausalLM", "qwen2"), "use_sliding_window": False,
            "sliding_window": None, "max_window_layers": cfg.num_layers}


def exports(model_cfg) -> bool:
    """Qwen2: positions=rope, norm=rmsnorm, mlp=swiglu, qkv_bias without out_bias or mlp_bias, sliding_window=0,
    qk_norm off"""
    return llama.decoder(model_cfg) and model_cfg.qkv_bias and not model_cfg.out_bias and \
        not model_cfg.mlp_bias and model_cfg.sliding_window == 0
