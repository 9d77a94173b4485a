"""BART (`BartForConditionalGeneration`) <-> zoo encoder-decoder: config and weight mapping.

BART is post-LN with a LayerNorm on each stack's embedded input (`layernorm_embedding`), learned
positions with 2 extra leading rows (position p reads row p + 2), exact GELU, biases everywhere,
and its output tied to `shared`. `final_logits_bias` ([1, V], a buffer transformers never trains)
becomes model.logits_bias when it is non-zero; an all-zero one is dropped (exact) and written back
as zeros on export. Projections are torch Linears [out, in]; zoo keeps query/key/value [D, N, H],
attention output [N, H, D], MLP fc [D, F] and proj [F, D]. Import and export are both derived from
`key_table` (see zoo.hf.table). D width, N heads, H head dim, F MLP width, V vocab.
"""

from __future__ import annotations

import numpy as np

from zoo.models.encdec import EncDecConfig
from zoo.hf import base, seq2seq
from zoo.errors import ConversionError
from zoo.hf import table
from zoo.hf.io import Keys

TASK = "seq2seq"  # the zoo task a converted checkpoint trains as
ARCHITECTURES = ("BartForConditionalGeneration",)
PREFIXES = ("model.",)
IGNORED = ()
ACTIVATIONS = ("gelu", "relu")
ATTN = ("q_proj", "k_proj", "v_proj", "out_proj")


