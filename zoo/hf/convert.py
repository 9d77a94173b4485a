"""Conversion machinery: a Hugging Face checkpoint directory -> a zoo run, a zoo run -> a directory
transformers loads, and in-memory loading of either. Which converter serves a checkpoint comes from
the FAMILIES registry (zoo.models: each family names its HF model types and converter modules); each
converter module is one architecture's two-way key table (zoo.hf.table) and satisfies the Converter
protocol (zoo.hf.base), so every member is called unconditionally.
"""

from __future__ import annotations

import importlib
import json
import os

import flax.linen as nn
import jax
import numpy as np

from zoo.data.hf_tokenizers import SEQ2SEQ_FILE, save_dir
from zoo.errors import ConversionError
from zoo.hf import io, seq2seq
from zoo.hf.base import Converter, check
from zoo.models import FAMILIES


def converters() -> dict[str, Converter]:
    """HF model_type -> converter module, from the FAMILIES registry."""
    return {t: check(importlib.import_module(ref)) for f in FAMILIES.values() for t, ref in f.hf.items()}


def export_converter(model_cfg) -> Converter:
    """The converter a zoo model exports with: the first of its family's that `exports` it (an
    encoder-decoder: relative positions -> T5, learned -> BART)."""
    mods = [check(importlib.import_module(ref)) for ref in FAMILIES[model_cfg.family].hf.values()]
    for mod in mods:
        if mod.exports(model_cfg):
            return mod
    raise ConversionError(f"this {model_cfg.family} model has no Hugging Face equivalent; it exports as "
                          + " or as ".join(m.exports.__doc__ for m in mods))


def supported() -> str:
    return ", ".join(a for m in converters().values() for a in m.ARCHITECTURES)


def _converter(hf_cfg: dict) -> Converter:
    """The converter of a checkpoint's config.json."""
    model_type, archs = hf_cfg.get("model_type"), hf_cfg.get("architectures") or []
    convs = converters()
    # A known model_type with an unknown head (BertForTokenClassification) is refused too.
    if model_type not in convs or (archs and not set(archs) & set(convs[model_type].ARCHITECTURES)):
        raise ConversionError(f"unsupported architecture {', '.join(archs or ['?'])} (model_type={model_type!r}); "
                              f"supported: {supported()}")
    return convs[model_type]


def _load(src: str, hf_cfg: dict):
    """(converter, task, model config, params, keys) of a Hugging Face checkpoint directory."""
    conv = _converter(hf_cfg)
    keys = io.Keys(io.read_tensors(src), conv.PREFIXES)
    model_cfg = conv.config_from_hf(hf_cfg, keys)
    task = conv.task_for(hf_cfg, keys)  # fixed, or read off the head (BERT: bare encoder, MLM, classifier)
    return conv, task, model_cfg, conv.params_from_hf(keys, model_cfg, task), keys


def _run_config(model_cfg, task: str, tokenizer_dir: str | None, **data_fields):
    from zoo.config import Config, DataConfig
    data = DataConfig(tokenizer=tokenizer_dir or "bytes", seq_len=min(model_cfg.max_len, 1024), **data_fields)
    return Config(task=task, model=model_cfg, data=data)


