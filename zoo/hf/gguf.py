"""GGUF files (llama.cpp's format, often quantised) -> a zoo run, through transformers' GGUF loader.

transformers reads the file with the `gguf` package, dequantises every tensor to float32 and rebuilds
the model's config and tokenizer (with its chat template) from the file's metadata; that Hugging Face
directory is then converted like any other (zoo.hf.from_hf). Needs torch, transformers, gguf and
accelerate (the test extras); zoo's own path stays torch-free.

The file is checked before transformers reads it (`check_file`: its header, every metadata value and tensor
entry within the file, every tensor's bytes too), and every dequantised tensor is checked for NaN and inf
before anything is written: a damaged file is one `error:` line naming it and the key or tensor, never a
struct.error from the reader nor a run that "diverges" at step 1.

transformers draws two progress bars while it reads the file (one update per tensor: hundreds of lines
where the terminal does not redraw), which `_quiet` turns off for the conversion alone; its warnings
stay. The temporary directory never shows: the report names the GGUF file.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import mmap
import os
import struct
import tempfile

from zoo.errors import ConversionError

MAGIC, VERSIONS, HEADER = b"GGUF", (2, 3), 24  # the header: magic, version (uint32), tensor_count, kv_count (uint64)
# GGUF's metadata value types (gguf.GGUFValueType) of fixed size -> their struct codes; 8 is a string (uint64
# length + bytes), 9 an array (uint32 item type, uint64 count, the items)
FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
MIN_KV, MIN_TENSOR = 13, 24  # the fewest bytes one metadata entry (key, type, a 1-byte value) and one tensor entry take
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS


def from_gguf(path: str, run_dir: str, *, verbose: bool = True) -> dict:
    """Convert the GGUF file `path` into a new zoo run `run_dir`; returns from_hf's report."""
    from zoo.hf.convert import from_hf
    if not os.path.isfile(path):
        raise ConversionError(f"{path!r} is not a file; pass the .gguf file itself")
    missing = [m for m in ("torch", "transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConversionError(f"reading a GGUF file needs torch, transformers, gguf and accelerate ({', '.join(missing)} "
                              f"missing): pip install -e '.[hf]'")
    check_file(path)
    import torch
    import transformers
    directory, name = os.path.split(os.path.abspath(path))
    with tempfile.TemporaryDirectory(prefix="zoo-gguf-") as hf_dir:
        try:
            with _quiet(), _parsed_once():
                tok = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
                model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name,
                                                                          dtype=torch.float32)
        except (ValueError, KeyError, OSError, IndexError, struct.error) as e:
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise ConversionError(f"{path!r}: transformers could not read it as a GGUF model ({first})") from None
        _check_finite(model, path)
        _save(model, hf_dir)
        tok.save_pretrained(hf_dir)
        report = from_hf(hf_dir, run_dir, verbose=verbose, source=f"{path}, dequantised", kind="gguf")
    from zoo.hf.convert import write_origin
    write_origin(run_dir, "gguf", os.path.abspath(path))
    return report


class _Reader:
    """Bounds-checked reads over a GGUF file's bytes; running past the end is a ConversionError naming the file
    and what was being read."""

    def __init__(self, buf, path: str, order: str):
        self.buf, self.path, self.order, self.pos, self.size = buf, path, order, 0, len(buf)

    def cut(self, what: str) -> ConversionError:
        return ConversionError(f"{self.path!r} ends at byte {self.size:,}, inside {what}: a truncated GGUF file")

    def take(self, code: str, what: str):
        n = struct.calcsize(code)
        if self.pos + n > self.size:
            raise self.cut(what)
        (v,) = struct.unpack_from(self.order + code, self.buf, self.pos)
        self.pos += n
        return v

    def skip(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            raise self.cut(what)
        self.pos += n

    def string(self, what: str) -> str:
        n = self.take("Q", what)
        self.skip(n, what)
        return self.buf[self.pos - n:self.pos].decode("utf-8", "replace")

    def many(self, count: int, least: int, what: str, unit: str) -> range:
        """range(count), once `count` items of at least `least` bytes each fit in what is left of the file."""
        if count * least > self.size - self.pos:
            raise ConversionError(f"{self.path!r}: {what} is {count:,}, and {count:,} {unit} need at least "
                                  f"{count * least:,} bytes; only {self.size - self.pos:,} are left in the file: a "
                                  f"truncated or damaged GGUF file")
        return range(count)

    def value(self, kind: int, what: str):
        """One metadata value of type `kind` (read: the scalars; skipped: strings' and arrays' contents)."""
        if kind in FIXED:
            return self.take(FIXED[kind], what)
        if kind == STRING:
            return self.string(what)
        if kind != ARRAY:
            raise ConversionError(f"{self.path!r}: {what} has value type {kind}, which GGUF does not define "
                                  f"(0-12): a damaged GGUF file")
        item, count = self.take("I", what), self.take("Q", what)
        if item in FIXED:
            self.skip(count * struct.calcsize(FIXED[item]), what)
        else:
            for _ in self.many(count, 8 if item == STRING else 12, f"the array length of {what}", "items"):
                self.value(item, what)
        return None


def cached_run(src) -> str:
    """The zoo run of the GGUF file `src` (a zoo.sources.Source), converted once into zoo's cache (`src.cache`), which
    zoo.load and every run from the file read: converted into a temporary directory first and renamed, so an
    interrupted conversion leaves nothing a later load would take."""
    final = src.cache
    if src.is_cached:
        return final
    import shutil
    os.makedirs(os.path.dirname(final), exist_ok=True)
    name = os.path.splitext(os.path.basename(src.path))[0]
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=os.path.dirname(final))
    try:
        from_gguf(src.path, os.path.join(tmp, "run"), verbose=False)
        try:
            os.replace(os.path.join(tmp, "run"), final)
        except OSError:  # another process converted it meanwhile: theirs serves
            if not src.is_cached:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def check_file(path: str) -> None:
    """Refuse, in one line naming the file and the field, a GGUF file whose header, metadata or tensor index does not
    fit the file (cut short, counts of 2^60), or whose tensors' bytes lie past its end: what transformers' reader
    would only meet as a struct.error. Nothing is loaded: the metadata is walked over the mapped file."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size < HEADER:
            head = f.read()
            if not MAGIC.startswith(head[:4]):
                raise ConversionError(f"{path!r} is not a GGUF file (it does not start with {MAGIC!r})")
            raise ConversionError(f"{path!r} ends at byte {size}, inside the GGUF header ({HEADER} bytes: magic, "
                                  f"version, tensor_count, kv_count): a truncated GGUF file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            _walk(_Reader(buf, path, "<"))


def _walk(r: _Reader) -> None:
    if bytes(r.buf[:4]) != MAGIC:
        raise ConversionError(f"{r.path!r} is not a GGUF file (it starts with {bytes(r.buf[:4])!r}, not {MAGIC!r})")
    r.pos = 4
    version = r.take("I", "version")
    if version & 0xFFFF == 0:  # a file written big-endian (the gguf reader reads those too)
        r.order, version = ">", struct.unpack_from(">I", r.buf, 4)[0]
    if version not in VERSIONS:
        raise ConversionError(f"{r.path!r} is GGUF version {version}; transformers reads versions "
                              f"{' and '.join(map(str, VERSIONS))}")
    tensors, kvs = r.take("Q", "tensor_count"), r.take("Q", "kv_count")
    r.many(kvs, MIN_KV, "the header's kv_count", "metadata keys")
    r.many(tensors, MIN_TENSOR, "the header's tensor_count", "tensor entries")
    if kvs * MIN_KV + tensors * MIN_TENSOR > r.size - r.pos:
        raise ConversionError(f"{r.path!r}: the header's kv_count={kvs:,} and tensor_count={tensors:,} need at least "
                              f"{kvs * MIN_KV + tensors * MIN_TENSOR:,} bytes; {r.size - r.pos:,} are left in the "
                              f"file: a truncated or damaged GGUF file")
    alignment = 32
    for i in range(kvs):
        key = r.string(f"metadata key {i} of {kvs}")
        what = f"metadata key {key!r}"
        v = r.value(r.take("I", what), what)
        if key == "general.alignment":
            if not isinstance(v, int) or v <= 0 or v & (v - 1):
                raise ConversionError(f"{r.path!r}: general.alignment={v!r}; GGUF needs a power of two")
            alignment = v
    index = []
    for i in range(tensors):
        name = r.string(f"the entry of tensor {i} of {tensors}")
        what = f"the entry of tensor {name!r}"
        dims = r.take("I", what)
        if dims > MAX_DIMS:
            raise ConversionError(f"{r.path!r}: tensor {name!r} claims {dims:,} dimensions; ggml's tensors have "
                                  f"at most {MAX_DIMS}: a damaged GGUF file")
        shape = [r.take("Q", what) for _ in range(dims)]
        index.append((name, shape, r.take("I", what), r.take("Q", what)))
    _check_data(r, index, -(-r.pos // alignment) * alignment)


def _check_data(r: _Reader, index: list, start: int) -> None:
    """Every tensor of a known type, of whole blocks, its bytes within the file (data from byte `start`)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    for name, shape, kind, offset in index:
        try:
            block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise ConversionError(f"{r.path!r}: tensor {name!r} has type {kind}, which is no ggml type the gguf "
                                  f"package knows: a damaged GGUF file (or one newer than the gguf package)") from None
        n = math.prod(shape)
        if n % block:
            raise ConversionError(f"{r.path!r}: tensor {name!r} of shape {tuple(shape)} is no whole number of "
                                  f"{GGMLQuantizationType(kind).name} blocks of {block}: a damaged GGUF file")
        end = start + offset + n // block * nbytes
        if end > r.size:
            raise ConversionError(f"{r.path!r}: tensor {name!r} ({GGMLQuantizationType(kind).name}, shape "
                                  f"{tuple(shape)}) ends at byte {end:,}, past the end of the file ({r.size:,} "
                                  f"bytes): a truncated GGUF file")


def _check_finite(model, path: str) -> None:
    """Every dequantised tensor finite (a NaN scale in one block would only show as a run diverging at step 1),
    a refusal naming it as the file does (blk.0.attn_q.weight) where gguf's name table knows it."""
    import gguf

    from zoo.hf import io
    arch = next((a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == model.config.model_type), None)
    table = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers) if arch is not None else None
    for name, t in model.state_dict().items():
        if t.is_floating_point():
            known = table.get_name(name, try_suffixes=(".weight", ".bias")) if table is not None else None
            io.check_finite(t.detach().float().numpy(), known or f"{name} (transformers' name)", path)


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
