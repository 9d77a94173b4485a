"""Hugging Face checkpoints in and out: config + weight mapping per architecture, torch-free.

    from_hf(path_or_id, run_dir)  -> a zoo run directory (weights-only checkpoint, config, tokenizer)
    to_hf(run_dir, out_dir)       -> config.json + model.safetensors (+ tokenizer files) for transformers
    from_pretrained(path)         -> (model, params, tokenizer, config) from either kind of directory

A converter module (gpt2.py, bert.py, t5.py, bart.py) gives ARCHITECTURES, PREFIXES, IGNORED,
config_from_hf / config_to_hf and params_from_hf / params_to_hf. One whose zoo task follows the
checkpoint's head (BERT) also gives task_for(hf_cfg, keys) (its params_from_hf then takes the task),
data_fields (DataConfig fields of the converted run) and head_config (the architecture to export as).
An encoder-decoder one (T5, BART) reads the weights in config_from_hf too (CONFIG_FROM_WEIGHTS: is
the output tied?) and gives seq2seq_framing (how the checkpoint frames sequences: seq2seq.json beside
the run's tokenizer files, read by zoo.seq2seq_data) and run_fields (config.json ids from the run).
"""

from __future__ import annotations

import json
import os

import flax.linen as nn
import jax
import numpy as np

from zoo.hf import bart, bert, gpt2, io, seq2seq, t5
from zoo.hf.tokenizer import SEQ2SEQ_FILE, save_dir
from zoo.hf.io import ConversionError

# model_type -> (converter module, task); task None: the converter's `task_for` reads it off the
# checkpoint's head (BERT: bare encoder, masked LM or classifier).
CONVERTERS = {"gpt2": (gpt2, "gpt_lm"), "bert": (bert, None), "t5": (t5, "seq2seq"), "bart": (bart, "seq2seq")}
FAMILY_TO_TYPE = {"gpt": "gpt2", "bert": "bert", "encdec": "t5 or bart"}


def export_type(model_cfg) -> str:
    """The model_type a zoo model exports as; an encoder-decoder by its positions (relative: T5, else BART)."""
    if model_cfg.family == "encdec":
        return "t5" if model_cfg.positions == "relative" else "bart"
    return FAMILY_TO_TYPE[model_cfg.family]


def supported() -> str:
    return ", ".join(a for m, _ in CONVERTERS.values() for a in m.ARCHITECTURES)


def _converter(hf_cfg: dict):
    model_type, archs = hf_cfg.get("model_type"), hf_cfg.get("architectures") or []
    # A known model_type with an unknown head (BertForTokenClassification) is refused too.
    if model_type not in CONVERTERS or (archs and not set(archs) & set(CONVERTERS[model_type][0].ARCHITECTURES)):
        raise ConversionError(f"unsupported architecture {', '.join(archs or ['?'])} (model_type={model_type!r}); "
                              f"supported: {supported()}")
    return CONVERTERS[model_type]


def _load(src: str, hf_cfg: dict):
    """(converter, task, model config, params, keys) of a Hugging Face checkpoint directory."""
    conv, task = _converter(hf_cfg)
    keys = io.Keys(io.read_tensors(src), conv.PREFIXES)
    model_cfg = conv.config_from_hf(hf_cfg, keys) if getattr(conv, "CONFIG_FROM_WEIGHTS", False) else \
        conv.config_from_hf(hf_cfg)
    if task is None:
        task = conv.task_for(hf_cfg, keys)
        params = conv.params_from_hf(keys, model_cfg, task)
    else:
        params = conv.params_from_hf(keys, model_cfg)
    return conv, task, model_cfg, params, keys


def _run_config(model_cfg, task: str, tokenizer_dir: str | None, **data_fields):
    from zoo.config import Config, DataConfig
    data = DataConfig(tokenizer=tokenizer_dir or "bytes", seq_len=min(model_cfg.max_len, 1024), **data_fields)
    return Config(task=task, model=model_cfg, data=data)


def _data_fields(conv, hf_cfg: dict, task: str) -> dict:
    return conv.data_fields(hf_cfg, task) if hasattr(conv, "data_fields") else {}


