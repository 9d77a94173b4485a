"""Every bad input a user tried (issue "trustworthy runs"), one row each: the command exits 2 with exactly
one `error:` line on stderr that names the value or path, no traceback, and leaves nothing behind."""

import json
import os
import shutil

import pytest

from tests.helpers.shared_runs import finished_gpt_fixture  # noqa: F401 (the fixture finished_gpt)
from zoo.cli import convert, eval as zoo_eval, fill_mask, lm_eval, sample
from zoo.cli.train import train_main


@pytest.fixture(scope="module")
def done(finished_gpt, tmp_path_factory):
    """A finished 4-step tiny GPT run, checkpoints at steps 2 and 4 (resume, sample and convert rows act on it):
    this worker's own copy of the session's, as a --resume row locks the run it loads while the other worker's
    rows may be reading theirs."""
    work = str(tmp_path_factory.mktemp("bad_input") / "run")
    shutil.copytree(finished_gpt, work)
    return work


def files(tmp):
    """Paths the rows use, made on demand: {name} in a row's arguments is replaced by its path."""
    (tmp / "syntax.py").write_text("def get_config(:\n")
    (tmp / "notes.txt").write_text("optim.lr = 1e-3\n")
    (tmp / "a_dir").mkdir()
    (tmp / "a_file").write_text("")
    (tmp / "full").mkdir()
    (tmp / "full" / "keep.txt").write_text("")
    (tmp / "hf").mkdir()
    (tmp / "hf" / "config.json").write_text("{not json")
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    (tmp / "chats.jsonl").write_text("".join(json.dumps({"messages": chat}) + "\n" for _ in range(4)))
    (tmp / "bad_chats.jsonl").write_text("".join(json.dumps({"messages": "hello"}) + "\n" for _ in range(4)))
    (tmp / "raising.jinja").write_text("{{ raise_exception('no chat here') }}")
    (tmp / "exits.py").write_text("import sys\nsys.exit(0)\n")
    (tmp / "binary.jinja").write_bytes(bytes(range(256)))
    (tmp / "bert_hf").mkdir()  # a Hugging Face BERT's config.json: its family is read before any weight
    (tmp / "bert_hf" / "config.json").write_text(json.dumps({"model_type": "bert",
                                                             "architectures": ["BertForMaskedLM"]}))
    return {"syntax": tmp / "syntax.py", "notes": tmp / "notes.txt", "a_dir": tmp / "a_dir",
            "a_file": tmp / "a_file", "full": tmp / "full", "hf": tmp / "hf", "new": tmp / "new",
            "chats": tmp / "chats.jsonl", "bad_chats": tmp / "bad_chats.jsonl", "raising": tmp / "raising.jinja",
            "exits": tmp / "exits.py", "binary": tmp / "binary.jinja", "bert_hf": tmp / "bert_hf"}


