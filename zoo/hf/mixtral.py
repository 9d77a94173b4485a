"""Mixtral (`MixtralForCausalLM`, `MixtralModel`) <-> zoo GPT with a mixture of experts (zoo.nn.moe): Mistral's
decoder (zoo.hf.llama's rows for attention, norms and embeddings) whose MLP is `num_local_experts` SwiGLU
experts, each token routed to its `num_experts_per_tok` most probable, renormalised (zoo's num_experts,
experts_per_token, moe_norm_topk on).

Checkpoints keep each expert a set of torch Linears, as transformers 5 still saves them (it fuses them in
memory only): block_sparse_moe.gate [E, D] (zoo `mlp/router` [D, E]), experts.{e}.w1 [F, D] (gate), w3
[F, D] (up: zoo `fc`) and w2 [D, F] (down: zoo `proj`); zoo stacks the experts' kernels [E, D, F] and
[E, F, D]. The key table names each expert's kernel under a per-expert path (`mlp/experts_{e}/gate`),
which import stacks and export splits. `router_jitter_noise` (a training-time perturbation) is not
modelled: it does not change the forward pass that conversion preserves.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from zoo.hf import llama, table
from zoo.hf.io import Keys
from zoo.models.gpt import GptConfig

ARCHITECTURES = ("MixtralForCausalLM", "MixtralModel")
PREFIXES, IGNORED = llama.PREFIXES, llama.IGNORED
task_for, data_fields, seq2seq_framing = llama.task_for, llama.data_fields, llama.seq2seq_framing
head_config, run_fields = llama.head_config, llama.run_fields
EXPERTS = (("gate", "w1"), ("fc", "w3"), ("proj", "w2"))  # zoo kernel -> Mixtral's Linear in each expert


# ---- shared with qwen3_moe: the MoE rows under other names ------------------------------------------
def moe_key_table(cfg: GptConfig, router: str, expert: str, names: tuple) -> list:
    """llama's rows but the MLP's, then per layer the router (HF name `router`) and each expert's three
    Linears (`expert` a template of {e}; `names` pairs zoo's kernel with HF's Linear)."""
    moe = [*table.linear("mlp/router", router, bias=False)]
    for e in range(cfg.num_experts):
        moe += [row for z, h in names for row in table.linear(f"mlp/experts_{e}/{z}", expert.format(e=e) + h,
                                                              bias=False)]
    rows = [r for r in llama.key_table(cfg) if "/mlp/" not in r[0]]
    return rows + table.layers(cfg.num_layers, "h_{i}", "layers.{i}.", moe)


def stacked_from_hf(keys: Keys, cfg: GptConfig, rows: list, names: tuple) -> dict:
    """The zoo tree of `rows`, each layer's experts_{e}/{gate,fc,proj}/kernel stacked into {gate,fc,proj} [E, ...]."""
    if cfg.tie_embeddings:
        keys.optional(llama.LM_HEAD)
    params = table.from_hf(keys, rows, cfg)
    for i in range(cfg.num_layers):
        mlp = params[f"h_{i}"]["mlp"]
        experts = [mlp.pop(f"experts_{e}") for e in range(cfg.num_experts)]
        mlp.update({z: np.stack([x[z]["kernel"] for x in experts]) for z, _ in names})
        mlp["router"] = mlp["router"]["kernel"]
    return params


def split_to_hf(params: dict, cfg: GptConfig, rows: list, names: tuple) -> dict:
    """The inverse of stacked_from_hf: each expert's kernels under its own path, then the rows' tensors."""
    split = dict(params)
    for i in range(cfg.num_layers):
        mlp = params[f"h_{i}"]["mlp"]
        per_expert = {f"experts_{e}": {z: {"kernel": np.asarray(mlp[z])[e]} for z, _ in names}
                      for e in range(cfg.num_experts)}
        split[f"h_{i}"] = {**params[f"h_{i}"], "mlp": {"router": {"kernel": mlp["router"]}, **per_expert}}
    return table.to_hf(split, rows, cfg, prefix="model.", outside=("lm_head.",))


def moe_decoder(cfg, qk_norm: bool, biases: bool = False) -> bool:
    """Llama's decoder parts (zoo.hf.llama.decoder) with experts; no MLP biases, and attention biases only
    where `biases` (then on q/k/v and o alike)."""
    attn = cfg.qkv_bias == cfg.out_bias if biases else not (cfg.qkv_bias or cfg.out_bias)
    return cfg.num_experts > 0 and llama.decoder(dataclasses.replace(cfg, num_experts=0), qk_norm) and attn and \
        not cfg.mlp_bias


# ---- Mixtral itself -----------------------------------------------------------------------------------
def key_table(cfg: GptConfig) -> list:
    return moe_key_table(cfg, "block_sparse_moe.gate", "block_sparse_moe.experts.{e}.", EXPERTS)


def params_from_hf(keys: Keys, cfg: GptConfig, task: str) -> dict:
    return stacked_from_hf(keys, cfg, key_table(cfg), EXPERTS)


def params_to_hf(params: dict, cfg: GptConfig) -> dict:
    return split_to_hf(params, cfg, key_table(cfg), EXPERTS)


def config_from_hf(hf: dict, keys: Keys) -> GptConfig:
    return GptConfig(**llama.decoder_fields(hf, keys, "Mixtral"), qkv_bias=False, out_bias=False, mlp_bias=False,
                     sliding_window=hf.get("sliding_window") or 0, num_experts=hf["num_local_experts"],
                     experts_per_token=hf["num_experts_per_tok"], moe_norm_topk=True,
                     router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)))


def config_to_hf(cfg: GptConfig) -> dict:
    return {**llama.decoder_to_hf(cfg, "MixtralForCausalLM", "mixtral"), "sliding_window": cfg.sliding_window or None,
            "num_local_experts": cfg.num_experts, "num_experts_per_tok": cfg.experts_per_token,
            "router_aux_loss_coef": cfg.router_aux_loss_coef, "router_jitter_noise": 0.0, "output_router_logits": False}


def exports(model_cfg) -> bool:
    """Mixtral: positions=rope, norm=rmsnorm, mlp=swiglu, no biases, qk_norm off, num_experts > 0, moe_norm_topk on"""
    return moe_decoder(model_cfg, qk_norm=False) and model_cfg.moe_norm_topk
