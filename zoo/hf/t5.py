"""T5 (`T5ForConditionalGeneration`: T5 v1.0, v1.1, flan-t5; `MT5ForConditionalGeneration`, model_type
mt5) <-> zoo encoder-decoder: config and weight mapping.

  v1.0:        feed_forward_proj "relu", lm_head tied to `shared`, decoder output scaled by d_model^-0.5
  v1.1 / flan: "gated-gelu" (tanh GELU gate, wi_0; linear, wi_1), its own lm_head, no output scale
  mT5:         v1.1 with T5's key names; transformers 5 never scales its decoder output, and saves
               tie_word_embeddings true whatever the weights (the released ones have their own lm_head)

Which of the two a checkpoint is comes from its weights and config: an `lm_head.weight` that differs
from `shared.weight` is untied; the output scale is config.json's `scale_decoder_outputs`
(transformers 5), else `tie_word_embeddings` (transformers 4: False meant untied and unscaled), never
for mT5. An mT5 converts to the same zoo model a T5 v1.1 does, so a zoo model exports as T5.

Hugging Face keeps the relative attention bias in layer 0 of each stack ([buckets, N]) and shares it
with the other layers; zoo computes one per stack (encoder.relative_bias, decoder.relative_bias):
the same table. Projections are torch Linears [out, in] without biases; zoo keeps query/key/value
[D, N, H], attention output [N, H, D], MLP fc/gate [D, F] and proj [F, D]; T5LayerNorm is RMSNorm.
Import and export are both derived from `key_table` (see zoo.hf.table). D width, N heads, H head
dim (d_kv), F MLP width, V vocab.
"""

from __future__ import annotations

from zoo.models.encdec import EncDecConfig
from zoo.hf import base, seq2seq
from zoo.errors import ConversionError
from zoo.hf import table
from zoo.hf.io import Keys

TASK = "seq2seq"  # the zoo task a converted checkpoint trains as
ARCHITECTURES = ("T5ForConditionalGeneration", "MT5ForConditionalGeneration")
PREFIXES = ()
# Old checkpoints save a cross-attention relative bias that T5 never uses.
IGNORED = ("EncDecAttention.relative_attention_bias",)
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
    scale = hf.get("model_type") != "mt5" and hf.get("scale_decoder_outputs",
                                                    hf.get("tie_word_embeddings", True) is not False)
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


def key_table(cfg: EncDecConfig) -> list:
    """The two-way key table of both stacks (the embeddings are seq2seq.embeddings_*: their tying is
    not a one-to-one mapping). Each stack's relative bias is layer 0's, a plain row here."""
    ff = [*table.linear("gate", "wi_0", bias=False), *table.linear("fc", "wi_1", bias=False)] \
        if cfg.activation == "gated_gelu" else table.linear("fc", "wi", bias=False)
    ff = [*ff, *table.linear("proj", "wo", bias=False)]
    rows = []
    for stack, n in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
        block = [*table.attention("attn", "0.SelfAttention.", ATTN, bias=False), *table.rms("ln_attn", "0.layer_norm")]
        if stack == "decoder":
            block += [*table.attention("cross", "1.EncDecAttention.", ATTN, bias=False),
                      *table.rms("ln_cross", "1.layer_norm")]
        f = 2 if stack == "decoder" else 1  # the MLP sub-layer's index: after the cross attention
        block += [*table.under("mlp", f"{f}.DenseReluDense.", ff), *table.rms("ln_mlp", f"{f}.layer_norm")]
        rows += table.under(stack, f"{stack}.", [
            ("relative_bias/embedding", f"block.0.layer.0.{RELATIVE_BIAS}", table.SAME),
            *table.rms("ln_final", "final_layer_norm"), *table.layers(n, "layers_{i}", "block.{i}.layer.", block)])
    return rows


def params_from_hf(keys: Keys, cfg: EncDecConfig, task: str) -> dict:
    params, _, _ = seq2seq.embeddings_from_hf(keys)
    return {**params, **table.from_hf(keys, key_table(cfg), cfg)}


def params_to_hf(params: dict, cfg: EncDecConfig) -> dict:
    return {**seq2seq.embeddings_to_hf(params, cfg), **table.to_hf(params, key_table(cfg), cfg)}


def task_for(hf: dict, keys: Keys) -> str:
    return TASK


data_fields = base.no_data_fields


head_config = base.no_head_config


def exports(model_cfg) -> bool:
    """T5: relative positions (model.positions='relative')"""
    return model_cfg.positions == "relative"
