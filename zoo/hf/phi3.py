"""Phi-3 (`Phi3ForCausalLM`, `Phi3Model`) <-> zoo GPT: Llama's decoder (zoo.hf.llama, whose helpers this
module shares) with two fused projections, a sliding window over every layer and an optional partial rotary.

HF fuses query, key and value into one torch Linear self_attn.qkv_proj [(N + 2K) * H, D] (q | k | v along
its output rows: unequal parts under grouped-query attention) and the MLP's gate and up into
mlp.gate_up_proj [2F, D] (gate | up); zoo keeps query [D, N, H], key/value [D, K, H], gate and fc [D, F]
apart, and the key table splits and joins them (`table.QKV_ROWS`, `table.ROWS`). config.json's
`sliding_window` (Phi-3-mini-4k: 2047) is zoo's: a query sees keys q - k < window, as transformers'
sliding-window mask. `partial_rotary_factor` (rope on the first fraction of each head, rotate-half within
it) is zoo's rotary_fraction. Rope types other than default (the 128k models' longrope, "su") are refused.

Export: a zoo model with whole heads rotated is a Llama (or, with a window, a Mistral) that transformers
computes the same, and exports as one (zoo.hf.llama, zoo.hf.mistral); one with a partial rotary exports
as Phi-3, which alone of these holds it.
"""

from __future__ import annotations

from zoo.errors import ConversionError
from zoo.hf import gpt_neox, llama, table
from zoo.hf.io import Keys
from zoo.models.gpt import GptConfig

ARCHITECTURES = ("Phi3ForCausalLM", "Phi3Model")
PREFIXES, IGNORED = llama.PREFIXES, llama.IGNORED
task_for, data_fields, seq2seq_framing = llama.task_for, llama.data_fields, llama.seq2seq_framing
head_config, run_fields = llama.head_config, llama.run_fields
ROPE_TYPES = ("default",)


def key_table(cfg: GptConfig) -> list:
    """The two-way key table (names without the "model." wrapper; lm_head beside it when untied)."""
    qkv, gate_up = "self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"
    block = [*table.rms("ln_1", "input_layernorm"),
             ("attn/query/kernel", qkv, table.fused(table.HEADS_IN, 0, 3, table.QKV_ROWS)),
             ("attn/key/kernel", qkv, table.fused(table.KV_HEADS_IN, 1, 3, table.QKV_ROWS)),
             ("attn/value/kernel", qkv, table.fused(table.KV_HEADS_IN, 2, 3, table.QKV_ROWS)),
             ("attn/out/kernel", "self_attn.o_proj.weight", table.HEADS_OUT),
             *table.rms("ln_2", "post_attention_layernorm"),
             ("mlp/gate/kernel", gate_up, table.fused(table.LINEAR, 0, 2, table.ROWS)),
             ("mlp/fc/kernel", gate_up, table.fused(table.LINEAR, 1, 2, table.ROWS)),
             *table.linear("mlp/proj", "mlp.down_proj", bias=False)]
    head = [] if cfg.tie_embeddings else [("lm_head/embedding", llama.LM_HEAD, table.SAME)]
    return [("wte/embedding", "embed_tokens.weight", table.SAME), *table.rms("ln_f", "norm"),
            *table.layers(cfg.num_layers, "h_{i}", "layers.{i}.", block), *head]


def params_from_hf(keys: Keys, cfg: GptConfig, task: str) -> dict:
    if cfg.tie_embeddings:  # transformers ties a saved lm_head back to embed_tokens on load: it is not read
        keys.optional(llama.LM_HEAD)
    return table.from_hf(keys, key_table(cfg), cfg)


def params_to_hf(params: dict, cfg: GptConfig) -> dict:
    return table.to_hf(params, key_table(cfg), cfg, prefix="model.", outside=("lm_head.",))


def config_from_hf(hf: dict, keys: Keys) -> GptConfig:
    params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ConversionError(f"Phi-3 rope type {kind!r} is not supported (the long-context models' scaled "
                              f"frequencies); supported: {', '.join(ROPE_TYPES)}")
    hf = {"rms_norm_eps": 1e-5, **hf}  # Phi3Config's defaults, where llama's differ
    fields = llama.decoder_fields(hf, keys, "Phi-3", partial_ok=True)
    gpt_neox.check_rotary("Phi-3", fields.get("rotary_fraction", 1.0),
                          fields["d_kv"] or fields["d_model"] // fields["num_heads"])
    return GptConfig(**fields, qkv_bias=False, out_bias=False, mlp_bias=False,
                     sliding_window=hf.get("sliding_window") or 0)


def config_to_hf(cfg: GptConfig) -> dict:
    out = llama.decoder_to_hf(cfg, "Phi3ForCausalLM", "phi3")
    out["rope_parameters"] = {**out["rope_parameters"], "partial_rotary_factor": cfg.rotary_fraction}
    # Phi3Config's default special ids (1, 32000) are of Phi-3's own vocabulary: none unless run_fields says
    return {**out, "sliding_window": cfg.sliding_window or None, "original_max_position_embeddings": cfg.max_len,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def exports(model_cfg) -> bool:
    """Phi-3: positions=rope (rope_scaling=none) with rotary_fraction < 1, norm=rmsnorm, mlp=swiglu, no biases,
    qk_norm off, no experts"""
    c = model_cfg
    return c.positions == "rope" and c.rope_scaling == "none" and c.rotary_fraction < 1.0 and \
        (c.norm, c.mlp) == ("rmsnorm", "swiglu") and not (c.qkv_bias or c.out_bias or c.mlp_bias or c.qk_norm
                                                         or c.parallel_residual or c.num_experts or c.gemma_parts)
