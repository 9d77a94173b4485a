"""Reading and writing Hugging Face checkpoint directories without torch.

config.json + model.safetensors (or sharded *.safetensors with an index) are read with numpy;
pytorch_model.bin only when torch is installed. Key bookkeeping lives here so every converter
reports missing and unused keys the same way, and every tensor a converter takes is checked for NaN and
inf (`check_finite`) as it takes it, the refusal naming its file and its name there.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np

from zoo.data.hf_tokenizers import TOKENIZER_FILES
from zoo.errors import ConversionError


def resolve(path_or_id: str) -> str:
    """A local directory, or a hub id fetched with huggingface_hub (weights, config, tokenizer files)."""
    if os.path.isdir(path_or_id):
        return path_or_id
    if os.path.exists(path_or_id):
        raise ConversionError(f"{path_or_id!r} is a file; pass the directory holding config.json and the weights")
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(path_or_id, allow_patterns=["config.json", "generation_config.json", "*.safetensors",
                                                             "*.safetensors.index.json", "pytorch_model.bin",
                                                             *TOKENIZER_FILES])
    except Exception as e:  # offline, unknown repo, gated
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise ConversionError(f"{path_or_id!r} is not a local directory and could not be fetched from the "
                              f"Hugging Face hub ({first}); download it and pass the directory") from None


def read_json(path: str) -> dict:
    """A JSON object from `path`; a file that is not one is refused with its name."""
    try:
        with open(path, encoding="utf-8") as f:
            out = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConversionError(f"{path!r} is not JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(out, dict):
        raise ConversionError(f"{path!r} holds a JSON {type(out).__name__}, not an object")
    return out


def read_config(directory: str) -> dict:
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise ConversionError(f"{directory!r} has no config.json")
    return read_json(path)


def read_generation_config(directory: str) -> dict:
    """generation_config.json (decoding defaults transformers prefers over config.json), or {}."""
    path = os.path.join(directory, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    return read_json(path)


class Tensors(dict):
    """Tensors by Hugging Face name, each remembering the file it was read from (`files`: name -> path), so a
    refusal of one names its file."""

    def __init__(self):
        super().__init__()
        self.files: dict[str, str] = {}

    def add(self, tensors: dict, path: str) -> None:
        self.update(tensors)
        self.files.update(dict.fromkeys(tensors, path))


def named(key: str, where: str | None) -> str:
    """A tensor as a refusal names it: its file (`where`, None: not known) and its name there."""
    return f"{where!r}: tensor {key!r}" if where else f"the checkpoint's tensor {key!r}"


def check_finite(x: np.ndarray, key: str, where: str | None) -> np.ndarray:
    """`x` (a float array), once every value is finite; else a ConversionError naming `where` (its file) and the
    tensor `key`: NaN or inf weights would only surface later, as a training run that "diverged" at step 1."""
    if x.dtype.kind in "fc":
        bad = x.size - int(np.count_nonzero(np.isfinite(x)))
        if bad:
            raise ConversionError(f"{named(key, where)} holds {bad:,} NaN or inf values (of {x.size:,}); the "
                                  f"checkpoint is damaged (or was saved after training diverged)")
    return x


def read_tensors(directory: str) -> Tensors:
    """All weights as float32-or-native numpy arrays, keyed by Hugging Face parameter name (with their files).
    Nothing is checked here but that the files read: the values of the tensors a converter uses are checked as
    it takes them (Keys), so a buffer it ignores may hold anything."""
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    out = Tensors()
    if files:
        from safetensors.numpy import load_file
        for f in files:
            try:
                out.add(load_file(f), f)
            except Exception as e:  # safetensors' own error type: truncated, bad header, unknown dtype
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConversionError(f"{f!r} is not a readable safetensors file ({first}); "
                                      f"is it truncated?") from None
        return out
    binary = os.path.join(directory, "pytorch_model.bin")
    if os.path.isfile(binary):
        try:
            import torch
        except ImportError:
            raise ConversionError(f"{binary!r} is a PyTorch pickle and torch is not installed; install torch "
                                  f"or convert the checkpoint to safetensors") from None
        try:
            state = torch.load(binary, map_location="cpu", weights_only=True)
        except Exception as e:  # truncated, not a pickle, or one that holds more than tensors
            first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
            raise ConversionError(f"{binary!r} is not a readable PyTorch state dict ({first})") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ConversionError(f"{binary!r} holds a {type(state).__name__}, not a state dict of tensors")
        out.add({k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in state.items()}, binary)
        return out
    raise ConversionError(f"{directory!r} has neither *.safetensors nor pytorch_model.bin")


def write(directory: str, config: dict, tensors: dict[str, np.ndarray]) -> list[str]:
    """config.json + model.safetensors (float32) into `directory`; returns the names written."""
    from safetensors.numpy import save_file
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
              os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    return ["config.json", "model.safetensors"]


# Old checkpoints (TF-era BERT on the Hub) name LayerNorm weights gamma / beta; transformers renames
# them on load ("legacy" renamings), and so does Keys.
LEGACY = (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias"))


class Keys:
    """Tracks which Hugging Face tensors a converter used; reports the rest by name."""

    def __init__(self, tensors: dict, prefixes: tuple = ()):
        # Strip a wrapper prefix ("transformer.", "bert.", "model.") if every key has it.
        self.tensors, self.names, self.files = {}, {}, {}  # names: the key as the file spells it; files: its file
        files = getattr(tensors, "files", {})
        for k, v in tensors.items():
            name = k
            for p in prefixes:
                if k.startswith(p):
                    k = k[len(p):]
                    break
            for old, new in LEGACY:
                k = k.replace(old, new)
            self.tensors[k], self.names[k], self.files[k] = v, name, files.get(name)
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self.tensors:
            raise ConversionError(f"missing key {key!r} in the checkpoint")
        x = np.asarray(self.tensors[key], dtype=np.float32)
        if key not in self.used:  # checked once (a fused tensor is read once per part)
            check_finite(x, self.names[key], self.files[key])
        self.used.add(key)
        return x

    def where(self, key: str) -> str:
        """The tensor `key` as a refusal names it: its file and its name there."""
        return named(self.names.get(key, key), self.files.get(key))

    def optional(self, key: str) -> np.ndarray | None:
        """The tensor if the checkpoint has it (marked used), else None: for weights that a checkpoint
        may leave out because they are tied to another (lm_head, embed_tokens)."""
        return self[key] if key in self.tensors else None

    def unused(self, ignore: tuple = ()) -> list[str]:
        return sorted(k for k in self.tensors if k not in self.used and not any(i in k for i in ignore))