def from_hf(path_or_id: str, run_dir: str, *, verbose: bool = True) -> dict:
    """Convert; returns a report with the unused keys. The weights are checked against the zoo
    model's own parameter tree (every key, every shape) before anything is written."""
    from zoo import tasks
    from zoo.train import checkpoint
    src = io.resolve(path_or_id)
    hf_cfg = io.read_config(src)
    conv, task_name, model_cfg, params, keys = _load(src, hf_cfg)
    tok_dir = os.path.join(os.path.abspath(run_dir), "tokenizer")
    copied = save_dir(src, tok_dir)
    gen = io.read_generation_config(src)
    framing = conv.seq2seq_framing(hf_cfg, gen)  # None: not a seq2seq model
    if copied and framing is not None:  # the checkpoint's own framing travels with its tokenizer
        with open(os.path.join(tok_dir, SEQ2SEQ_FILE), "w") as f:
            json.dump(framing, f, indent=2)
    cfg = _run_config(model_cfg, task_name, tok_dir if copied else None, **conv.data_fields(hf_cfg, task_name))
    expected = jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0))
    _check_tree(params, nn.unbox(expected))
    if checkpoint.latest_step(run_dir) is not None:
        raise ConversionError(f"{run_dir!r} already holds checkpoints; choose a new directory")
    checkpoint.save_weights(run_dir, params, cfg)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        f.write(cfg.to_json())
    unused = keys.unused(conv.IGNORED)
    if verbose:
        n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
        print(f"converted {', '.join(hf_cfg.get('architectures') or [hf_cfg['model_type']])} from {src}: "
              f"{n:,} params -> {run_dir}" + (f"; unused keys: {', '.join(unused)}" if unused else ""))
        if framing is not None:
            skipped = seq2seq.unsupported_generation(hf_cfg, gen)
            if skipped:
                print(f"note: zoo.infer.decoding does not apply the checkpoint's {', '.join(skipped)}")
            if not copied:
                print("note: the checkpoint has no tokenizer files; the run uses data.tokenizer=bytes and zoo's "
                      "own seq2seq framing")
    return {"config": cfg, "unused": unused, "params": params}


def _check_tree(params, expected) -> None:
    got = {jax.tree_util.keystr(p): np.shape(v) for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    want = {jax.tree_util.keystr(p): tuple(v.shape) for p, v in jax.tree_util.tree_flatten_with_path(expected)[0]}
    missing = sorted(set(want) - set(got))
    if missing:
        raise ConversionError(f"the checkpoint leaves zoo params unset: {', '.join(missing)}")
    for k, shape in want.items():
        if tuple(got[k]) != shape:
            raise ConversionError(f"param {k}: checkpoint gives shape {got[k]}, the zoo model needs {shape}")


def to_hf(run_dir: str, out_dir: str, *, verbose: bool = True) -> dict:
    """Export the latest checkpoint of a zoo run as a transformers directory."""
    from zoo.train import checkpoint
    cfg = checkpoint.load_config(run_dir)
    conv = export_converter(cfg.model)
    if cfg.model.scan_layers:
        raise ConversionError("the run uses model.scan_layers=True; export supports unscanned layers only")
    params = jax.device_get(checkpoint.load_params_of(run_dir, cfg))
    tensors = conv.params_to_hf(params, cfg.model)
    hf_cfg = conv.config_to_hf(cfg.model)
    hf_cfg.update(conv.head_config(cfg, run_dir))  # the architecture follows the run's task (BERT's heads)
    hf_cfg.update(conv.run_fields(cfg))  # special ids from the run's seq2seq framing
    io.write(out_dir, hf_cfg, tensors)
    tok = cfg.data.tokenizer
    if os.path.isdir(tok):
        save_dir(tok, out_dir)
    if verbose:
        print(f"exported {run_dir} -> {out_dir} ({len(tensors)} tensors)")
    return {"tensors": tensors}


def from_pretrained(path: str):
    """(model, params, tokenizer, config) from a zoo run directory or a Hugging Face checkpoint
    directory (converted in memory, nothing written)."""
    from zoo import tasks
    from zoo.data.tokenizers import get_tokenizer
    from zoo.train import checkpoint
    framing = None
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return checkpoint.load_run(path)
    else:
        src = io.resolve(path)
        hf_cfg = io.read_config(src)
        conv, task_name, model_cfg, params, _ = _load(src, hf_cfg)
        has_tok = any(os.path.isfile(os.path.join(src, f)) for f in ("vocab.json", "vocab.txt", "tokenizer.json",
                                                                      "spiece.model"))
        cfg = _run_config(model_cfg, task_name, src if has_tok else None, **conv.data_fields(hf_cfg, task_name))
        if has_tok:  # what from_hf would write as seq2seq.json (None: not a seq2seq model)
            framing = conv.seq2seq_framing(hf_cfg, io.read_generation_config(src))
    task, tokenizer = tasks.build(cfg), get_tokenizer(cfg.data.tokenizer)
    if framing is not None:
        tokenizer.seq2seq = framing
    return task.model, params, tokenizer, cfg
