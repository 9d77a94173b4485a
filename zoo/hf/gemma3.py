"""Gemma 3's text decoder (`Gemma3ForCausalLM`, model_type gemma3_text) <-> zoo GPT: Gemma 2's decoder
(zoo.hf.gemma, whose key table and helpers this module shares) with (1 + w) RMSNorms on each query and key
head (self_attn.q_norm and k_norm: zoo's qk_norm under norm rmsnorm_plus1), five local layers to each global
one (`layer_types`), and a rope base of their own for the local layers (rope_parameters' sliding_attention
rope_theta, or the older rope_local_base_freq: zoo's rope_local_theta), and no attention soft-capping
(transformers' Gemma3Attention ignores config.json's attn_logit_softcapping, and so does the import; an
export with attn_softcap set is refused, since transformers would not apply it). Its global layers' rope may be
scaled linearly (Gemma 3 4B and larger: factor 8; zoo's rope_scaling linear); other rope types are refused,
as is the multimodal Gemma3ForConditionalGeneration (model_type gemma3).
"""

from __future__ import annotations

from zoo.errors import ConversionError
from zoo.hf import gemma
from zoo.hf.io import Keys
from zoo.models.gpt import GptConfig

ARCHITECTURES = ("Gemma3ForCausalLM", "Gemma3TextModel")
PREFIXES, IGNORED = gemma.PREFIXES, gemma.IGNORED
key_table, params_from_hf, params_to_hf = gemma.key_table, gemma.params_from_hf, gemma.params_to_hf
task_for, data_fields, seq2seq_framing = gemma.task_for, gemma.data_fields, gemma.seq2seq_framing
head_config, run_fields = gemma.head_config, gemma.run_fields
ROPE_TYPES = ("default", "linear")  # of the global layers; the local layers': default


def rope_fields(hf: dict) -> dict:
    """rope fields from rope_parameters per layer type (transformers 5), else the older rope_theta,
    rope_local_base_freq and rope_scaling (transformers' defaults: 1e6 and 1e4)."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    else:
        full = {**(hf.get("rope_scaling") or {}), "rope_theta": hf.get("rope_theta", 1e6)}
        local = {"rope_theta": hf.get("rope_local_base_freq", 1e4)}
    for kind, p, ok in (("full_attention", full, ROPE_TYPES), ("sliding_attention", local, ROPE_TYPES[:1])):
        t = p.get("rope_type", p.get("type", "default"))
        if t not in ok:
            raise ConversionError(f"Gemma3 {kind} rope type {t!r} is not supported; supported: {', '.join(ok)}")
    out = dict(positions="rope", rope_theta=float(full.get("rope_theta", 1e6)),
               rope_local_theta=float(local.get("rope_theta", 1e4)))
    if full.get("rope_type", full.get("type")) == "linear":
        out.update(rope_scaling="linear", rope_factor=float(full["factor"]))
    return out


def config_from_hf(hf: dict, keys: Keys) -> GptConfig:
    local = gemma.local_fields(hf, "Gemma3", int(hf.get("sliding_window_pattern") or 6))
    local["attn_softcap"] = 0.0  # transformers' Gemma3Attention never passes attn_logit_softcapping on
    return GptConfig(**gemma.base_fields(hf, keys, "Gemma3", "hidden_activation"), post_norms=True, qk_norm=True,
                     **local, **rope_fields(hf))


def config_to_hf(cfg: GptConfig) -> dict:
    full = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "linear":
        full.update(rope_type="linear", factor=cfg.rope_factor)
    rope = {"full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_local_theta or cfg.rope_theta}}
    return {**gemma.base_to_hf(cfg, "Gemma3ForCausalLM", "gemma3_text", "hidden_activation"),
            **gemma.local_to_hf(cfg), "rope_parameters": rope}


def exports(model_cfg) -> bool:
    """Gemma 3: positions=rope, norm=rmsnorm_plus1, mlp=geglu, embed_scale, post_norms, qk_norm, no mlp_bias,
    qkv_bias == out_bias, rope_scaling none or linear, no attn_softcap"""
    return gemma.gemma(model_cfg, post_norms=True, qk_norm=True) and model_cfg.rope_scaling in ("none", "linear") \
        and not model_cfg.attn_softcap

