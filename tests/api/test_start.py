"""zoo.api.start: every way into a run resolves to one Start (its kind, the final config, the base, what is converted
and where, the resume step), the same value train.py's --print-config prints the config of."""

import json
import os

import pytest

from tests.helpers.shared_runs import finished_gpt_fixture, smollm2_gguf_run_fixture  # noqa: F401 (the fixtures)
from zoo.api.start import start
from zoo.cli.train import train_main
from zoo.errors import ArgumentError, ConfigError
from zoo.sources import source


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    import transformers
    path = str(tmp_path_factory.mktemp("hf") / "gpt2")
    cfg = transformers.GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(path)
    return path


def test_a_config_starts_from_scratch_with_every_override(tmp_path):
    s = start("gpt_tiny", workdir=str(tmp_path / "w"), overrides={"train.steps": 7, "optim.lr": 1e-3}, dry=True)
    assert (s.kind, s.source, s.base, s.converted, s.resume) == ("config", None, None, None, False)
    assert s.config.train.steps == 7 and s.config.optim.lr == 1e-3 and s.config.task == "gpt_lm"
    assert "training gpt_lm" in s.describe()


def test_a_hugging_face_directory_is_named_with_where_it_is_converted_and_a_dry_start_writes_nothing(hf_gpt2, tmp_path):
    work = str(tmp_path / "ft")
    s = start(init_from=hf_gpt2, workdir=work, overrides=["task=sft", "model.lora_rank=4", "optim.lr=3e-4"], dry=True)
    assert (s.kind, s.source) == ("hf", hf_gpt2)
    assert s.converted == s.base == s.config.init_from == os.path.abspath(os.path.join(work, "base"))
    assert s.config.task == "sft" and s.config.model.lora_rank == 4 and s.config.optim.lr == 3e-4  # the --set win
    assert s.config.model.vocab_size == 300 and not os.path.exists(work)  # the source's model; nothing written
    assert f"from {hf_gpt2} (hf), converted into" in s.describe()


def test_a_source_is_resolved_once_into_its_kind_whether_it_converts_and_where_a_gguf_is_cached(hf_gpt2, finished_gpt,
                                                                                                tmp_path):
    adapter, gguf, missing = tmp_path / "adapter", tmp_path / "model.gguf", str(tmp_path / "nothing")
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    gguf.write_bytes(b"GGUF stand-in")
    got = {p: (source(p).kind, source(p).converts) for p in (hf_gpt2, finished_gpt, str(adapter), str(gguf),
                                                             "gpt2_small", missing)}
    assert got == {hf_gpt2: ("hf", True), finished_gpt: ("run", False), str(adapter): ("adapter", True),
                   str(gguf): ("gguf", True), "gpt2_small": ("preset", False), missing: (None, False)}
    cache = source(str(gguf)).cache
    assert source(str(gguf)).cache == cache and not source(str(gguf)).is_cached
    gguf.write_bytes(b"GGUF stand-in, changed")  # another file's conversion: another place in the cache
    assert source(str(gguf)).cache != cache


def test_a_zoo_run_is_its_own_base_and_nothing_is_converted(finished_gpt, tmp_path):
    s = start(init_from=finished_gpt, workdir=str(tmp_path / "ft"), overrides={"train.steps": 1}, dry=True)
    assert (s.kind, s.base, s.converted) == ("run", finished_gpt, None)
    assert s.config.train.steps == 1 and s.config.init_from == finished_gpt


def test_a_resume_keeps_the_runs_config_with_the_overrides_and_names_its_step(finished_gpt):
    s = start(workdir=finished_gpt, resume=True, step=2, overrides={"train.log_every": 3}, dry=True)
    assert (s.kind, s.resume, s.resume_step) == ("resume", True, 2)
    assert s.config.train.log_every == 3 and s.config.train.steps == 4
    with pytest.raises(ConfigError, match="changes the model's parameters"):
        start(workdir=finished_gpt, resume=True, overrides={"model.num_layers": s.config.model.num_layers + 1}, dry=True)


def test_a_resume_of_a_run_stopped_before_its_first_save_starts_its_config_again(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    cfg = start("gpt_tiny", workdir=str(work), overrides={"train.steps": 3}, dry=True).config
    (work / "config.json").write_text(cfg.to_json())
    s = start(workdir=str(work), resume=True)
    assert (s.kind, s.restarted, s.config.train.steps) == ("config", True, 3)


def test_the_arguments_are_refused_in_one_line_before_anything_resolves(tmp_path):
    with pytest.raises(ArgumentError, match="config and init_from do not apply"):
        start("gpt_tiny", workdir=str(tmp_path), resume=True)
    with pytest.raises(ArgumentError, match="step= picks the checkpoint"):
        start("gpt_tiny", workdir=str(tmp_path), step=3)


def test_print_config_prints_the_config_start_resolves(hf_gpt2, tmp_path, capsys):
    work = str(tmp_path / "ft")
    sets = ["--set", "task=sft", "--set", "optim.lr=3e-4"]
    assert train_main(["--init-from", hf_gpt2, "--workdir", work, "--print-config"] + sets) == 0
    printed = json.loads(capsys.readouterr().out)
    want = start(init_from=hf_gpt2, workdir=work, overrides=["task=sft", "optim.lr=3e-4"], dry=True).config
    assert printed == json.loads(want.to_json())


def test_data_tokenizer_may_name_a_gguf_file_whose_conversion_gives_the_tokenizer(smollm2_gguf_run, tmp_path):
    """A fresh student on SmolLM2's tokenizer (configs/smollm2_distill.py): data.tokenizer=FILE.gguf is the
    tokenizer of the file's cached conversion (the session's, shared with zoo.load), and the vocabulary follows it;
    named to the tokenizer loader directly, a GGUF file is one line that says what to do, not its bytes."""
    from zoo.data.tokenizers import get_tokenizer
    from zoo.errors import ZooDataError
    gguf = smollm2_gguf_run["gguf"]
    s = start("llama_tiny", workdir=str(tmp_path / "w"), overrides={"data.tokenizer": gguf}, dry=True)
    assert s.config.data.tokenizer.endswith("tokenizer") and os.path.isdir(s.config.data.tokenizer)
    assert get_tokenizer(s.config.data.tokenizer).n_vocab == 49152 and s.config.model.vocab_size >= 49152
    with pytest.raises(ZooDataError, match=r"is a GGUF file: its tokenizer is read once the file is converted") as e:
        get_tokenizer(gguf)
    assert "\n" not in str(e.value) and "\\x" not in str(e.value)
