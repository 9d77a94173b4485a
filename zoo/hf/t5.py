"""T5 (`T5ForConditionalGeneration`: T5 v1.0, v1.1, flan-t5) <-> zoo encoder-decoder: config and weight mapping.

  v1.0:        feed_forward_proj "relu", lm_head tied to `shared`, decoder output scaled by d_model^-0.5
  v1.1 / flan: "gated-gelu" (tanh GELU gate, wi_0; linear, wi_1), its own lm_head, no output scale

Which of the two a checkpoint is comes from its weights and config: an `lm_head.weight` that differs
from `shared.weight` is untied; the output scale is config.json's `scale_decoder_outputs`
(transformers 5), else `tie_word_embeddings` (transformers 4: False meant untied and unscaled).

Hugging Face keeps the relative attention bias in layer 0 of each stack ([buckets, N]) and shares it
with the other layers; zoo computes one per stack (encoder.relative_bias, decoder.relative_bias):
the same table. Projections are torch Linears [out, in] without biases; zoo keeps query/key/value
[D, N, H], attention output [N, H, D], MLP fc/gate [D, F] and proj [F, D]; T5LayerNorm is RMSNorm.
"""

from __future__ import annotations

from zoo.config import EncDecConfig
from zoo.hf import seq2seq
from zoo.hf.io import ConversionError, Keys

ARCHITECTURES = ("T5ForConditionalGeneration",)
PREFIXES = ()
# Old checkpoints save a cross-attention relative bias that T5 never uses.
IGNORED = ("EncDecAttention.relative_attention_bias",)
CONFIG_FROM_WEIGHTS = True  # config_from_hf reads the weights too (is lm_head tied?)
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gated-gelu": "gated_gelu", "gated-gelu_new": "gated_gelu"}
ATTN = ("q", "k", "v", "o")
RELATIVE_BIAS = "SelfAttention.relative_attention_bias.weight"  # layer 0's, shared by the stack


def config_from_hf(hf: dict, keys: Keys) -> EncDecConfig:
    ff = hf.get("feed_forward_proj", "relu")
    if ff not in ACTIVATIONS:
        raise ConversionError(f"T5 feed_forward_proj={ff!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    if hf.get("is_decoder") or not hf.get("is_encoder_decoder", True):
        raise ConversionError("T5 as a bare decoder or encoder (is_decoder, is_encoder_decoder=False) is not supported")
    _, share, tie = seq2seq.embeddings_from_hf(Keys(keys.tensors))  # a scratch Keys: nothing marked used here
    scale = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True) is not False)
    return EncDecConfig(
        vocab_size=hf["vocab_size"], max_len=hf.get("n_positions", 512), num_encoder_layers=hf["num_layers"],
        num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"], d_model=hf["d_model"],
        num_heads=hf["num_heads"], d_kv=hf["d_kv"], d_ff=hf["d_ff"], dropout=hf.get("dropout_rate", 0.1),
        positions="relative", relative_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_max_distance=hf.get("relative_attention_max_distance", 128), norm="rmsnorm", pre_ln=True,
        ln_eps=hf.get("layer_norm_epsilon", 1e-6), activation=ACTIVATIONS[ff], use_bias=False,
        attention_scale=False, share_embeddings=share, tie_output=tie, output_scale=bool(scale))


def config_to_hf(cfg: EncDecConfig) -> dict:
    _check_exportable(cfg)
    ff = {"relu": "relu", "gelu": "gelu", "gated_gelu": "gated-gelu"}[cfg.activation]
    return {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "vocab_size": cfg.vocab_size,
            "d_model": cfg.d_model, "d_kv": cfg.head_dim, "d_ff": cfg.d_ff, "num_layers": cfg.num_encoder_layers,
            "num_decoder_layers": cfg.num_decoder_layers, "num_heads": cfg.num_heads,
            "relative_attention_num_buckets": cfg.relative_buckets,
            "relative_attention_max_distance": cfg.relative_max_distance, "dropout_rate": cfg.dropout,
            "layer_norm_epsilon": cfg.ln_eps, "feed_forward_proj": ff, "is_encoder_decoder": True,
            "n_positions": cfg.max_len, "tie_word_embeddings": seq2seq.tied(cfg),
            "scale_decoder_outputs": cfg.output_scale, "initializer_factor": 1.0, "use_cache": True,
            "dtype": "float32"}


def _check_exportable(cfg: EncDecConfig) -> None:
    want = {"positions": "relative", "norm": "rmsnorm", "pre_ln": True, "use_bias": False,
            "attention_scale": False, "embed_norm": False, "embed_scale": False, "logits_bias": False}
    for field, value in want.items():
        if getattr(cfg, field) != value:
            raise ConversionError(f"the run uses model.{field}={getattr(cfg, field)!r}; Hugging Face T5 needs "
                                  f"model.{field}={value!r}")


