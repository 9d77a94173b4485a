"""Conversion machinery: a Hugging Face checkpoint directory -> a zoo run, a zoo run -> a directory
transformers loads, and in-memory loading of either. Which converter serves a checkpoint comes from
the FAMILIES registry (zoo.models: each family names its HF model types and converter modules); each
converter module is one architecture's two-way key table (zoo.hf.table) and satisfies the Converter
protocol (zoo.hf.base), so every member is called unconditionally.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shutil

import flax.linen as nn
import jax
import numpy as np

from zoo.data.hf_tokenizers import SEQ2SEQ_FILE, TOKENIZER_FILES, save_dir
from zoo.errors import ConversionError
from zoo.hf import io, seq2seq, tokenizer_export
from zoo.hf.base import Converter, check
from zoo.models import FAMILIES

# config.json keys of an export (transformers keeps unknown keys as config attributes): the run's
# data.seq_len, and data.tokenizer when tokenizer files were written for it (bytes, a tiktoken
# encoding or .tiktoken file), which from-hf takes back instead of those files.
SEQ_LEN_KEY, TOKENIZER_KEY = "zoo_seq_len", "zoo_tokenizer"


def converters() -> dict[str, Converter]:
    """HF model_type -> converter module, from the FAMILIES registry."""
    return {t: check(importlib.import_module(ref)) for f in FAMILIES.values() for t, ref in f.hf.items()}


ZOO_ONLY = ("unet_skips", "value_embeds")  # GptConfig switches with weights of their own no HF model reads


def export_converter(model_cfg) -> Converter:
    """The converter a zoo model exports with: the first of its family's that `exports` it (an
    encoder-decoder: relative positions -> T5, learned -> BART; a GPT: learned positions -> GPT-2, rotary
    ones -> Qwen3 by its q/k norms, else Qwen2, Mistral or Llama by its biases and window). A converter
    registered under several model types (t5: also mt5) is asked once, as its first."""
    mods = [check(importlib.import_module(ref)) for ref in dict.fromkeys(FAMILIES[model_cfg.family].hf.values())]
    zoo_only = [k for k in ZOO_ONLY if getattr(model_cfg, k, False)]
    if zoo_only:  # parts no Hugging Face architecture has: an export would drop their weights silently
        raise ConversionError(f"this {model_cfg.family} model has no Hugging Face equivalent: no Hugging Face "
                              f"architecture has model.{zoo_only[0]} (={getattr(model_cfg, zoo_only[0])}), whose "
                              f"weights an export would drop; save it with format='zoo'")
    for mod in mods:
        if mod.exports(model_cfg):
            return mod
    raise ConversionError(f"this {model_cfg.family} model has no Hugging Face equivalent; it exports as "
                          + " or as ".join(" ".join(m.exports.__doc__.split()) for m in mods))  # one line


def supported() -> str:
    return ", ".join(a for m in dict.fromkeys(converters().values()) for a in m.ARCHITECTURES)  # t5 serves mt5 too


def _converter(hf_cfg: dict) -> Converter:
    """The converter of a checkpoint's config.json."""
    model_type, archs = hf_cfg.get("model_type"), hf_cfg.get("architectures") or []
    convs = converters()
    # A known model_type with an unknown head (BertForQuestionAnswering) is refused too.
    if model_type not in convs or (archs and not set(archs) & set(convs[model_type].ARCHITECTURES)):
        raise ConversionError(f"unsupported architecture {', '.join(archs or ['?'])} (model_type={model_type!r}); "
                              f"supported: {supported()}")
    return convs[model_type]


def _load(src: str, hf_cfg: dict):
    """(converter, task, model config, params, keys) of a Hugging Face checkpoint directory."""
    conv = _converter(hf_cfg)
    keys = io.Keys(io.read_tensors(src), conv.PREFIXES)
    try:
        model_cfg = conv.config_from_hf(hf_cfg, keys)
    except KeyError as e:
        raise ConversionError(f"{os.path.join(src, 'config.json')!r} has no {e.args[0]!r}, which "
                              f"{conv.ARCHITECTURES[0]} needs") from None
    task = conv.task_for(hf_cfg, keys)  # fixed, or read off the head (BERT: bare encoder, MLM, classifier)
    return conv, task, model_cfg, conv.params_from_hf(keys, model_cfg, task), keys


