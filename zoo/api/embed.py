"""Sentence embeddings: `Pretrained.embed(texts)` and `zoo-embed FILE`, for BERT-family encoders and decoders.

An encoder's texts are framed as one segment ([CLS] text [SEP]), cut to the checkpoint's `max_seq_length`
(sentence-transformers' sentence_bert_config.json; else the model's positions), as `SentenceTransformer.encode`
cuts them, and pooled over the last hidden states as the checkpoint's `1_Pooling/config.json` says: the mean over
the real tokens (all-MiniLM-L6-v2's), [CLS], the max, or the mean times sqrt(length); L2-normalised when its
`modules.json` lists a Normalize module. A decoder's embedding is its last token's final hidden state (Qwen3-
Embedding's and other decoder embedders' pooling), the text embedded as given (no token appended). A
checkpoint without sentence-transformers files pools as its family does by default (encoders: mean, decoders: last
token) and is not normalised unless asked (`normalize=True`).

`dimensions` keeps each vector's first components, normalised again when the checkpoint normalises: a Matryoshka-
trained model's shorter embedding, as `SentenceTransformer.encode(truncate_dim=..., normalize_embeddings=True)` and
OpenAI's `dimensions` give it (`matryoshka` says which widths the checkpoint declares; zoo-serve takes those only).

`prompt` puts a string before every text; `prompt_name` takes one from the checkpoint's
config_sentence_transformers.json "prompts" (e.g. Qwen3-Embedding's "query": "Instruct: ...\\nQuery:"), as
`encode(prompt_name=...)` does. Texts run in jitted batches sorted by length, cut where a text is half its batch's
longest, and padded to bucketed shapes (zoo.infer.encoder), so a text's vector does not depend on the texts beside
it and any number of texts compiles a few dozen programs at most; a progress bar goes to stderr for PROGRESS_AT texts
or more.
"""

from __future__ import annotations

import functools
import os


import jax.numpy as jnp
import numpy as np

from zoo.errors import ArgumentError, FamilyError
from zoo.infer.encoder import jitted
from zoo.tasks.embed import Pooling, pool_hidden, st_pooling, unit

PROGRESS_AT = 1024  # texts from which a progress bar is shown


def checkpoint_dir(lm) -> str | None:
    """The directory whose sentence-transformers files describe `lm`'s pooling: the run it came from (a fine-tune
    keeps them), else the Hugging Face directory loaded."""
    for d in (lm.run_dir, lm.source):
        if d and os.path.isdir(d) and os.path.isfile(os.path.join(d, "modules.json")):
            return d
    return None


def pooling_of(lm) -> Pooling:
    """`lm`'s pooling: its sentence-transformers files where it has them, else its family's default (read as
    task=embed reads them, with a decoder's last token besides)."""
    default = "mean" if lm.config.model.family == "bert" else "last"
    return st_pooling(checkpoint_dir(lm), lm.model.cfg.max_len, default)


def matryoshka(lm) -> tuple[int, ...] | None:
    """The widths `lm` was trained to be cut to, as its config.json declares them (vLLM's convention:
    "matryoshka_dimensions", a list; "is_matryoshka": true, any width); None when it declares none."""
    import json
    d = checkpoint_dir(lm) or (lm.source if lm.source and os.path.isdir(lm.source) else None)
    path = os.path.join(d, "config.json") if d else None
    if not path or not os.path.isfile(path):
        return None
    with open(path) as f:
        cfg = json.load(f)
    if isinstance(cfg.get("matryoshka_dimensions"), list):
        return tuple(int(x) for x in cfg["matryoshka_dimensions"])
    return tuple(range(1, lm.model.cfg.d_model + 1)) if cfg.get("is_matryoshka") else None


def truncate(vectors: np.ndarray, dimensions: int, normalize: bool) -> np.ndarray:
    """Each vector's first `dimensions` components, unit length again when `normalize`."""
    out = vectors[..., :dimensions]
    return np.asarray(unit(jnp.asarray(out))) if normalize else out


def _rows(lm, texts: list[str], pool: Pooling) -> list[list[int]]:
    """Token ids of each text as the model reads it: an encoder's [CLS] text [SEP], cut to pool.max_len."""
    return _framed(lm, lm.tokenizer.encode_batch(texts), pool)


def _framed(lm, ids: list[list[int]], pool: Pooling) -> list[list[int]]:
    if lm.config.model.family != "bert":
        return [x[:pool.max_len] for x in ids]
    from zoo.tasks.mlm import bert_specials
    sp = bert_specials(lm.tokenizer)
    return [[sp.cls, *x[:pool.max_len - 2], sp.sep] for x in ids]


