"""Commands say what they did in one line and nothing else: every zoo-convert subcommand ends with one
`wrote DIR: ...` line (the files actually written, the param count); from-gguf draws no progress bars and
never names its temporary directory; the bench's transformers peer warns about nothing; `zoo-train --list`
gives whole sentences, wrapped to the terminal; every zoo-bench option has a help text with its default."""

import ast
import os
import re

import jax
import pytest

from tests.helpers.shared_runs import smollm2_gguf_run_fixture  # noqa: F401
from zoo.api import configs
from zoo.cli import bench, convert
from zoo.cli.train import train_main
from zoo.training import runs

LLAMA = dict(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=1)


def last_line(capsys) -> str:
    out = capsys.readouterr().out.strip().splitlines()
    assert out, "the command printed nothing"
    return out[-1]


def params_in(path) -> int:
    from safetensors.numpy import load_file
    return sum(x.size for x in load_file(str(path)).values())


def test_every_convert_subcommand_ends_with_what_it_wrote_where(tmp_path, capsys):
    torch = pytest.importorskip("torch", reason="torch is not installed: the checkpoints are made by transformers")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    peft = pytest.importorskip("peft", reason="peft is not installed: the adapter is made by PEFT")
    torch.manual_seed(0)
    hf_dir, base, out = tmp_path / "hf", str(tmp_path / "base"), str(tmp_path / "out")
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).save_pretrained(hf_dir)
    made = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(hf_dir),
                               peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    made.save_pretrained(str(tmp_path / "adapter"))  # base_model_name_or_path: hf_dir
    capsys.readouterr()

    assert convert.main(["from-hf", str(hf_dir), base]) == 0
    _, params, _, _ = runs.load_run(base)
    n = sum(x.size for x in jax.tree.leaves(params))
    assert last_line(capsys) == (f"wrote {base}: a gpt_lm run of LlamaForCausalLM from {hf_dir} (gpt, {n:,} params, "
                                 f"step 0); tokenizer: bytes (the checkpoint has none)")

    assert convert.main(["to-hf", base, out]) == 0
    line = last_line(capsys)
    written = sorted(os.listdir(out))
    assert written == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert line.startswith(f"wrote {out}: config.json, model.safetensors, tokenizer.json, tokenizer_config.json "
                           f"({params_in(os.path.join(out, 'model.safetensors')):,} params of {base}, step 0); ")
    assert line.endswith(f"load it with transformers.LlamaForCausalLM.from_pretrained({out!r})")

    lora = str(tmp_path / "lora")
    assert convert.main(["from-hf", str(tmp_path / "adapter"), lora]) == 0
    trained = runs.load_trained(lora, runs.load_config(lora))[0]
    n = sum(x.size for x in jax.tree.leaves(trained))
    assert n == 4 * (32 + 32) + 4 * (32 + 16)  # rank 4 on q_proj (32 -> 32) and v_proj (32 -> 2 heads of 8)
    assert last_line(capsys) == (f"wrote {lora}: a gpt_lm LoRA run of the PEFT adapter {tmp_path / 'adapter'} (r=4, "
                                 f"lora_targets=query,value; {n:,} trained params, step 0) on its base "
                                 f"{os.path.join(lora, 'base')} (converted from {hf_dir})")

    back = str(tmp_path / "back")
    assert convert.main(["to-hf", lora, back, "--adapter"]) == 0
    assert sorted(os.listdir(back)) == ["adapter_config.json", "adapter_model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json"]  # the run's tokenizer (bytes) beside the adapter
    assert last_line(capsys) == (
        f"wrote {back}: adapter_config.json, adapter_model.safetensors, tokenizer.json, tokenizer_config.json "
        f"(PEFT LoRA r=4 on 2 layers; "
        f"{params_in(os.path.join(back, 'adapter_model.safetensors')):,} params of {lora}, step 0) for the base "
        f"{os.path.abspath(hf_dir)} (the Hugging Face checkpoint {os.path.join(lora, 'base')} was converted from); "
        f"load it with peft.AutoPeftModelForCausalLM.from_pretrained({back!r})")


def test_from_gguf_draws_no_progress_bars_and_names_no_temporary_directory(smollm2_gguf_run):
    """What `zoo-convert from-gguf` wrote to file descriptors 1 and 2 while it converted SmolLM2 (the session's
    one conversion, tests/helpers/shared_runs.py)."""
    pytest.importorskip("torch", reason="torch is not installed: GGUF files are read through transformers")
    run, path, out, err = (smollm2_gguf_run[k] for k in ("run", "gguf", "out", "err"))
    printed = out + err
    assert "\r" not in printed and "it/s" not in printed and "%|" not in printed, printed[-500:]
    assert "zoo-gguf-" not in printed and "/tmp" not in printed.replace(run, "RUN").replace(path, "GGUF")
    assert len(err.splitlines()) < 3, err[-500:]  # (room for a platform's own one-line notice)
    assert out.strip().splitlines() == [
        f"wrote {run}: a gpt_lm run of LlamaForCausalLM from {path}, dequantised (gpt, 134,515,008 params, step 0); "
        f"tokenizer: {os.path.join(run, 'tokenizer')} (tokenizer.json, tokenizer_config.json, chat_template.jinja)"]
    assert smollm2_gguf_run["bars_kept"]  # transformers' bars are as they were
    assert smollm2_gguf_run["reader_kept"]  # and the gguf package's reader (read once during the conversion)