def seq2seq_framing(hf: dict, gen: dict) -> dict:
    """T5: source "text </s>", labels "text </s>", decoder start = <pad> (0) unless the config says otherwise."""
    pad, eos = seq2seq.token_id(hf, "pad_token_id", 0), seq2seq.token_id(hf, "eos_token_id", 1)
    start = seq2seq.token_id(gen, "decoder_start_token_id", seq2seq.token_id(hf, "decoder_start_token_id", pad))
    return seq2seq.framing(hf, gen, decoder_start=start, eos=eos, pad=pad, src_suffix=[eos])


def run_fields(cfg) -> dict:
    out = seq2seq.run_fields(cfg)
    out.pop("bos_token_id")
    return out


def _mlp_from_hf(keys: Keys, p: str, cfg: EncDecConfig) -> dict:
    if cfg.activation == "gated_gelu":
        return {"gate": {"kernel": keys[p + "wi_0.weight"].T}, "fc": {"kernel": keys[p + "wi_1.weight"].T},
                "proj": {"kernel": keys[p + "wo.weight"].T}}
    return {"fc": {"kernel": keys[p + "wi.weight"].T}, "proj": {"kernel": keys[p + "wo.weight"].T}}


def _stack_from_hf(keys: Keys, stack: str, cfg: EncDecConfig) -> dict:
    decoder = stack == "decoder"
    n = cfg.num_decoder_layers if decoder else cfg.num_encoder_layers
    rms = lambda name: {"scale": keys[f"{name}.weight"]}
    out = {"relative_bias": {"embedding": keys[f"{stack}.block.0.layer.0.{RELATIVE_BIAS}"]},
           "ln_final": rms(f"{stack}.final_layer_norm")}
    for i in range(n):
        p = f"{stack}.block.{i}.layer."
        block = {"attn": seq2seq.attention_from_hf(keys, p + "0.SelfAttention.", ATTN, cfg, bias=False),
                 "ln_attn": rms(p + "0.layer_norm")}
        if decoder:
            block["cross"] = seq2seq.attention_from_hf(keys, p + "1.EncDecAttention.", ATTN, cfg, bias=False)
            block["ln_cross"] = rms(p + "1.layer_norm")
        f = 2 if decoder else 1
        block["mlp"] = _mlp_from_hf(keys, f"{p}{f}.DenseReluDense.", cfg)
        block["ln_mlp"] = rms(f"{p}{f}.layer_norm")
        out[f"layers_{i}"] = block
    return out


def params_from_hf(keys: Keys, cfg: EncDecConfig) -> dict:
    params, _, _ = seq2seq.embeddings_from_hf(keys)
    params["encoder"] = _stack_from_hf(keys, "encoder", cfg)
    params["decoder"] = _stack_from_hf(keys, "decoder", cfg)
    return params


def params_to_hf(params: dict, cfg: EncDecConfig) -> dict:
    f32 = seq2seq.f32
    out = seq2seq.embeddings_to_hf(params, cfg)
    for stack in ("encoder", "decoder"):
        s, decoder = params[stack], stack == "decoder"
        out[f"{stack}.block.0.layer.0.{RELATIVE_BIAS}"] = f32(s["relative_bias"]["embedding"])
        out[f"{stack}.final_layer_norm.weight"] = f32(s["ln_final"]["scale"])
        for i in range(cfg.num_decoder_layers if decoder else cfg.num_encoder_layers):
            p, b = f"{stack}.block.{i}.layer.", s[f"layers_{i}"]
            out.update(seq2seq.attention_to_hf(b["attn"], p + "0.SelfAttention.", ATTN, bias=False))
            out[p + "0.layer_norm.weight"] = f32(b["ln_attn"]["scale"])
            if decoder:
                out.update(seq2seq.attention_to_hf(b["cross"], p + "1.EncDecAttention.", ATTN, bias=False))
                out[p + "1.layer_norm.weight"] = f32(b["ln_cross"]["scale"])
            f = f"{p}{2 if decoder else 1}."
            m = b["mlp"]
            if "gate" in m:
                out[f + "DenseReluDense.wi_0.weight"] = f32(m["gate"]["kernel"]).T
                out[f + "DenseReluDense.wi_1.weight"] = f32(m["fc"]["kernel"]).T
            else:
                out[f + "DenseReluDense.wi.weight"] = f32(m["fc"]["kernel"]).T
            out[f + "DenseReluDense.wo.weight"] = f32(m["proj"]["kernel"]).T
            out[f + "layer_norm.weight"] = f32(b["ln_mlp"]["scale"])
    return out