@functools.partial(jitted, static_argnames=("model", "mode", "normalize", "decoder"))
def _pool(params, ids_BT, valid_BT, *, model, mode: str, normalize: bool, decoder: bool):
    """float32[B, D]: each row's pooled (and, with `normalize`, unit-length) last hidden states."""
    if decoder:
        h_BTD = model.apply({"params": params}, ids_BT, hidden=True)
    else:
        from zoo.models.bert import Bert
        h_BTD = Bert(model.cfg).apply({"params": params["bert"]}, ids_BT, jnp.zeros_like(ids_BT), valid_BT, True)
    e_BD = pool_hidden(h_BTD, valid_BT, mode)
    return unit(e_BD) if normalize else e_BD


def embed(lm, texts, *, batch_size: int = 32, normalize: bool | None = None, prompt: str | None = None,
          prompt_name: str | None = None, progress: bool | None = None, dimensions: int | None = None) -> np.ndarray:
    """See Pretrained.embed."""
    from zoo.api.decoder import texts_of
    items, single = texts_of(texts, "texts")
    if batch_size < 1:
        raise ArgumentError(f"batch_size={batch_size} must be >= 1")
    if lm.config.task not in ("bert_encoder", "bert_mlm", "bert_cls", "bert_tokens", "embed") and \
            lm.config.model.family == "bert":
        raise FamilyError(f".embed needs an encoder or a decoder; {lm.source!r} is a {lm.config.task} model")
    if lm.config.model.family not in ("bert", "gpt"):
        raise FamilyError(f".embed takes BERT-family encoders and decoders; {lm.source!r} is a "
                          f"{lm.config.model.family} model, which offers {', '.join(lm.offers())}")
    width = lm.model.cfg.d_model
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                   or not 1 <= dimensions <= width):
        raise ArgumentError(f"dimensions={dimensions!r} must be an int from 1 to the model's width, {width}")
    pool = pooling_of(lm)
    prompts = dict(pool.prompts)
    if prompt_name is not None:
        if prompt is not None:
            raise ArgumentError("give prompt or prompt_name, not both")
        if prompt_name not in prompts:
            raise ArgumentError(f"prompt_name={prompt_name!r}: {lm.source!r} names "
                                f"{', '.join(map(repr, prompts)) or 'no prompts'} (config_sentence_transformers.json)")
        prompt = prompts[prompt_name]
    if prompt:
        items = [prompt + t for t in items]
    rows = _rows(lm, items, pool)
    for i, r in enumerate(rows):
        if len(r) == 0:
            raise ArgumentError(f"text {i} is empty")
    out = _embed_rows(lm, rows, pool, batch_size, pool.normalize if normalize is None else bool(normalize),
                      progress or (progress is None and len(rows) >= PROGRESS_AT), dimensions)
    return out[0] if single else out


def embed_ids(lm, ids: list[list[int]], *, batch_size: int = 32) -> np.ndarray:
    """float32[N, D]: the vectors of texts given as the model's token ids (no special tokens: what
    `lm.tokenizer.encode` gives), framed and cut as `embed` frames a text, so equal to `embed` of that text."""
    width, vocab = lm.model.cfg.d_model, lm.model.cfg.vocab_size
    for i, x in enumerate(ids):
        if not x or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in x):
            raise ArgumentError(f"token ids {i} must be a non-empty list of ids from 0 to {vocab - 1}")
    pool = pooling_of(lm)
    return _embed_rows(lm, _framed(lm, ids, pool), pool, batch_size, pool.normalize, False, width)


def _embed_rows(lm, rows: list[list[int]], pool: Pooling, batch_size: int, norm: bool, progress: bool,
                dimensions: int | None) -> np.ndarray:
    """float32[N, D] of the framed rows, in length-sorted jitted batches of bucketed shapes."""
    from zoo.infer.encoder import bucket, length_batches, length_bucket
    width = lm.model.cfg.d_model
    decoder = lm.config.model.family != "bert"
    pad = 0
    if not decoder:
        from zoo.tasks.mlm import bert_specials
        pad = bert_specials(lm.tokenizer).pad
    out = np.zeros((len(rows), lm.model.cfg.d_model), np.float32)
    groups = length_batches([len(r) for r in rows], batch_size)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(rows), desc="embedding", unit="texts")
    for idx in groups:
        B = bucket(len(idx), batch_size)
        T = length_bucket(max(len(rows[i]) for i in idx), pool.max_len)
        ids_BT = np.full((B, T), pad, np.int32)
        valid_BT = np.zeros((B, T), bool)
        for b, i in enumerate(list(idx) + [idx[0]] * (B - len(idx))):
            ids_BT[b, :len(rows[i])] = rows[i]
            valid_BT[b, :len(rows[i])] = True
        e_BD = np.asarray(_pool(lm.params, ids_BT, valid_BT, model=lm.model, mode=pool.mode, normalize=norm,
                                decoder=decoder))
        out[np.asarray(idx)] = e_BD[:len(idx)]
        if bar is not None:
            bar.update(len(idx))
    if bar is not None:
        bar.close()
    if dimensions is not None and dimensions < width:
        out = truncate(out, dimensions, norm)
    return out
