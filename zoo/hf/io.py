"""Reading and writing Hugging Face checkpoint directories without torch.

config.json + model.safetensors (or sharded *.safetensors with an index) are read with numpy;
pytorch_model.bin only when torch is installed. Key bookkeeping lives here so every converter
reports missing and unused keys the same way.
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


def read_tensors(directory: str) -> dict[str, np.ndarray]:
    """All weights as float32-or-native numpy arrays, keyed by Hugging Face parameter name."""
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    if files:
        from safetensors.numpy import load_file
        out = {}
        for f in files:
            try:
                out.update(load_file(f))
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
        return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in state.items()}
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
        self.tensors = {}
        for k, v in tensors.items():
            for p in prefixes:
                if k.startswith(p):
                    k = k[len(p):]
                    break
            for old, new in LEGACY:
                k = k.replace(old, new)
            self.tensors[k] = v
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self.tensors:
            raise ConversionError(f"missing key {key!r} in the checkpoint")
        self.used.add(key)
        return np.asarray(self.tensors[key], dtype=np.float32)

    def optional(self, key: str) -> np.ndarray | None:
        """The tensor if the checkpoint has it (marked used), else None: for weights that a checkpoint
        may leave out because they are tied to another (lm_head, embed_tokens)."""
        return self[key] if key in self.tensors else None

    def unused(self, ignore: tuple = ()) -> list[str]:
        return sorted(k for k in self.tensors if k not in self.used and not any(i in k for i in ignore))
