"""GGUF files (llama.cpp's format, often quantised) -> a zoo run, through transformers' GGUF loader.

transformers reads the file with the `gguf` package, dequantises every tensor to float32 and rebuilds
the model's config and tokenizer (with its chat template) from the file's metadata; that Hugging Face
directory is then converted like any other (zoo.hf.from_hf). Needs torch, transformers, gguf and
accelerate (the test extras); zoo's own path stays torch-free.

transformers draws two progress bars while it reads the file (one update per tensor: hundreds of lines
where the terminal does not redraw), which `_quiet` turns off for the conversion alone; its warnings
stay. The temporary directory never shows: the report names the GGUF file.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import tempfile

from zoo.errors import ConversionError


def from_gguf(path: str, run_dir: str, *, verbose: bool = True) -> dict:
    """Convert the GGUF file `path` into a new zoo run `run_dir`; returns from_hf's report."""
    from zoo.hf.convert import from_hf
    if not os.path.isfile(path):
        raise ConversionError(f"{path!r} is not a file; pass the .gguf file itself")
    missing = [m for m in ("torch", "transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConversionError(f"reading a GGUF file needs torch, transformers, gguf and accelerate ({', '.join(missing)} "
                              f"missing): pip install -e '.[test]'")
    import torch
    import transformers
    directory, name = os.path.split(os.path.abspath(path))
    with tempfile.TemporaryDirectory(prefix="zoo-gguf-") as hf_dir:
        try:
            with _quiet(), _parsed_once():
                tok = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
                model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name,
                                                                          dtype=torch.float32)
        except (ValueError, KeyError, OSError) as e:
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise ConversionError(f"{path!r}: transformers could not read it as a GGUF model ({first})") from None
        _save(model, hf_dir)
        tok.save_pretrained(hf_dir)
        report = from_hf(hf_dir, run_dir, verbose=verbose, source=f"{path}, dequantised", kind="gguf")
    from zoo.hf.convert import write_origin
    write_origin(run_dir, "gguf", os.path.abspath(path))
    return report


@contextlib.contextmanager
def _quiet():
    """transformers without its progress bars, as they were afterwards: the weight-loading bar (transformers'
    own switch, which turns huggingface_hub's off and on too) and the GGUF reader's (tqdm called directly)."""
    from huggingface_hub import utils as hub
    from transformers import modeling_gguf_pytorch_utils as reader
    from transformers.utils import logging
    bars, hub_bars = logging.is_progress_bar_enabled(), not hub.are_progress_bars_disabled()
    tqdm = getattr(reader, "tqdm", None)  # (a later transformers may draw it through its own switch)
    logging.disable_progress_bar()
    if tqdm is not None:
        reader.tqdm = functools.partial(tqdm, disable=True)
    try:
        yield
    finally:
        if tqdm is not None:
            reader.tqdm = tqdm
        if bars:
            logging.enable_progress_bar()
        (hub.enable_progress_bars if hub_bars else hub.disable_progress_bars)()


@contextlib.contextmanager
def _parsed_once():
    """transformers reading the file once, not three times: its loader parses the whole GGUF (metadata, the
    tokenizer's vocabulary string by string, the tensor index) for the config, again for the tokenizer and again
    for the weights, and rebuilds gguf's tensor-name table for every submodule of the model (SmolLM2-135M:
    about 60% of a 32 s conversion on a 2-core CPU). Within this block the reader of a path and the table of an
    architecture are made once; both are read-only (the reader maps the file)."""
    import gguf  # (transformers imports both names from gguf when it reads a file)
    real_reader, real_names = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = functools.cache(real_reader), functools.cache(real_names)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_names


def _save(model, directory: str) -> None:
    """config.json + model.safetensors of the dequantised model. (transformers' save_pretrained refuses
    a model loaded from GGUF as "quantized"; its tensors are plain float32 by now.)"""
    import json

    from safetensors.torch import save_file
    conf = model.config.to_dict()
    conf.pop("quantization_config", None)
    conf["architectures"] = conf.get("architectures") or [type(model).__name__]  # (none in the GGUF metadata)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(conf, f, indent=2)
    tied = conf.get("tie_word_embeddings", False)
    tensors = {k: v.detach().float().contiguous().clone() for k, v in model.state_dict().items()
               if not (tied and k == "lm_head.weight")}
    save_file(tensors, os.path.join(directory, "model.safetensors"))