TRAIN = ["configs/gpt_tiny.py", "--workdir", "{new}"]
ROWS = [  # (command, arguments, fragment of the error line)
    ("train", ["{syntax}"], "config file '{syntax}' line 1: syntax error"),
    ("train", ["{notes}"], "config file '{notes}' is not a Python file (.py)"),
    ("train", ["{a_dir}"], "config file '{a_dir}' is a directory"),
    ("train", ["configs/gpt_tiny.py", "--workdir", "{a_file}"], "workdir '{a_file}' is a file, not a directory"),
    ("train", [*TRAIN, "--set", "optim.b1=2"], "optim.b1=2"),
    ("train", [*TRAIN, "--set", "optim.b2=-1"], "optim.b2=-1"),
    ("train", [*TRAIN, "--set", "optim.weight_decay=-1"], "optim.weight_decay=-1"),
    ("train", [*TRAIN, "--set", "optim.lr=inf"], "optim.lr=inf"),
    ("train", [*TRAIN, "--set", "optim.eps=0"], "optim.eps=0"),
    ("train", [*TRAIN, "--set", "model.lora_targets=query"], "model.lora_targets is set but model.lora_rank=0"),
    ("train", [*TRAIN, "--set", "train.eval_every=-1"], "train.eval_every=-1"),
    ("train", ["--resume", "{new}"], "no checkpoint in '{new}'"),
    ("train", ["--resume", "{run}", "--set", "model.num_layers=3"],
     "--set model.num_layers=3 changes the model's parameters (shape or dtype)"),
    ("train", ["--resume", "{run}", "--set", "model.param_dtype=bfloat16"],
     "--set model.param_dtype=bfloat16 changes the model's parameters (shape or dtype)"),
    ("train", ["--resume", "{run}", "--set", "train.steps=6", "--set", "optim.clip_norm=0"],
     "changes the optimizer state's layout (optim.clip_norm turned on or off)"),
    ("train", ["--resume", "{run}", "--set", "train.steps=1"], "is at step 4 and train.steps=1: nothing to train"),
    ("train", ["--resume", "{run}"], "is at step 4 and train.steps=4: nothing to train"),
    ("train", [*TRAIN, "--set", "model.lora_rank=-1"], "model.lora_rank=-1 must be >= 0"),
    ("train", [*TRAIN, "--set", "model.lora_rank=4"], "model.lora_rank freezes a base model"),
    ("train", ["--init-from", "{run}", "--workdir", "{new}", "--set", "model.lora_rank=4", "--set",
               "model.lora_targets=nosuch"], "model.lora_targets='nosuch' matches no layer of this model; layers:"),
    ("train", ["--init-from", "{run}", "--workdir", "{new}", "--set", "train.trainable=nosuch"],
     "train.trainable='nosuch' matches no parameter"),
    ("train", [*TRAIN, "--set", "train.trainable=("], "train.trainable='(' is not a regular expression"),
    ("train", [*TRAIN, "--set", "task=sft", "--set", "data.source={bad_chats}"],
     "row 0 of data.messages_column='messages'"),
    ("train", [*TRAIN, "--set", "task=sft", "--set", "data.source={chats}", "--set", "data.chat_template={raising}"],
     "the chat template ({raising}) failed: TemplateError: no chat here"),
    ("train", [*TRAIN, "--set", "task=sft", "--set", "data.source={chats}", "--set", "data.chat_template={binary}"],
     "data.chat_template='{binary}' is not a text file (byte 128 is not UTF-8)"),
    # Config-time bounds (issue "trust, round two"), each before any model is built.
    ("train", ["{exits}"], "config file '{exits}' called sys.exit(0) while loading"),
    ("train", [*TRAIN, "--set", "train.seed=99999999999999999999"],
     "train.seed=99999999999999999999 is too large (at most 2147483647)"),
    ("train", [*TRAIN, "--set", "train.steps=1e30"], "is too large (at most 2147483647)"),
    ("train", [*TRAIN, "--set", "model.vocab_size=10"], "model.vocab_size=10 is smaller than the vocabulary of "
                                                        "data.tokenizer='bytes' (257)"),
    ("train", [*TRAIN, "--set", "model.attention_impl=cudnn"], "model.attention_impl='cudnn' needs an NVIDIA GPU"),
    ("train", [*TRAIN, "--set", "data.cache_dir=/proc/x"], "data.cache_dir='/proc/x' is not a writable directory"),
    ("sample", ["{run}", "--max-new-tokens", "-1"], "max-new-tokens=-1"),
    ("sample", ["{run}", "--max-new-tokens", "0"], "max-new-tokens=0"),
    ("sample", ["{run}", "--num-samples", "0"], "num-samples=0"),
    ("sample", ["{run}", "--temperature", "nan"], "temperature"),
    ("sample", ["{run}", "--temperature", "inf"], "temperature"),
    ("sample", ["{run}", "--top-k", "1000000000"], "top_k=1000000000 is above the vocabulary's"),
    ("fill-mask", ["{run}", "--text", "a [MASK]", "--out", "/proc/x.jsonl"], "--out='/proc/x.jsonl': cannot write in"),
    # Issue 45: a model of another family, before any sampling (presets: fresh weights, no run trained).
    ("sample", ["bert_tiny"], ".generate needs a decoder (GPT family); 'bert_tiny' is a bert model"),
    ("sample", ["encdec_tiny"], ".generate needs a decoder (GPT family); 'encdec_tiny' is a"),
    # zoo-lm-eval's model_args, checked before the harness indexes its tasks or loads the run; then a task it lacks.
    ("lm-eval", ["--model_args", "run={run},stride=1000", "--tasks", "x"],
     "model_args stride=1000 must be at most max_length (32)"),
    ("lm-eval", ["--model_args", "run={run}", "--batch_size", "0", "--tasks", "x"], "--batch_size '0': give a whole"),
    ("lm-eval", ["--model_args", "run={run},batch_size=4", "-b", "2", "--tasks", "x"],
     "batch_size is given twice (model_args batch_size=4 and --batch_size 2)"),
    ("lm-eval", ["--model_args", "run={bert_hf}", "--tasks", "x"],
     "--model zoo scores GPT-family runs; {bert_hf} is a bert run"),
    ("lm-eval", ["--model_args", "run={run}", "--tasks", "nosuch_task"],
     "--tasks: nosuch_task: no such task in lm_eval's index; list the valid names with `zoo-lm-eval ls tasks`"),
    ("eval", ["{run}", "--data", "{chats}", "--cache-dir", "/proc/x"], "--cache-dir='/proc/x' is not a writable "
                                                                      "directory"),
    ("convert", ["from-hf", "{hf}", "{new}"], "'{hf}/config.json' is not JSON"),
    ("convert", ["to-hf", "{run}", "{full}"], "'{full}'"),
    ("convert", ["to-hf", "{run}", "{a_file}"], "'{a_file}'"),
]
MAINS = {"train": train_main, "sample": sample.main, "convert": convert.main, "fill-mask": fill_mask.main,
         "lm-eval": lm_eval.main, "eval": zoo_eval.main}


@pytest.mark.parametrize("command, args, fragment", ROWS, ids=[f"{c} {' '.join(a)}" for c, a, _ in ROWS])
def test_bad_input_is_one_error_line(done, tmp_path, capsys, cache_dir, command, args, fragment):
    paths = {k: str(v) for k, v in files(tmp_path).items()} | {"run": done}
    argv = [a.format(**paths) for a in args]
    if command == "train" and "--resume" not in argv and not any(a.startswith("data.cache_dir") for a in argv):
        argv += ["--set", f"data.cache_dir={cache_dir}"]
    before = sorted(os.listdir(done)), open(os.path.join(done, "config.json")).read()
    assert MAINS[command](argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert fragment.format(**paths) in err[0]
    assert "Traceback" not in err[0]
    assert not os.path.exists(paths["new"])  # nothing half-made
    assert (sorted(os.listdir(done)), open(os.path.join(done, "config.json")).read()) == before
    assert json.loads(open(os.path.join(done, "config.json")).read())["train"]["steps"] == 4