def config_from_hf(hf: dict, keys: Keys) -> EncDecConfig:
    act = hf.get("activation_function", "gelu")
    if act not in ACTIVATIONS:
        raise ConversionError(f"BART activation_function={act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    for enc, dec in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if hf.get(enc, 16) != hf.get(dec, 16):
            raise ConversionError(f"BART {enc}={hf.get(enc)} differs from {dec}={hf.get(dec)}; zoo uses one value "
                                  f"for both stacks")
    for flag in ("normalize_before", "add_final_layer_norm"):  # mBART-style variants saved under model_type bart
        if hf.get(flag):
            raise ConversionError(f"BART {flag}={hf[flag]!r} is not supported (zoo BART is post-LN without a "
                                  f"final norm)")
    _, share, tie = seq2seq.embeddings_from_hf(Keys(keys.tensors))  # a scratch Keys: nothing marked used here
    bias = keys.tensors.get("final_logits_bias")
    return EncDecConfig(
        vocab_size=hf["vocab_size"], max_len=hf["max_position_embeddings"], num_encoder_layers=hf["encoder_layers"],
        num_decoder_layers=hf["decoder_layers"], d_model=hf["d_model"], num_heads=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"], dropout=hf.get("dropout", 0.1), positions="learned", position_offset=2,
        embed_norm=True, activation=act, embed_scale=bool(hf.get("scale_embedding", False)),
        share_embeddings=share, tie_output=tie, logits_bias=bias is not None and bool(np.any(bias)))


def config_to_hf(cfg: EncDecConfig) -> dict:
    want = {"positions": "learned", "position_offset": 2, "norm": "layernorm", "pre_ln": False, "embed_norm": True,
            "use_bias": True, "attention_scale": True, "output_scale": False}
    for field, value in want.items():
        if getattr(cfg, field) != value:
            raise ConversionError(f"the run uses model.{field}={getattr(cfg, field)!r}; Hugging Face BART needs "
                                  f"model.{field}={value!r}")
    if cfg.activation not in ACTIVATIONS or cfg.head_dim * cfg.num_heads != cfg.d_model or cfg.ln_eps != 1e-5:
        raise ConversionError(f"the run uses model.activation={cfg.activation!r}, model.d_kv={cfg.d_kv}, "
                              f"model.ln_eps={cfg.ln_eps}; Hugging Face BART needs activation gelu or relu, "
                              f"d_kv 0 (d_model / num_heads) and ln_eps 1e-05")
    return {"architectures": ["BartForConditionalGeneration"], "model_type": "bart", "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_len, "encoder_layers": cfg.num_encoder_layers,
            "decoder_layers": cfg.num_decoder_layers, "d_model": cfg.d_model,
            "encoder_attention_heads": cfg.num_heads, "decoder_attention_heads": cfg.num_heads,
            "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff, "activation_function": cfg.activation,
            "dropout": cfg.dropout, "attention_dropout": 0.0, "activation_dropout": 0.0,
            "scale_embedding": cfg.embed_scale, "tie_word_embeddings": seq2seq.tied(cfg), "is_encoder_decoder": True,
            # zoo.infer.decoding forces no token: the export decodes in transformers as the run does in zoo
            "forced_eos_token_id": None, "forced_bos_token_id": None, "use_cache": True, "dtype": "float32"}


def seq2seq_framing(hf: dict, gen: dict) -> dict:
    """BART: source "<s> text </s>", labels "<s> text </s>", decoder start = </s> unless the config says otherwise."""
    bos, eos = seq2seq.token_id(hf, "bos_token_id", 0), seq2seq.token_id(hf, "eos_token_id", 2)
    start = seq2seq.token_id(gen, "decoder_start_token_id", seq2seq.token_id(hf, "decoder_start_token_id", eos))
    return seq2seq.framing(hf, gen, decoder_start=start, eos=eos, pad=seq2seq.token_id(hf, "pad_token_id", 1),
                           src_prefix=[bos], src_suffix=[eos], tgt_prefix=[bos])


run_fields = seq2seq.run_fields


def key_table(cfg: EncDecConfig) -> list:
    """The two-way key table of both stacks (names without the "model." wrapper). The embeddings
    (seq2seq.embeddings_*: tying is not one-to-one) and final_logits_bias are explicit code."""
    rows = []
    for stack, n in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
        block = [*table.attention("attn", "self_attn.", ATTN, bias=True), *table.ln("ln_attn", "self_attn_layer_norm"),
                 *table.linear("mlp/fc", "fc1"), *table.linear("mlp/proj", "fc2"),
                 *table.ln("ln_mlp", "final_layer_norm")]
        if stack == "decoder":
            block += [*table.attention("cross", "encoder_attn.", ATTN, bias=True),
                      *table.ln("ln_cross", "encoder_attn_layer_norm")]
        rows += table.under(stack, f"{stack}.", [
            ("position/embedding", "embed_positions.weight", table.SAME), *table.ln("ln_embed", "layernorm_embedding"),
            *table.layers(n, "layers_{i}", "layers.{i}.", block)])
    return rows


def params_from_hf(keys: Keys, cfg: EncDecConfig, task: str) -> dict:
    params, _, _ = seq2seq.embeddings_from_hf(keys)
    params.update(table.from_hf(keys, key_table(cfg), cfg))
    # Explicit: final_logits_bias [1, V] is read (marked used) always, kept only when non-zero.
    bias = keys.optional("final_logits_bias")
    if cfg.logits_bias:
        params["logits_bias"] = bias.reshape(-1)
    return params


def params_to_hf(params: dict, cfg: EncDecConfig) -> dict:
    out = seq2seq.embeddings_to_hf(params, cfg, prefix="model.")
    bias = params.get("logits_bias")  # none (an all-zero bias was dropped on import): written back as zeros
    out["final_logits_bias"] = (seq2seq.f32(bias) if bias is not None else
                                np.zeros(cfg.vocab_size, np.float32)).reshape(1, -1)
    return {**out, **table.to_hf(params, key_table(cfg), cfg, prefix="model.")}


def task_for(hf: dict, keys: Keys) -> str:
    return TASK


data_fields = base.no_data_fields


head_config = base.no_head_config


def exports(model_cfg) -> bool:
    """BART: learned positions (model.positions='learned')"""
    return model_cfg.positions == "learned"
