"""What the T5 and BART converters share: embedding tying, the seq2seq framing, run ids.

Tying. Hugging Face keeps one `shared` embedding; `encoder.embed_tokens`, `decoder.embed_tokens` and
`lm_head` are tied to it unless a checkpoint saves them with other values (transformers 5 then
unties them on load; a BART with tie_word_embeddings False unties all three). Zoo keeps `embed`
(source), `target_embed` (when model.share_embeddings is False) and `lm_head` (when model.tie_output
is False), so every combination converts. Tying is not a one-to-one key mapping, so it is code
here rather than rows of the converters' key tables (zoo.hf.table). D width, V vocab.

Framing. A converted checkpoint frames sequences its own way (T5: "text </s>", decoder start =
<pad>; BART: "<s> text </s>", decoder start = </s>). `framing` writes it as the dict that
zoo.tasks.seq2seq_data.Framing reads (stored as seq2seq.json beside the run's tokenizer files), with
beam search in Hugging Face's style (length_penalty, early_stopping from the checkpoint).
"""

from __future__ import annotations

import numpy as np

from zoo.hf.io import Keys

# Decoding settings transformers applies that zoo.infer.decoding does not: reported at conversion when set.
UNSUPPORTED_GENERATION = {"forced_bos_token_id": None, "forced_eos_token_id": None, "no_repeat_ngram_size": 0,
                          "encoder_no_repeat_ngram_size": 0, "min_length": 0, "repetition_penalty": 1.0,
                          "bad_words_ids": None, "suppress_tokens": None, "begin_suppress_tokens": None}


def f32(x) -> np.ndarray:
    return np.asarray(x, np.float32)


def token_id(hf: dict, key: str, default: int) -> int:
    """An id from config.json; a list (several EOS ids) gives its first."""
    value = hf.get(key, default)
    value = value[0] if isinstance(value, list) and value else value
    return default if value is None else int(value)


def embeddings_from_hf(keys: Keys, head: str = "lm_head.weight") -> tuple[dict, bool, bool]:
    """(params with embed / target_embed / lm_head, share_embeddings, tie_output). The forward reads
    encoder.embed_tokens, decoder.embed_tokens and lm_head; each one a checkpoint leaves out is tied
    to `shared`."""
    shared = keys.optional("shared.weight")
    src = _first(keys.optional("encoder.embed_tokens.weight"), shared)
    if src is None:
        keys["shared.weight"]  # neither: report shared.weight missing
    tgt = _first(keys.optional("decoder.embed_tokens.weight"), shared, src)
    out = _first(keys.optional(head), shared, tgt)
    share, tie = np.array_equal(tgt, src), np.array_equal(out, tgt)
    params = {"embed": {"embedding": src}}
    if not share:
        params["target_embed"] = {"embedding": tgt}
    if not tie:
        params["lm_head"] = {"kernel": out.T}  # torch Linear [V, D] -> [D, V]
    return params, share, tie


def _first(*arrays):
    return next((a for a in arrays if a is not None), None)


def embeddings_to_hf(params: dict, cfg, prefix: str = "") -> dict:
    """shared.weight, plus what transformers would not tie back: with tie_word_embeddings False
    (`tied(cfg)` False) the encoder and decoder embeddings and lm_head are written out."""
    embed = f32(params["embed"]["embedding"])
    target = f32(params["target_embed"]["embedding"]) if "target_embed" in params else embed
    out = {prefix + "shared.weight": embed}
    if not tied(cfg):
        out[prefix + "encoder.embed_tokens.weight"] = embed
        out[prefix + "decoder.embed_tokens.weight"] = target
        out["lm_head.weight"] = target if cfg.tie_output else f32(params["lm_head"]["kernel"]).T
    return out


def tied(cfg) -> bool:
    """Whether one embedding serves as source, target and output (config.json tie_word_embeddings)."""
    return cfg.share_embeddings and cfg.tie_output


def framing(hf: dict, gen: dict, *, decoder_start: int, eos: int, pad: int, src_prefix=(), src_suffix=(),
            tgt_prefix=()) -> dict:
    """The seq2seq.json of a converted checkpoint (see zoo.tasks.seq2seq_data.Framing)."""
    setting = lambda k, default: gen.get(k, hf.get(k, default))
    return {"decoder_start": decoder_start, "eos": eos, "pad": pad, "src_prefix": list(src_prefix),
            "src_suffix": list(src_suffix), "tgt_prefix": list(tgt_prefix), "beam_style": "hf",
            "length_penalty": float(setting("length_penalty", 1.0)),
            "early_stopping": setting("early_stopping", False)}


def unsupported_generation(hf: dict, gen: dict) -> list[str]:
    """`key=value` of the checkpoint's decoding settings that zoo.infer.decoding does not apply."""
    found = []
    for k, neutral in UNSUPPORTED_GENERATION.items():
        v = gen.get(k, hf.get(k, neutral))
        if v not in (neutral, None, [], 0):
            found.append(f"{k}={v!r}")
    return found


def run_fields(cfg) -> dict:
    """config.json ids from the run's seq2seq framing (its tokenizer's seq2seq.json, else zoo's
    BOS/PAD after the vocabulary), and the beam-search settings of a run that decodes in HF style. An id the
    model has no row for (a checkpoint converted without its tokenizer, framed by zoo's bytes) is not written:
    transformers' defaults stand, as GPT-2's and Llama's exports leave such ids out."""
    from zoo.data.tokenizers import get_tokenizer
    from zoo.tasks.seq2seq_data import framing
    sp = framing(get_tokenizer(cfg.data.tokenizer))
    out = {"decoder_start_token_id": sp.decoder_start, "eos_token_id": sp.eos, "pad_token_id": sp.pad,
           "bos_token_id": sp.src_prefix[0] if sp.src_prefix else None}
    out = {k: v for k, v in out.items() if v is None or v < cfg.model.vocab_size}
    if sp.beam_style == "hf":
        out.update(length_penalty=sp.length_penalty, early_stopping=sp.early_stopping)
    return out
