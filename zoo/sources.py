"""What a source zoo.load reads is, from its path alone (`kind_of`): a zoo run, a Hugging Face directory, a PEFT
adapter, a GGUF file or a preset name. Below zoo.api, so the tasks that name a source (distill.teacher) check it
without importing the loader."""

from __future__ import annotations

import os

from zoo.errors import CheckpointError

KINDS = ("a zoo run directory (checkpoints/)", "a Hugging Face directory (config.json)",
         "a PEFT adapter directory (adapter_config.json)", "a .gguf file", "a preset name")


def kind_of(source: str) -> str:
    """run | hf | adapter | gguf | preset, from the path alone; CheckpointError naming what was looked for."""
    from zoo.models import PRESETS
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        if os.path.isdir(os.path.join(path, "checkpoints")):
            return "run"
        if os.path.isfile(os.path.join(path, "adapter_config.json")) and \
                not os.path.isfile(os.path.join(path, "config.json")):
            return "adapter"
        if os.path.isfile(os.path.join(path, "config.json")):
            return "hf"
        raise CheckpointError(f"{source!r} is a directory but none zoo reads: no checkpoints/ (a zoo run), "
                              f"config.json (Hugging Face) or adapter_config.json (PEFT)")
    if os.path.isfile(path):
        if path.endswith(".gguf"):
            return "gguf"
        raise CheckpointError(f"{source!r} is a file but not a .gguf file; zoo.load reads " + ", ".join(KINDS))
    if source in PRESETS:
        return "preset"
    raise CheckpointError(f"{source!r}: no such file or directory, and no preset of that name; give "
                          + ", ".join(KINDS) + f" (presets: {', '.join(PRESETS)})")