def _named_tokenizer(hf_cfg: dict) -> str | None:
    """The tokenizer an export of a zoo run records: bytes, a tiktoken encoding, or a local .tiktoken
    file that exists here (else the export's tokenizer files serve); None if none is recorded."""
    import tiktoken
    name = hf_cfg.get(TOKENIZER_KEY)
    if not isinstance(name, str):
        return None
    if name in ("bytes", *tiktoken.list_encoding_names()):
        return name
    return name if name.endswith(".tiktoken") and os.path.isfile(os.path.expanduser(name)) else None


def _seq_len(hf_cfg: dict, model_cfg) -> int:
    """The length an exported zoo run was trained on, else the model's positions (at most 1024)."""
    n = hf_cfg.get(SEQ_LEN_KEY)
    if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= model_cfg.max_len:
        return n
    return min(model_cfg.max_len, 1024)


def _run_config(model_cfg, task: str, tokenizer: str | None, hf_cfg: dict | None = None, **data_fields):
    from zoo.configuration import Config, DataConfig
    data = DataConfig(tokenizer=tokenizer or "bytes", seq_len=_seq_len(hf_cfg or {}, model_cfg), **data_fields)
    # The context the weights know: an exported zoo run's training length, else all of the model's positions.
    trained = (hf_cfg or {}).get(SEQ_LEN_KEY)
    context = data.seq_len if isinstance(trained, int) else getattr(model_cfg, "max_len", 0)
    return Config(task=task, model=model_cfg, data=data, context_len=context)


ORIGIN_FILE = "origin.json"  # beside a converted run: {"kind": "hf" | "gguf", "source": the directory, hub id or file}


def write_origin(run_dir: str, kind: str, source: str) -> None:
    """Where a converted run came from, so an adapter trained on it can name a base transformers opens."""
    with open(os.path.join(run_dir, ORIGIN_FILE), "w") as f:
        json.dump({"kind": kind, "source": source}, f)


def origin(run_dir: str) -> dict | None:
    """{"kind", "source"} of a converted run (ORIGIN_FILE), None for a run zoo trained or one of no record."""
    try:
        with open(os.path.join(run_dir, ORIGIN_FILE)) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and isinstance(d.get("source"), str) and d.get("kind") in ("hf", "gguf") else None


def from_hf(path_or_id: str, run_dir: str, *, verbose: bool = True, source: str | None = None,
            kind: str = "hf") -> dict:
    """Convert; returns a report with the unused keys. The weights are checked against the zoo
    model's own parameter tree (every key, every shape) before anything is written. `verbose` ends
    with one `wrote RUN_DIR: ...` line naming the source as `source` (default: path_or_id), which ORIGIN_FILE
    records with its `kind`. (A PEFT LoRA adapter directory converts with zoo.hf.peft.from_peft.)"""
    from zoo import tasks
    from zoo.training import checkpoint
    src = io.resolve(path_or_id)
    hf_cfg = io.read_config(src)
    conv, task_name, model_cfg, params, keys = _load(src, hf_cfg)
    tok_dir = os.path.join(os.path.abspath(run_dir), "tokenizer")
    named = _named_tokenizer(hf_cfg)  # an export of a zoo run: its own tokenizer, its own framing
    copied = [] if named else [n for n in TOKENIZER_FILES if os.path.isfile(os.path.join(src, n))]
    gen = io.read_generation_config(src)
    framing = conv.seq2seq_framing(hf_cfg, gen)  # None: not a seq2seq model
    cfg = _run_config(model_cfg, task_name, named or (tok_dir if copied else None), hf_cfg,
                      **conv.data_fields(hf_cfg, task_name))
    _check_tree(params, nn.unbox(jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0))),
                lambda: _sources(conv, model_cfg, task_name, keys))
    if checkpoint.latest_step(run_dir) is not None:
        raise ConversionError(f"{run_dir!r} already holds checkpoints; choose a new directory")
    new = not os.path.exists(run_dir)
    try:  # everything checked: only now is anything written (and a failed write leaves no half run behind)
        if copied:
            save_dir(src, tok_dir)
        if copied and framing is not None:  # the checkpoint's own framing travels with its tokenizer
            with open(os.path.join(tok_dir, SEQ2SEQ_FILE), "w") as f:
                json.dump(framing, f, indent=2)
        checkpoint.save_weights(run_dir, params, cfg)
        with open(os.path.join(run_dir, "config.json"), "w") as f:
            f.write(cfg.to_json())
        local = os.path.isdir(os.path.expanduser(path_or_id))
        came = os.path.abspath(os.path.expanduser(path_or_id)) if local else path_or_id
        write_origin(run_dir, kind, source or came)
    except BaseException:
        if new:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    unused = keys.unused(conv.IGNORED)
    if verbose:
        if unused:
            print(f"note: the checkpoint's unused keys: {', '.join(unused)}")
        if framing is not None:
            skipped = seq2seq.unsupported_generation(hf_cfg, gen)
            if skipped:
                print(f"note: zoo.infer.decoding does not apply the checkpoint's {', '.join(skipped)}")
            if not copied and not named:
                print("note: the checkpoint has no tokenizer files; the run uses data.tokenizer=bytes and zoo's "
                      "own seq2seq framing")
        arch = ", ".join(hf_cfg.get("architectures") or [hf_cfg["model_type"]])
        tok = f"{tok_dir} ({', '.join(copied)})" if copied else named or "bytes (the checkpoint has none)"
        print(f"wrote {run_dir}: a {task_name} run of {arch} from {source or path_or_id} ({model_cfg.family}, "
              f"{count(params):,} params, step 0); tokenizer: {tok}")
    return {"config": cfg, "unused": unused, "params": params}


