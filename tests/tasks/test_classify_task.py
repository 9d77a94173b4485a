"""The bert_cls task: the built-in labelled set, labelled data from files (string labels, pairs, padding,
truncation) and its errors, per-class sums that give macro-F1, and a separable task learnt to >= 95%.
init_from a pretrained encoder: tests/train/test_init_from.py; the CLIs: tests/cli/test_bert_cli.py; the
trainer's invariants for bert_mlm and bert_cls: tests/train/test_invariants.py."""

import json
import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import replace
from tests.helpers.runs import run, write_jsonl
from tests.helpers.tiny_configs import bert as cfg_for
from zoo import tasks
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ZooDataError
from zoo.tasks import classify as classify_data
from zoo.tasks import mlm


# ---- classification data ------------------------------------------------------------------------
def test_builtin_labelled_set_is_balanced_and_unambiguous():
    ds = classify_data.builtin_examples()
    counts = np.bincount(ds["label"], minlength=4)
    assert ds.features["label"].names == list(classify_data.TOPIC_FAMILIES) and len(ds) > 1500
    assert counts.min() > 0.15 * len(ds)  # no family below 15%
    assert len(set(ds["text"])) == len(ds)  # each paragraph once, under one family


def test_string_labels_pairs_padding_and_truncation(tmp_path, capsys):
    rows = [{"a": "x" * (5 + i % 20), "b": "yy", "y": ["neg", "pos"][i % 2]} for i in range(40)]
    rows[3]["a"] = "z" * 100  # longer than seq_len=32: cut, and counted
    src = write_jsonl(tmp_path / "d.jsonl", rows)
    cfg = replace(cfg_for("bert_cls", str(tmp_path)), data=dict(source=src, text_column="a", text_pair_column="b",
                                                                label_column="y"), model=dict(num_classes=2))
    data = tasks.build(cfg).make_data(cfg, 0, 1)
    assert "truncated 1 of 40 examples to data.seq_len=32" in capsys.readouterr().out
    assert json.loads(data.files["labels.json"]) == ["neg", "pos"]
    b = data.train(0)
    assert {k: v.shape for k, v in b.items()} == {"inputs": (16, 32), "valid": (16, 32), "segment_ids": (16, 32),
                                                  "labels": (16,), "weights": (16,)}
    sp = mlm.bert_specials(get_tokenizer("bytes"))
    row, n = b["inputs"][0], b["valid"][0].sum()
    assert row[0] == sp.cls and row[n - 1] == sp.sep and (row[n:] == sp.pad).all()
    assert (b["segment_ids"][0][:n] == (np.arange(n) > n - 4)).all()  # b = "yy" [SEP]: the last three
    lengths = b["valid"].sum(1)
    a_len = lengths - 5  # [CLS] a [SEP] y y [SEP]; text i is 5 + i % 20 long with label ["neg", "pos"][i % 2]
    short = lengths < 32  # not the truncated row
    np.testing.assert_array_equal(b["labels"][short], (a_len[short] - 5) % 2)  # "neg" -> 0, "pos" -> 1 (sorted)
    again = tasks.build(cfg).make_data(cfg, 0, 1).train(0)
    assert all(np.array_equal(b[k], again[k]) for k in b)


def test_truncation_is_longest_first():
    a, b = classify_data.truncate(list(range(10)), [0] * 3, 8)
    assert (len(a), len(b)) == (5, 3)
    a, b = classify_data.truncate(list(range(10)), [0] * 9, 8)
    assert (len(a), len(b)) == (4, 4)