def from_hf(path_or_id: str, run_dir: str, *, verbose: bool = True) -> dict:
    """Convert; returns a report with the unused keys. The weights are checked against the zoo
    model's own parameter tree (every key, every shape) before anything is written."""
    from zoo import checkpoint, tasks
    src = io.resolve(path_or_id)
    hf_cfg = io.read_config(src)
    conv, task_name, model_cfg, params, keys = _load(src, hf_cfg)
    tok_dir = os.path.join(os.path.abspath(run_dir), "tokenizer")
    copied = save_dir(src, tok_dir)
    if copied and hasattr(conv, "seq2seq_framing"):  # the checkpoint's own framing travels with its tokenizer
        with open(os.path.join(tok_dir, SEQ2SEQ_FILE), "w") as f:
            json.dump(conv.seq2seq_framing(hf_cfg, io.read_generation_config(src)), f, indent=2)
    cfg = _run_config(model_cfg, task_name, tok_dir if copied else None, **_data_fields(conv, hf_cfg, task_name))
    expected = jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0))
    _check_tree(params, nn.unbox(expected))
    if checkpoint.latest_step(run_dir) is not None:
        raise ConversionError(f"{run_dir!r} already holds checkpoints; choose a new directory")
    checkpoint.save_weights(run_dir, params, cfg)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        f.write(cfg.to_json())
    unused = keys.unused(getattr(conv, "IGNORED", ()))
    if verbose:
        n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
        print(f"converted {', '.join(hf_cfg.get('architectures') or [hf_cfg['model_type']])} from {src}: "
              f"{n:,} params -> {run_dir}" + (f"; unused keys: {', '.join(unused)}" if unused else ""))
        if hasattr(conv, "seq2seq_framing"):
            skipped = seq2seq.unsupported_generation(hf_cfg, io.read_generation_config(src))
            if skipped:
                print(f"note: zoo.decoding does not apply the checkpoint's {', '.join(skipped)}")
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
    from zoo import checkpoint
    cfg = checkpoint.load_config(run_dir)
    family = cfg.model.family
    if family not in FAMILY_TO_TYPE:
        raise ConversionError(f"exporting a {family} model is not supported; supported families: "
                              f"{', '.join(FAMILY_TO_TYPE)}")
    conv, _ = CONVERTERS[export_type(cfg.model)]
    if getattr(cfg.model, "scan_layers", False):
        raise ConversionError("the run uses model.scan_layers=True; export supports unscanned layers only")
    params = jax.device_get(load_params_unsharded(run_dir, cfg))
    tensors = conv.params_to_hf(params, cfg.model)
    hf_cfg = conv.config_to_hf(cfg.model)
    if hasattr(conv, "head_config"):  # the architecture follows the run's task (BERT's heads)
        hf_cfg.update(conv.head_config(cfg, run_dir))
    if hasattr(conv, "run_fields"):  # special ids from the run's seq2seq framing
        hf_cfg.update(conv.run_fields(cfg))
    io.write(out_dir, hf_cfg, tensors)
    tok = cfg.data.tokenizer
    if os.path.isdir(tok):
        save_dir(tok, out_dir)
    if verbose:
        print(f"exported {run_dir} -> {out_dir} ({len(tensors)} tensors)")
    return {"tensors": tensors}


def load_params_unsharded(run_dir: str, cfg):
    from zoo import checkpoint, tasks
    abstract = nn.unbox(jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0)))
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return checkpoint.load_params(run_dir, jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=dev), abstract))


def from_pretrained(path: str):
    """(model, params, tokenizer, config) from a zoo run directory or a Hugging Face checkpoint
    directory (converted in memory, nothing written)."""
    from zoo import data, tasks
    framing = None
    if os.path.isdir(os.path.join(path, "checkpoints")):
        from zoo import checkpoint
        cfg = checkpoint.load_config(path)
        params = load_params_unsharded(path, cfg)
    else:
        src = io.resolve(path)
        hf_cfg = io.read_config(src)
        conv, task_name, model_cfg, params, _ = _load(src, hf_cfg)
        has_tok = any(os.path.isfile(os.path.join(src, f)) for f in ("vocab.json", "vocab.txt", "tokenizer.json",
                                                                      "spiece.model"))
        cfg = _run_config(model_cfg, task_name, src if has_tok else None, **_data_fields(conv, hf_cfg, task_name))
        if has_tok and hasattr(conv, "seq2seq_framing"):  # what from_hf would write as seq2seq.json
            framing = conv.seq2seq_framing(hf_cfg, io.read_generation_config(src))
    task, tokenizer = tasks.build(cfg), data.get_tokenizer(cfg.data.tokenizer)
    if framing is not None:
        tokenizer.seq2seq = framing
    return task.model, params, tokenizer, cfg