def count(tree) -> int:
    """The number of values in a tree of arrays (params, or an export's tensors)."""
    return sum(int(np.prod(np.shape(x))) for x in jax.tree.leaves(tree))


def _sources(conv, model_cfg, task: str, keys: io.Keys) -> dict:
    """zoo param keystr ("['h_0']['attn']['query']['kernel']") -> the Hugging Face tensor it is read from, as a
    refusal names it (its file and its name there), by the converter's key table."""
    table_of = getattr(conv, "key_table", None)
    if table_of is None:
        return {}
    rows = table_of(model_cfg, task) if len(inspect.signature(table_of).parameters) > 1 else table_of(model_cfg)
    return {"".join(f"[{p!r}]" for p in path.split("/")): f"{keys.where(name)}, of shape "
            f"{tuple(np.shape(keys.tensors[name]))}" for path, name, _ in rows if name in keys}


def _check_tree(params, expected, sources=dict) -> None:
    """Every zoo param the model needs, of its shape; `sources()` (_sources, asked only of a wrong shape) names the
    tensor it came from."""
    got = {jax.tree_util.keystr(p): np.shape(v) for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    want = {jax.tree_util.keystr(p): tuple(v.shape) for p, v in jax.tree_util.tree_flatten_with_path(expected)[0]}
    missing = sorted(set(want) - set(got))
    if missing:
        raise ConversionError(f"the checkpoint leaves zoo params unset: {', '.join(missing)}")
    for k, shape in want.items():
        if tuple(got[k]) != shape:
            source = sources().get(k)
            source = f" (from {source})" if source else ""
            raise ConversionError(f"param {k}: the checkpoint gives shape {tuple(got[k])}, the model config.json "
                                  f"describes needs {shape}{source}; config.json and the weights disagree")


def check_out_dir(out_dir: str) -> None:
    """to-hf writes into a new or empty directory: never over an earlier export or other files."""
    if os.path.isdir(out_dir):
        held = sorted(os.listdir(out_dir))
        if held:
            raise ConversionError(f"{out_dir!r} is not empty (holds {', '.join(held[:4])}"
                                  f"{', ...' if len(held) > 4 else ''}); to-hf writes into a new or empty directory")
    elif os.path.lexists(out_dir):
        raise ConversionError(f"{out_dir!r} is a file; to-hf writes into a new or empty directory")


def to_hf(run_dir: str, out_dir: str, *, verbose: bool = True) -> dict:
    """Export the latest checkpoint of a zoo run as a transformers directory (`export`); a LoRA run's adapters
    merged (its adapters alone, as a PEFT adapter: zoo.hf.peft_export.to_peft)."""
    from zoo.training import runs
    # The config and params of one step (the newest that restores whole): never one step's under another's.
    step, cfg, params = runs.load_weights(run_dir)
    return export(cfg, params, out_dir, run_dir=run_dir, what=f"{run_dir}, step {step}", verbose=verbose)


def export(cfg, params, out_dir: str, *, run_dir: str | None = None, what: str = "", verbose: bool = True) -> dict:
    """Write a model (config `cfg`, its plain model's `params`) as a transformers directory: config.json (with
    the run's data.seq_len, and its tokenizer's name when it is bytes or a tiktoken encoding), model.safetensors
    and tokenizer files (the run's own tokenizer directory, else files written for bytes / tiktoken;
    zoo.hf.tokenizer_export). `run_dir`: the run it came from (a classifier's labels.json), `what` names it in the
    `wrote` line. Everything is checked before anything is written."""
    from zoo.data.tokenizers import get_tokenizer
    params = jax.device_get(params)
    conv = export_converter(cfg.model)
    if cfg.model.scan_layers:
        raise ConversionError("the run uses model.scan_layers=True; export supports unscanned layers only")
    check_out_dir(out_dir)
    tok = cfg.data.tokenizer
    hf_cfg = conv.config_to_hf(cfg.model)  # refuses what the architecture cannot hold
    hf_cfg.update(conv.head_config(cfg, run_dir))  # the architecture follows the run's task (BERT's heads)
    hf_cfg.update(conv.run_fields(cfg))  # special ids from the run's tokenizer and framing
    hf_cfg[SEQ_LEN_KEY] = cfg.data.seq_len
    own_files, tok_files = os.path.isdir(os.path.expanduser(tok)), None
    if not own_files:  # bytes, a tiktoken encoding or .tiktoken file: files written for it, or a refusal
        tok_files = tokenizer_export.build(cfg, get_tokenizer(tok))
        if tok_files is not None:
            hf_cfg[TOKENIZER_KEY] = tok
    tensors = conv.params_to_hf(params, cfg.model)
    try:
        files = io.write(out_dir, hf_cfg, tensors)
        written = save_dir(os.path.expanduser(tok), out_dir) if own_files else \
            tokenizer_export.write(out_dir, *tok_files) if tok_files is not None else []
    except OSError as e:
        raise ConversionError(f"cannot write the export to {out_dir!r}: {e.strerror or e}"
                              + (f" ({e.filename})" if e.filename else "")) from None
    if verbose:
        if not own_files and tok_files is None:
            print(f"note: no tokenizer files: the ids of data.tokenizer={tok!r} do not fit model.vocab_size="
                  f"{cfg.model.vocab_size} (a checkpoint converted without its tokenizer)")
        print(f"wrote {out_dir}: {', '.join(files + written)} ({count(tensors):,} params of {what or 'the model'}); "
              f"load it with transformers.{hf_cfg['architectures'][0]}.from_pretrained({out_dir!r})")
    return {"tensors": tensors, "tokenizer_files": written}


def from_pretrained(path: str):
    """(model, params, tokenizer, config) from a zoo run directory or a Hugging Face checkpoint
    directory (converted in memory, nothing written)."""
    from zoo import tasks
    from zoo.data.tokenizers import get_tokenizer
    from zoo.training import runs
    framing = None
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return runs.load_run(path)
    else:
        src = io.resolve(path)
        hf_cfg = io.read_config(src)
        conv, task_name, model_cfg, params, keys = _load(src, hf_cfg)
        named = _named_tokenizer(hf_cfg)  # an export of a zoo run: its own tokenizer, its own framing
        has_tok = not named and any(os.path.isfile(os.path.join(src, f))
                                    for f in ("vocab.json", "vocab.txt", "tokenizer.json", "spiece.model"))
        cfg = _run_config(model_cfg, task_name, named or (src if has_tok else None), hf_cfg,
                          **conv.data_fields(hf_cfg, task_name))
        _check_tree(params, nn.unbox(jax.eval_shape(tasks.build(cfg).init, jax.random.PRNGKey(0))),
                    lambda: _sources(conv, model_cfg, task_name, keys))
        if has_tok:  # what from_hf would write as seq2seq.json (None: not a seq2seq model)
            framing = conv.seq2seq_framing(hf_cfg, io.read_generation_config(src))
    task, tokenizer = tasks.build(cfg), get_tokenizer(cfg.data.tokenizer)
    if framing is not None:
        tokenizer.seq2seq = framing
    return task.model, params, tokenizer, cfg
