"""GPT-2 (`GPT2LMHeadModel`, `GPT2Model`) <-> zoo GPT: config and weight mapping.

HF GPT-2 stores attention as a fused Conv1D `c_attn` [D, 3D] (input-major); zoo keeps separate
query/key/value kernels [D, N, H] and an output kernel [N, H, D]. The LM head is tied to `wte`.
Import and export are both derived from `key_table` (see zoo.hf.table). D width, N heads, H head dim.
"""

from __future__ import annotations

import numpy as np

from zoo.models.gpt import GptConfig
from zoo.errors import ConversionError
from zoo.hf import base, table
from zoo.hf.io import Keys

TASK = "gpt_lm"  # the zoo task a converted checkpoint trains as
ARCHITECTURES = ("GPT2LMHeadModel", "GPT2Model")
PREFIXES = ("transformer.",)
IGNORED = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers in old checkpoints


def config_from_hf(hf: dict, keys: Keys) -> GptConfig:
    act = hf.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        raise ConversionError(f"GPT-2 activation_function={act!r} is not supported (zoo GPT uses tanh-GELU)")
    if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("reorder_and_upcast_attn") or \
            not hf.get("scale_attn_weights", True) or hf.get("add_cross_attention"):
        raise ConversionError("GPT-2 attention variants (scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn, "
                              "unscaled or cross attention) are not supported")
    d = hf["n_embd"]
    return GptConfig(vocab_size=hf["vocab_size"], max_len=hf["n_positions"], num_layers=hf["n_layer"], d_model=d,
                     num_heads=hf["n_head"], d_ff=hf.get("n_inner") or 4 * d, dropout=hf.get("resid_pdrop", 0.1),
                     ln_eps=hf.get("layer_norm_epsilon", 1e-5))


def config_to_hf(cfg: GptConfig) -> dict:
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
            "n_positions": cfg.max_len, "n_embd": cfg.d_model, "n_layer": cfg.num_layers, "n_head": cfg.num_heads,
            "n_inner": cfg.d_ff, "activation_function": "gelu_new", "layer_norm_epsilon": cfg.ln_eps,
            "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": 0.0,
            "tie_word_embeddings": True, "dtype": "float32"}


def key_table(cfg: GptConfig) -> list:
    """The two-way key table (names without the "transformer." wrapper). c_attn [D, 3D] is fused:
    query, key and value are its three slices along the output axis."""
    qkv = [row for j, name in enumerate(("query", "key", "value"))
           for row in ((f"attn/{name}/kernel", "attn.c_attn.weight", table.fused(table.CONV_HEADS_IN, j, 3)),
                       (f"attn/{name}/bias", "attn.c_attn.bias", table.fused(table.HEADS_BIAS, j, 3)))]
    block = [*table.ln("ln_1", "ln_1"), *qkv,
             ("attn/out/kernel", "attn.c_proj.weight", table.CONV_HEADS_OUT),
             ("attn/out/bias", "attn.c_proj.bias", table.SAME),
             *table.ln("ln_2", "ln_2"), *table.conv("mlp/fc", "mlp.c_fc"), *table.conv("mlp/proj", "mlp.c_proj")]
    return [("wte/embedding", "wte.weight", table.SAME), ("wpe", "wpe.weight", table.SAME),
            *table.ln("ln_f", "ln_f"), *table.layers(cfg.num_layers, "h_{i}", "h.{i}.", block)]


def params_from_hf(keys: Keys, cfg: GptConfig, task: str) -> dict:
    params = table.from_hf(keys, key_table(cfg), cfg)
    # Explicit: the LM head is tied to wte; a checkpoint may save it, and then it must equal wte.
    if "lm_head.weight" in keys and not np.array_equal(keys["lm_head.weight"], params["wte"]["embedding"]):
        raise ConversionError("lm_head.weight differs from wte.weight: untied GPT-2 heads are not supported")
    return params


def params_to_hf(params: dict, cfg: GptConfig) -> dict:
    return table.to_hf(params, key_table(cfg), cfg, prefix="transformer.")


def task_for(hf: dict, keys: Keys) -> str:
    return TASK


data_fields = base.no_data_fields


seq2seq_framing = base.no_seq2seq_framing


head_config = base.no_head_config


def run_fields(cfg) -> dict:
    """bos/eos_token_id: the run's end-of-text (GPT-2's 50256, bytes' 256, cl100k's 100257, a converted
    BPE's own), on which transformers' `generate` stops; none when the model does not hold it (a
    checkpoint converted without its tokenizer)."""
    from zoo.data.tokenizers import get_tokenizer
    eot = int(get_tokenizer(cfg.data.tokenizer).eot_token)
    return {"bos_token_id": eot, "eos_token_id": eot} if eot < cfg.model.vocab_size else {}


def exports(model_cfg) -> bool:
    """GPT-2: positions=learned, norm=layernorm, mlp=gelu, num_kv_heads=0, d_kv=0, all biases, tied,
    sliding_window=0, qk_norm off"""
    c = model_cfg
    return (c.positions, c.norm, c.mlp) == ("learned", "layernorm", "gelu") and c.kv_heads == c.num_heads and \
        c.head_dim * c.num_heads == c.d_model and c.qkv_bias and c.out_bias and c.mlp_bias and c.tie_embeddings \
        and c.sliding_window == 0 and not c.qk_norm and not c.parallel_residual and not c.gemma_parts