@pytest.mark.parametrize("rows, data, culprit", [
    ([{"txt": "a", "label": 0}] * 4, {}, "data.text_column='text' is not a column"),
    ([{"text": "a", "lab": 0}] * 4, {}, "data.label_column='label' is not a column"),
    ([{"text": "a", "label": 0}] * 4, {"text_pair_column": "b"}, "data.text_pair_column='b' is not a column"),
    ([{"text": "a", "label": i} for i in (0, 1, 4, 2)], {}, "label 4 (row 2) of data.label_column='label' is "
                                                             "outside model.num_classes=4"),
    ([{"text": "a", "label": s} for s in "abcde"], {}, "has 5 classes (a, b, c, d, e) but model.num_classes=4"),
    ([{"text": "a", "label": s} for s in "abca"], {"label_names": "a,b"}, "labels c that are not in data.label_names"),
    ([{"text": t, "label": 0} for t in ("a", " ", "b")], {}, "row 1 of data.text_column='text' is empty"),
    ([{"text": "a", "label": 0.5}] * 4, {}, "holds Value('float64'), not int or string labels"),
])
def test_bad_labelled_data_names_the_culprit(tmp_path, rows, data, culprit):
    cfg = replace(cfg_for("bert_cls", str(tmp_path)), data=dict(source=write_jsonl(tmp_path / "d.jsonl", rows),
                                                                **data))
    with pytest.raises(ZooDataError) as e:
        tasks.build(cfg).make_data(cfg, 0, 1)
    assert culprit in str(e.value) and "\n" not in str(e.value)


def test_training_data_of_one_class_is_refused(tmp_path):
    """A label column with one distinct value would train a 1-class classifier at loss 0: refused by name."""
    rows = [{"text": f"text {i}", "label": "spam"} for i in range(6)]
    cfg = replace(cfg_for("bert_cls", str(tmp_path)), data=dict(source=write_jsonl(tmp_path / "d.jsonl", rows)))
    with pytest.raises(ZooDataError) as e:
        tasks.check_data(cfg)
    assert "data.label_column='label'" in str(e.value) and "holds one class only (spam) in its 6 rows" in str(e.value)
    two = rows[:5] + [{"text": "text 5", "label": "ham"}]
    cfg = replace(cfg, data=dict(source=write_jsonl(tmp_path / "e.jsonl", two)))
    assert tasks.check_data(cfg).model.num_classes >= 2


def test_vocab_too_small_for_the_specials(tmp_path):
    cfg = replace(cfg_for("bert_cls", str(tmp_path)), model=dict(vocab_size=257))
    with pytest.raises(ZooDataError, match=r"model.vocab_size=257 is smaller"):
        tasks.build(cfg).make_data(cfg, 0, 1)


def test_per_class_sums_give_macro_f1(cache_dir):
    cfg = cfg_for("bert_cls", cache_dir)
    task = tasks.build(cfg)
    params = nn.unbox(task.init(jax.random.PRNGKey(0)))
    batch = {"inputs": np.zeros((4, 32), np.int32), "segment_ids": np.zeros((4, 32), np.int32),
             "valid": np.ones((4, 32), bool), "labels": np.array([0, 0, 1, 2], np.int32),
             "weights": np.array([1, 1, 1, 0], np.float32)}
    loss_sum, aux = jax.jit(task.loss, static_argnums=3)(params, batch, jax.random.PRNGKey(0), False)
    # A fresh head outputs zeros: loss ln C per example, and argmax picks class 0 for every row.
    assert float(loss_sum) == pytest.approx(3 * math.log(4), rel=1e-6)
    got = {k: float(v) for k, v in aux.items()}
    assert (got["weight"], got["correct"], got["tokens"]) == (3, 2, 96)
    assert (got["tp_0"], got["pred_0"], got["true_0"], got["true_1"], got["true_2"]) == (2, 3, 2, 1, 0)
    # F1: class 0 = 2*2/(3+2) = 0.8, class 1 = 0 (absent from predictions, present in labels); class 2 unseen.
    assert task.eval_metrics(got)["eval_macro_f1"] == pytest.approx(0.4)


# ---- learning -----------------------------------------------------------------------------------
def test_tiny_classifier_learns_a_separable_task(tmp_path):
    rng = np.random.default_rng(0)
    noise = lambda: "".join(rng.choice(list("abcdefgh "), 20))
    rows = [{"text": f"{noise()} {word} {noise()}", "label": word}
            for word in ("red", "blue") for _ in range(300)]
    cfg = replace(cfg_for("bert_cls", str(tmp_path), source=write_jsonl(tmp_path / "d.jsonl", rows),
                          val_fraction=0.2, seq_len=64),
                  model=dict(num_classes=2, dropout=0.0), optim=dict(lr=3e-3, warmup=10),
                  train=dict(steps=120, batch_size=32, eval_every=120, eval_batches=8, log_every=20, save_every=1000))
    out = run(cfg, tmp_path / "run")
    assert out["eval"]["eval_accuracy"] >= 0.95, out["eval"]
