"""The Converter protocol: what every converter module (gpt2, llama, qwen2, qwen3, mistral, bert, t5, bart)
provides, so that zoo.hf.convert calls each member unconditionally. Converter modules are modules,
not classes; a module satisfies the protocol by defining every member at module level (PEP 544:
modules as implementations), with a trivial body where the architecture has nothing to say.
"""

from __future__ import annotations

from typing import Protocol

from zoo.errors import ConversionError
from zoo.hf.io import Keys


class Converter(Protocol):
    ARCHITECTURES: tuple[str, ...]  # the HF architectures served (config.json "architectures")
    PREFIXES: tuple[str, ...]       # wrapper prefixes stripped from every key ("transformer.", "bert.")
    IGNORED: tuple[str, ...]        # substrings of keys never reported unused (buffers)

    def task_for(self, hf: dict, keys: Keys) -> str:
        """The zoo task a checkpoint converts to (fixed, or read off its head)."""

    def config_from_hf(self, hf: dict, keys: Keys):
        """The zoo model config of a checkpoint (config.json, and the weights where they decide tying)."""

    def params_from_hf(self, keys: Keys, cfg, task: str) -> dict:
        """The zoo param tree, derived from the architecture's key table."""

    def data_fields(self, hf: dict, task: str) -> dict:
        """DataConfig fields of the converted run ({} if none)."""

    def seq2seq_framing(self, hf: dict, gen: dict) -> dict | None:
        """The seq2seq.json a converted checkpoint's tokenizer carries (None: not a seq2seq model)."""

    def exports(self, model_cfg) -> bool:
        """Whether this converter exports the zoo model; its docstring names what it needs."""

    def config_to_hf(self, cfg) -> dict:
        """config.json of an exported model."""

    def params_to_hf(self, params: dict, cfg) -> dict:
        """The HF state dict (full key names), derived from the same key table as params_from_hf."""

    def head_config(self, cfg, run_dir: str | None) -> dict:
        """config.json fields that follow the run's task (architecture, labels; {} if none); run_dir None: a model
        loaded in memory, its labels in its config."""

    def run_fields(self, cfg) -> dict:
        """config.json fields from the run's tokenizer (special ids; {} if none)."""


MEMBERS = tuple(sorted(set(Converter.__annotations__) |
                       {k for k, v in vars(Converter).items() if callable(v) and not k.startswith("_")}))


def check(module) -> Converter:
    """The module itself, once it defines every member of Converter (else a ConversionError naming them)."""
    missing = [m for m in MEMBERS if not hasattr(module, m)]
    if missing:
        raise ConversionError(f"converter {module.__name__} lacks {', '.join(missing)}")
    return module


# Defaults for the members an architecture has nothing to say about: `data_fields = no_data_fields`.
def no_data_fields(hf: dict, task: str) -> dict:
    return {}


def no_head_config(cfg, run_dir: str) -> dict:
    return {}


def no_seq2seq_framing(hf: dict, gen: dict) -> None:
    return None
