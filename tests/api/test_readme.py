"""The README's Python blocks run as written: every ```python block of README.md, in order, in one fresh process
and directory (as a user would paste them), and each output its comments quote ("# 'text'") is printed. (A ```py
block is a client of a server the README starts by a command: tests/serve makes its calls.) SmolLM2's
GGUF file is read from the session's conversion (conftest's zoo_cache), as a user's second run reads ~/.cache/zoo."""

import ast
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import processes
from tests.helpers.shared_runs import smollm2_gguf_run_fixture  # noqa: F401

README = os.path.join(processes.ROOT, "README.md")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def quoted_outputs(code: str) -> list[str]:
    """The strings a block's `print(...)  # 'text'` comments say it prints."""
    out = []
    for line in code.splitlines():
        m = re.match(r"\s*print\(.*\)\s+#\s+('(?:[^'\\]|\\.)*')", line)
        if m:
            out.append(ast.literal_eval(m.group(1)))
    return out


def test_the_blocks_are_found():
    blocks = python_blocks(open(README).read())
    assert len(blocks) >= 4 and "zoo.load(gguf)" in blocks[0] and any("zoo.train(" in b for b in blocks)
    assert " Paris.\n\nThe answer is:" in quoted_outputs(blocks[0])


@pytest.mark.slow
def test_every_python_block_of_the_readme_runs(smollm2_gguf_run, tmp_path):
    blocks = python_blocks(open(README).read())
    p = subprocess.run([sys.executable, "-c", "\n".join(blocks)], cwd=tmp_path, env=processes.environment(1),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    for want in (w for b in blocks for w in quoted_outputs(b)):
        assert want in p.stdout, want
    assert os.path.isfile(tmp_path / "out/py-lora-peft/adapter_config.json")