def test_the_bench_peer_builds_its_models_without_transformers_warnings(capfd):
    pytest.importorskip("torch", reason="torch is not installed: the peer runs transformers")
    from transformers.utils import logging as hf_logging

    from zoo.bench import torch_peer
    gpt2 = {"arch": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "n_inner": 64, "vocab_size": 128,
            "n_positions": 64}
    hf_logging.warning_once.cache_clear()  # transformers warns once a process: an earlier test's warning counts
    capfd.readouterr()
    train = torch_peer.make("hf-torch", {"workload": "gpt_train", "hf": gpt2, "batch": 2, "seq_len": 16})
    train.round()  # the loss is computed: transformers looks up its loss type
    gen = torch_peer.make("hf-torch", {"workload": "generate", "hf": gpt2, "batch": 2, "prompt": 4, "new": 3})
    gen.round()
    out, err = capfd.readouterr()
    assert "[transformers]" not in out + err and "warn" not in (out + err).lower(), err
    cfg = train.model.config
    assert cfg.bos_token_id == cfg.eos_token_id == 127 and train.model.loss_type == "ForCausalLM"


def described(out: str) -> dict:
    """name -> the description `--list` gives a config (its wrapped lines joined), from the configs section."""
    section = out.split("\nmodel presets")[0].splitlines()[1:]
    entries = {}
    for line in section:
        if line.startswith("  ") and not line.startswith(" " * 21):
            name, text = line[2:20].strip(), line[21:]
            entries[name] = text
        else:
            assert line.startswith(" " * 21) and line[21] != " ", line  # a continuation, under the description
            entries[name] += " " + line[21:]
    return entries


def test_list_gives_each_config_whole_sentences_wrapped_to_the_terminal(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "72")
    assert train_main(["--list"]) == 0
    out = capsys.readouterr().out
    got = described(out)
    shipped = sorted(p[:-3] for p in os.listdir("configs") if p.endswith(".py"))
    assert sorted(got) == shipped
    assert all(len(line) <= 72 for line in out.split("\nmodel presets")[0].splitlines()[1:])
    for name, text in got.items():
        with open(os.path.join("configs", f"{name}.py")) as f:
            doc = ast.get_docstring(ast.parse(f.read()))
        paragraph = " ".join(re.split(r"\n\s*\n", doc)[0].split())
        first = " ".join(doc.splitlines()[0].split())
        assert paragraph.startswith(text) and text.startswith(first), name  # the opening, never past a blank line
        assert re.search(r"[.!?]\)?$", text) and paragraph[len(text):][:1] in ("", " "), (name, text)  # a whole one
    assert got["gpt_tiny"] == "GPT tiny: a 4-layer, width-128 byte-level GPT on the built-in corpus (Python's own " \
                              "docs). CPU."  # the first line, whole
    assert got["t5_small"].endswith("tied embeddings; 60,506,624 params as t5-small.")  # "et al." ends nothing
    assert got["bert_tiny_cls"].endswith("a paragraph of the built-in corpus comes from.")
    assert configs.summary("configs/transformer_base.py") == got["transformer_base"]


def options_help(text: str) -> dict:
    """option -> its help text, from an argparse --help's options section."""
    out, current = {}, None
    for line in text.split("\noptions:\n")[1].splitlines():
        if re.match(r"  -", line):
            invocation, _, rest = line.strip().partition("  ")
            current = re.findall(r"(?<![\w{,|])--?[\w-]+", invocation)[-1]  # "-h, --help": --help
            out[current] = rest.strip()
        elif line.strip():
            out[current] += " " + line.strip()
    return out


def test_every_bench_option_has_a_help_text_with_its_default(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    helps = options_help(capsys.readouterr().out)
    assert {"--workload", "--shapes", "--preset", "--seq-len", "--batch", "--dtype", "--rounds", "--peer", "--out",
            "--profile", "--set"} <= set(helps)
    missing = [o for o, h in helps.items() if o != "--help" and "default" not in h]
    assert not missing, f"options without a help text naming their default: {missing}"
    assert "(default: 5)" in helps["--rounds"] and "(default: full)" in helps["--shapes"]
    assert "1024" in helps["--seq-len"] and "8)" in helps["--batch"]  # gpt_train's full shape, T=1024 B=8
