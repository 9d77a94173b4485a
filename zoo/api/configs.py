"""The shipped config files and model presets: find a config by name (`zoo-train gpt_tiny`) from any
directory, and list them (`zoo-train --list`)."""

from __future__ import annotations

import ast
import glob
import os
import re
import shutil
import textwrap

from zoo.errors import ConfigError

# Where config names are looked up: ./configs, then the configs/ beside the installed package (an
# editable install, `pip install -e .`, as the README's set-up command makes).
SEARCH = ("configs", os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                  "configs"))


def config_dirs() -> list[str]:
    return [d for d in dict.fromkeys(os.path.abspath(d) for d in SEARCH) if os.path.isdir(d)]


def find(name: str) -> str:
    """A config file path as given, or the shipped config called `name` (gpt_tiny -> .../configs/gpt_tiny.py)."""
    if os.path.exists(name) or os.sep in name or name.endswith(".py"):
        return name
    for d in config_dirs():
        path = os.path.join(d, f"{name}.py")
        if os.path.isfile(path):
            return path
    shipped = sorted({os.path.basename(p)[:-3] for d in config_dirs() for p in glob.glob(os.path.join(d, "*.py"))})
    raise ConfigError(f"config {name!r} is neither a file nor a shipped config; shipped: {', '.join(shipped)} "
                      f"(zoo-train --list)")


# A sentence ends at . ! or ? (a closing bracket or quote may follow) before a space or the end of the text,
# except after the abbreviations docstrings use ("Vaswani et al. 2017", "e.g. gpt_tiny").
SENTENCE_END = re.compile(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)(?<!\betc)(?<!\bvs)[.!?][)\]\"']?(?=\s|$)")


def summary(path: str) -> str:
    """A config file's docstring opening, as one line: its first line, continued across the wrapped lines
    after it to the end of the sentence it ends in (within the first paragraph), so never cut mid-sentence."""
    with open(path) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    paragraph = re.split(r"\n\s*\n", doc.strip())[0]
    first, text = " ".join(paragraph.split("\n")[0].split()), " ".join(paragraph.split())
    end = SENTENCE_END.search(text, max(len(first) - 2, 0))  # the first line's own last "." counts
    return text[:end.end()] if end else text


def listing() -> str:
    """Config files (name: summary, wrapped to the terminal's width under itself) and presets (name: family,
    layers x width)."""
    from zoo.models import FAMILIES
    lines, width = [], max(shutil.get_terminal_size().columns, 60)
    for d in config_dirs()[:1]:
        lines.append(f"configs in {d} (train one with `zoo-train NAME`):")
        for path in sorted(glob.glob(os.path.join(d, "*.py"))):
            lines.append(textwrap.fill(summary(path), width, initial_indent=f"  {os.path.basename(path)[:-3]:18} ",
                                       subsequent_indent=" " * 21, break_on_hyphens=False))
    lines.append("model presets (zoo.models.PRESETS; e.g. dataclasses.replace(PRESETS[name], ...) in a config):")
    for family in FAMILIES.values():
        for name, m in family.presets.items():
            depth = f"{m.num_encoder_layers}+{m.num_decoder_layers}" if hasattr(m, "num_encoder_layers") else m.num_layers
            lines.append(f"  {name:18} {family.name:7} {depth} layers, width {m.d_model}, {m.num_heads} heads, "
                         f"vocab {m.vocab_size}")
        lines.append(f"  {'':18} {family.name} tasks: {', '.join(family.tasks)}")
    return "\n".join(lines)
