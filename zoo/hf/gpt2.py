"""GPT-2 (`GPT2LMHeadModel`, `GPT2Model`) <-> zoo GPT: config and weight mapping.

HF GPT-2 stores attention as a fused Conv1D `c_attn` [D, 3D] (input-major); zoo keeps separate
query/key/value kernels [D, N, H] and an output kernel [N, H, D]. The LM head is tied to `wte`.
"""

from __future__ import annotations

import numpy as np

from zoo.config import GptConfig
from zoo.hf.io import ConversionError, Keys

ARCHITECTURES = ("GPT2LMHeadModel", "GPT2Model")
PREFIXES = ("transformer.",)
IGNORED = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers in old checkpoints


def config_from_hf(hf: dict) -> GptConfig:
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
            "bos_token_id": 50256, "eos_token_id": 50256, "tie_word_embeddings": True, "dtype": "float32"}


def _ln(keys, name):
    return {"scale": keys[f"{name}.weight"], "bias": keys[f"{name}.bias"]}


def params_from_hf(keys: Keys, cfg: GptConfig) -> dict:
    D, N, H = cfg.d_model, cfg.num_heads, cfg.head_dim
    params = {"wte": {"embedding": keys["wte.weight"]}, "wpe": keys["wpe.weight"], "ln_f": _ln(keys, "ln_f")}
    for i in range(cfg.num_layers):
        p = f"h.{i}."
        w, b = keys[p + "attn.c_attn.weight"], keys[p + "attn.c_attn.bias"]  # [D, 3D], [3D]
        attn = {name: {"kernel": w[:, j * D:(j + 1) * D].reshape(D, N, H), "bias": b[j * D:(j + 1) * D].reshape(N, H)}
                for j, name in enumerate(("query", "key", "value"))}
        attn["out"] = {"kernel": keys[p + "attn.c_proj.weight"].reshape(N, H, D), "bias": keys[p + "attn.c_proj.bias"]}
        params[f"h_{i}"] = {
            "ln_1": _ln(keys, p + "ln_1"), "attn": attn, "ln_2": _ln(keys, p + "ln_2"),
            "mlp": {"fc": {"kernel": keys[p + "mlp.c_fc.weight"], "bias": keys[p + "mlp.c_fc.bias"]},
                    "proj": {"kernel": keys[p + "mlp.c_proj.weight"], "bias": keys[p + "mlp.c_proj.bias"]}}}
    if "lm_head.weight" in keys and not np.array_equal(keys["lm_head.weight"], params["wte"]["embedding"]):
        raise ConversionError("lm_head.weight differs from wte.weight: untied GPT-2 heads are not supported")
    return params


def params_to_hf(params: dict, cfg: GptConfig) -> dict:
    D = cfg.d_model
    a = lambda x: np.asarray(x, np.float32)
    out = {"transformer.wte.weight": a(params["wte"]["embedding"]), "transformer.wpe.weight": a(params["wpe"]),
           "transformer.ln_f.weight": a(params["ln_f"]["scale"]), "transformer.ln_f.bias": a(params["ln_f"]["bias"])}
    for i in range(cfg.num_layers):
        p, h = f"transformer.h.{i}.", params[f"h_{i}"]
        at = h["attn"]
        out[p + "attn.c_attn.weight"] = np.concatenate([a(at[n]["kernel"]).reshape(D, D) for n in ("query", "key", "value")], 1)
        out[p + "attn.c_attn.bias"] = np.concatenate([a(at[n]["bias"]).reshape(D) for n in ("query", "key", "value")])
        out[p + "attn.c_proj.weight"] = a(at["out"]["kernel"]).reshape(D, D)
        out[p + "attn.c_proj.bias"] = a(at["out"]["bias"])
        for ln in ("ln_1", "ln_2"):
            out[p + ln + ".weight"], out[p + ln + ".bias"] = a(h[ln]["scale"]), a(h[ln]["bias"])
        for hf_name, zoo_name in (("c_fc", "fc"), ("c_proj", "proj")):
            out[p + f"mlp.{hf_name}.weight"] = a(h["mlp"][zoo_name]["kernel"])
            out[p + f"mlp.{hf_name}.bias"] = a(h["mlp"][zoo_name]["bias"])
    return out
