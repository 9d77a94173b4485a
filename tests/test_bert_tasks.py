"""BERT tasks on the one trainer: classification data and its errors, a separable task learnt to
>= 95%, MLM -> fine-tune through train.py and the CLIs, init_from errors, macro-F1 sums, and the
foundation's 1-vs-8-device and exact-resume checks for both bert_mlm and bert_cls."""

import dataclasses
import json
import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import replace
from zoo import checkpoint, classify, classify_data, cli, fill_mask, mlm, tasks, trainer
from zoo.config import Config, ConfigError, DataConfig, GptConfig, OptimConfig, TrainConfig
from zoo.data import ZooDataError, get_tokenizer
from zoo.models.bert import BERT_TINY

MODEL = dataclasses.replace(BERT_TINY, vocab_size=264, max_len=64, num_layers=2, d_model=32, num_heads=2, d_ff=64,
                            dropout=0.1, num_classes=4)
TRAIN = dict(steps=6, batch_size=16, log_every=1, eval_every=0, eval_batches=2, save_every=3, keep=5)


def cfg_for(task, cache_dir, source="builtin", **data):
    return Config(task=task, model=MODEL,
                  data=DataConfig(**{"source": source, "tokenizer": "bytes", "seq_len": 32, "cache_dir": cache_dir,
                                     **data}),
                  optim=OptimConfig(lr=1e-3, schedule="linear", warmup=2, weight_decay=0.01),
                  train=TrainConfig(**TRAIN))


def run(cfg, workdir, **kw):
    return trainer.train(cfg, str(workdir), progress=False, **kw)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# ---- classification data ------------------------------------------------------------------------
def test_builtin_labelled_set_is_balanced_and_unambiguous():
    ds = classify_data.builtin_examples()
    counts = np.bincount(ds["label"], minlength=4)
    assert ds.features["label"].names == list(classify_data.FAMILIES) and len(ds) > 1500
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
    sp = mlm.specials(get_tokenizer("bytes"))
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


def test_mlm_then_fine_tune_through_train_py_and_the_clis(cache_dir, tmp_path, capsys):
    mlm_dir, cls_dir = str(tmp_path / "mlm"), str(tmp_path / "cls")
    common = [f"--set=data.cache_dir={cache_dir}", "--set=train.steps=4", "--set=train.log_every=2",
              "--set=train.eval_every=4", "--set=train.eval_batches=2", "--set=train.batch_size=8"]
    assert cli.train_main(["configs/bert_tiny_mlm.py", "--workdir", mlm_dir, *common]) == 0
    assert cli.train_main(["configs/bert_tiny_cls.py", "--workdir", cls_dir, f"--set=init_from={mlm_dir}",
                           *common]) == 0
    capsys.readouterr()
    assert classify.main([cls_dir, "--text", "The for statement iterates over a sequence"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert sorted(line.split("  ", 1)[1] for line in lines) == sorted(classify_data.FAMILIES)
    assert sum(float(line.split()[0]) for line in lines) == pytest.approx(1.0, abs=2e-3)
    assert fill_mask.main([mlm_dir, "--text", "The [MASK]or statement", "--top-k", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("[MASK] 1: ") and len(out[1].split("  ")) == 3
    # Bad CLI input: one line on stderr, exit status 2.
    assert classify.main([mlm_dir, "--text", "x"]) == 2
    assert fill_mask.main([mlm_dir, "--text", "no mask here"]) == 2
    assert fill_mask.main([mlm_dir, "--text", "[MASK]" + "x" * 200]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "holds a bert_mlm run; this command needs a bert_cls run" in err[0]
    assert "has no [MASK]" in err[1] and "more than the model's max_len=128" in err[2]


def test_init_from_copies_the_encoder_and_refuses_other_families_and_widths(cache_dir, tmp_path):
    src = run(cfg_for("bert_mlm", cache_dir), tmp_path / "mlm")["state"].params
    cls_cfg = cfg_for("bert_cls", cache_dir)
    s = trainer.setup(cls_cfg, jax.devices()[:1])
    state = trainer.init_from(s, s.init_state(jax.random.PRNGKey(7)), str(tmp_path / "mlm"))
    np.testing.assert_array_equal(jax.device_get(state.params["bert"]["encoder"]["layer_1"]["mlp"]["fc"]["kernel"]),
                                  jax.device_get(src["bert"]["encoder"]["layer_1"]["mlp"]["fc"]["kernel"]))
    np.testing.assert_array_equal(jax.device_get(state.params["bert"]["embed"]["word"]["embedding"]),
                                  jax.device_get(src["bert"]["embed"]["word"]["embedding"]))
    assert not np.any(jax.device_get(state.params["cls_head"]["out"]["kernel"]))  # the head starts fresh
    wider = replace(cls_cfg, model=dict(d_model=64))
    s2 = trainer.setup(wider, jax.devices()[:1])
    with pytest.raises(ConfigError, match=r"param \['bert'\].* has shape .* \(model width or size differs\)"):
        trainer.init_from(s2, s2.init_state(jax.random.PRNGKey(0)), str(tmp_path / "mlm"))
    gpt = Config(task="gpt_lm", model=GptConfig(vocab_size=264, max_len=32, num_layers=1, d_model=32, num_heads=2,
                                                d_ff=64), data=cls_cfg.data, train=TrainConfig(**{**TRAIN, "steps": 1}))
    run(gpt, tmp_path / "gpt")
    with pytest.raises(ConfigError, match="holds a gpt model; this config trains a bert model"):
        trainer.init_from(s, s.init_state(jax.random.PRNGKey(0)), str(tmp_path / "gpt"))


# ---- the foundation's invariants, for both tasks ------------------------------------------------
@pytest.mark.parametrize("task", ["bert_mlm", "bert_cls"])
@pytest.mark.parametrize("mesh", [(2, 2, 2)])  # (8,1,1) and (2,4,1) are covered for gpt_lm by test_trainer
def test_eight_devices_match_one(cache_dir, tmp_path, task, mesh):
    cfg = replace(cfg_for(task, cache_dir), train=dict(steps=3))
    one = run(replace(cfg, mesh=dict(data=1, fsdp=1, tensor=1)), tmp_path / "one", devices=jax.devices()[:1])
    d, f, t = mesh
    many = run(replace(cfg, mesh=dict(data=d, fsdp=f, tensor=t)), tmp_path / "many")
    assert many["setup"].mesh.devices.size == 8
    assert [r["loss"] for r in many["records"]] == pytest.approx([r["loss"] for r in one["records"]], rel=1e-5)
    for a, b in zip(jax.tree.leaves(jax.device_get(many["state"].params)),
                    jax.tree.leaves(jax.device_get(one["state"].params))):
        # atol: key biases get an exactly-zero gradient, so they hold Adam-normalised rounding noise.
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("task", ["bert_mlm", "bert_cls"])
def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(cache_dir, tmp_path, task):
    cfg = cfg_for(task, cache_dir)  # dropout on: the per-step rng must be replayed too
    full = run(cfg, tmp_path / "full")
    part = run(cfg, tmp_path / "part", stop_at_step=3)
    assert int(part["state"].step) == 3 and checkpoint.latest_step(str(tmp_path / "part")) == 3
    resumed = run(cfg, tmp_path / "part", resume=True)
    assert int(resumed["state"].step) == 6
    for a, b in zip(jax.tree.leaves(jax.device_get(full["state"])), jax.tree.leaves(jax.device_get(resumed["state"]))):
        np.testing.assert_array_equal(a, b)
    assert [r["loss"] for r in resumed["records"]] == [r["loss"] for r in full["records"]][3:]
