"""Every command explains itself: fast --help with texts, `zoo-train --list`, `--print-config`, shipped
configs by name from any directory."""

import json
import os
import subprocess
import sys

import pytest

from zoo.api import configs
from zoo.cli.train import train_main

COMMANDS = ("train", "sample", "eval", "translate", "fill_mask", "classify", "convert", "bench", "attention")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_fast_and_imports_no_jax(command, tmp_path):
    code = (f"import sys; from zoo.cli.{command} import main\ntry: main(['--help'])\nexcept SystemExit: pass\n"
            "assert 'jax' not in sys.modules, 'jax imported before the arguments were parsed'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-1000:]
    assert "usage: zoo-" in out.stdout and "show this help message" in out.stdout


def test_list_names_every_config_and_preset(capsys):
    assert train_main(["--list"]) == 0
    out = capsys.readouterr().out
    shipped = sorted(os.path.basename(p)[:-3] for p in os.listdir("configs") if p.endswith(".py"))
    assert all(f"  {name} " in out for name in shipped)
    assert all(f"  {name} " in out for name in ("gpt2_small", "bert_base", "t5_small", "minilm_l6"))


def test_print_config_resolves_a_shipped_config_by_name_from_anywhere(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here: the name is found beside the installed package
    assert train_main(["gpt_tiny", "--print-config", "--set", "optim.lr=1e-3"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["task"] == "gpt_lm" and cfg["optim"]["lr"] == 1e-3 and cfg["model"]["d_model"] == 128
    assert not os.listdir(tmp_path)  # nothing trained, nothing written


def test_an_unknown_config_name_lists_the_shipped_ones(capsys):
    assert train_main(["gpt_huge"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: config 'gpt_huge' is neither a file nor a shipped config; shipped: ")
    assert "gpt_tiny" in err and "\n" not in err and configs.find("configs/gpt_tiny.py") == "configs/gpt_tiny.py"
