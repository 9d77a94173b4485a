"""What a source zoo.load reads is, from its path alone: a zoo run, a Hugging Face directory, a PEFT adapter, a GGUF
file or a preset name (`kind_of`), resolved once into a `Source` (`source`) that a run's start hands to everything
that asks (which conversion it needs, where a GGUF file's conversion is cached). Below zoo.api, so the tasks that
name a source (distill.teacher) check it without importing the loader."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os

from zoo.errors import CheckpointError

KINDS = ("a zoo run directory (checkpoints/)", "a Hugging Face directory (config.json)",
         "a PEFT adapter directory (adapter_config.json)", "a .gguf file", "a preset name")
CONVERTED = ("hf", "adapter", "gguf")  # the kinds a run converts into WORKDIR/base before it trains


@dataclasses.dataclass(frozen=True)
class Source:
    """A source, resolved once. path: as given; kind: run | hf | adapter | gguf | preset, or None where the path is
    none of them (whoever reads it then names why: zoo.training.runs for a run's path)."""

    path: str
    kind: str | None

    @property
    def converts(self) -> bool:
        """Whether a run from it converts it first (a Hugging Face directory, a PEFT adapter, a GGUF file)."""
        return self.kind in CONVERTED

    @functools.cached_property  # one stat and hash per Source, however often asked
    def cache(self) -> str:
        """Where zoo.load keeps the conversion of a GGUF file (zoo.hf.gguf.cached_run): zoo's cache, keyed by
        the file's absolute path, size and modification time (another file, or this one changed, is converted
        anew)."""
        from zoo.runtime import cache_root
        path = os.path.expanduser(self.path)
        st = os.stat(path)
        key = hashlib.sha256(json.dumps([os.path.abspath(path), st.st_size, st.st_mtime_ns]).encode()).hexdigest()
        name = os.path.splitext(os.path.basename(path))[0]
        return os.path.join(cache_root(), "converted", f"{name}-{key[:16]}")

    @property
    def is_cached(self) -> bool:
        """A GGUF file zoo.load (or a run) has converted already."""
        return os.path.isdir(os.path.join(self.cache, "checkpoints"))


def source(path: str) -> Source:
    """`path` as a Source; a path of no kind zoo reads is kept with kind None (see Source)."""
    try:
        return Source(path, kind_of(path))
    except CheckpointError:
        return Source(path, None)


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
