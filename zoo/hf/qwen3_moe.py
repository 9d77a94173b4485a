"""Qwen3-MoE (`Qwen3MoeForCausalLM`, `Qwen3MoeModel`) <-> zoo GPT with a mixture of experts: Qwen3's
decoder (q/k norms, its own head width; zoo.hf.qwen3) whose MLP is `num_experts` SwiGLU experts of width
`moe_intermediate_size` (zoo's d_ff), each token routed to `num_experts_per_tok`, renormalised only when
`norm_topk_prob` (zoo's moe_norm_topk; on in the released models, off in transformers' default config).
The released config.json says `num_experts`; transformers 5 saves it as `num_local_experts`: both are read.

Keys as transformers saves them: mlp.gate [E, D] (zoo `mlp/router`), mlp.experts.{e}.gate_proj, up_proj
and down_proj (zoo `gate`, `fc`, `proj`, stacked [E, ...]); the rows and the stacking are Mixtral's
(zoo.hf.mixtral) under these names. A checkpoint with dense MLP layers among the sparse ones
(`decoder_sparse_step` != 1 or `mlp_only_layers`) or a sliding window is refused: zoo's experts are in
every block. `intermediate_size` (the dense layers' width) then describes no weight: export writes d_ff.
"""

from __future__ import annotations

from zoo.errors import ConversionError
from zoo.hf import llama, mixtral
from zoo.hf.io import Keys
from zoo.models.gpt import GptConfig

ARCHITECTURES = ("Qwen3MoeForCausalLM", "Qwen3MoeModel")
PREFIXES, IGNORED = llama.PREFIXES, llama.IGNORED
task_for, data_fields, seq2seq_framing = llama.task_for, llama.data_fields, llama.seq2seq_framing
head_config, run_fields = llama.head_config, llama.run_fields
EXPERTS = (("gate", "gate_proj"), ("fc", "up_proj"), ("proj", "down_proj"))


def key_table(cfg: GptConfig) -> list:
    return mixtral.moe_key_table(cfg, "mlp.gate", "mlp.experts.{e}.", EXPERTS)


def params_from_hf(keys: Keys, cfg: GptConfig, task: str) -> dict:
    return mixtral.stacked_from_hf(keys, cfg, key_table(cfg), EXPERTS)


def params_to_hf(params: dict, cfg: GptConfig) -> dict:
    return mixtral.split_to_hf(params, cfg, key_table(cfg), EXPERTS)


def config_from_hf(hf: dict, keys: Keys) -> GptConfig:
    if hf.get("decoder_sparse_step", 1) != 1 or hf.get("mlp_only_layers"):
        raise ConversionError(f"Qwen3-MoE with dense MLP layers (decoder_sparse_step="
                              f"{hf.get('decoder_sparse_step', 1)}, mlp_only_layers={hf.get('mlp_only_layers')}) "
                              f"is not supported; supported: experts in every layer (decoder_sparse_step=1, "
                              f"mlp_only_layers=[])")
    if hf.get("use_sliding_window") or "sliding_attention" in (hf.get("layer_types") or ()):
        raise ConversionError("Qwen3-MoE use_sliding_window=true is not supported; supported: full attention in "
                              "every layer")
    bias = bool(hf.get("attention_bias", False))
    fields = {**llama.decoder_fields(hf, keys, "Qwen3-MoE"), "d_ff": hf["moe_intermediate_size"]}
    return GptConfig(**fields, qkv_bias=bias, out_bias=bias, mlp_bias=False, qk_norm=True,
                     num_experts=hf.get("num_experts") or hf["num_local_experts"],
                     experts_per_token=hf["num_experts_per_tok"],
                     moe_norm_topk=bool(hf.get("norm_topk_prob", False)),
                     router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)))


def config_to_hf(cfg: GptConfig) -> dict:
    return {**llama.decoder_to_hf(cfg, "Qwen3MoeForCausalLM", "qwen3_moe"), "attention_bias": cfg.qkv_bias,
            "moe_intermediate_size": cfg.d_ff, "num_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.experts_per_token, "norm_topk_prob": cfg.moe_norm_topk,
            "router_aux_loss_coef": cfg.router_aux_loss_coef, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.num_layers,
            "output_router_logits": False}


def exports(model_cfg) -> bool:
    """Qwen3-MoE: positions=rope, norm=rmsnorm, mlp=swiglu, qk_norm on, no mlp_bias, qkv_bias == out_bias,
    num_experts > 0, sliding_window=0"""
    return mixtral.moe_decoder(model_cfg, qk_norm=True, biases=True) and model_cfg.sliding_window == 0
