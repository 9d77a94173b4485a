"""A BERT-family encoder written as a sentence-transformers folder (Pretrained.save(format="sentence-transformers")):
the transformers directory at its root (zoo.hf.convert.export: config.json, model.safetensors, tokenizer files, a
bare BertModel), then modules.json, 1_Pooling/config.json, 2_Normalize/ when the model normalises and
sentence_bert_config.json (max_seq_length), written by zoo.tasks.embed.write_st_files as a task=embed run keeps
them, plus config_sentence_transformers.json with the model's named prompts. `SentenceTransformer(OUT)` encodes
as Pretrained.embed does, and zoo.load(OUT) reads the pooling back from the same files.

The pooling is the model's own (zoo.api.embed.pooling_of: its run's or source's sentence-transformers files, else
mean, unnormalised). A BertModel holds a pooler (tanh over a dense of [CLS]) that no sentence-transformers pooling
reads; a model without one (a task=embed run's bare encoder) gets a zero pooler so transformers loads the folder
without newly initialised weights."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np

from zoo.errors import ArgumentError, ConversionError

FORMAT = "sentence-transformers"
ENCODERS = ("bert_encoder", "bert_mlm", "bert_cls", "bert_tokens", "embed")  # tasks whose model is a BERT encoder


def check(cfg, source: str) -> None:
    """A one-line refusal unless the model of run config `cfg` is a BERT-family encoder."""
    if cfg.model.family != "bert" or cfg.task not in ENCODERS:
        raise ArgumentError(f"format={FORMAT!r} writes a BERT-family encoder; {source!r} is a {cfg.model.family} "
                            f"{cfg.task} model: save it with format='zoo' or 'hf'")


def encoder_params(params) -> dict:
    """The bare BertModel's tree of any BERT task's params: the encoder and its pooler (zeros where none)."""
    params = jax.device_get(params)
    pooler = (params.get("cls_head") or {}).get("pooler")
    if pooler is None:
        D = np.shape(params["bert"]["embed"]["word"]["embedding"])[-1]
        pooler = {"kernel": np.zeros((D, D), np.float32), "bias": np.zeros((D,), np.float32)}
    return {"bert": params["bert"], "cls_head": {"pooler": pooler}}


def to_st(cfg, params, out_dir: str, pool, *, run_dir: str | None = None, what: str = "",
          verbose: bool = True) -> list[str]:
    """Write the encoder (run config `cfg`, `params`) pooled as `pool` (zoo.tasks.embed.Pooling) as a
    sentence-transformers folder into the new or empty `out_dir`; returns the files written beside the
    transformers directory."""
    from zoo.hf.convert import export
    from zoo.tasks.embed import write_st_files
    check(cfg, what)
    export(dataclasses.replace(cfg, task="bert_encoder"), encoder_params(params), out_dir, run_dir=run_dir,
           what=what, verbose=False)
    try:
        write_st_files(out_dir, pool, cfg.model.d_model)
        with open(os.path.join(out_dir, "config_sentence_transformers.json"), "w") as f:
            json.dump({"prompts": dict(pool.prompts), "default_prompt_name": None, "similarity_fn_name": "cosine"},
                      f, indent=2)
    except OSError as e:
        raise ConversionError(f"cannot write {out_dir!r}: {e.strerror or e}") from None
    written = ["modules.json", "1_Pooling/config.json", *(["2_Normalize/"] if pool.normalize else []),
               "sentence_bert_config.json", "config_sentence_transformers.json"]
    if verbose:
        print(f"wrote {out_dir}: a transformers BertModel and {', '.join(written)} ({pool.mode} pooling"
              f"{', normalised' if pool.normalize else ''}, max_seq_length {pool.max_len}) of {what or 'the model'}; "
              f"load it with sentence_transformers.SentenceTransformer({out_dir!r}) or zoo.load({out_dir!r})")
    return written
