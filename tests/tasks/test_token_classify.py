"""The bert_tokens task: entity spans and scores (zoo.tasks.entities) against hand-computed cases and seqeval,
word labels aligned to pieces as Hugging Face's token-classification guide aligns them, the loss over
labelled positions only, bad word-tagged data refused in one line, the built-in synthetic set, a few steps
of training raising entity F1, and zoo-eval on the run (tags matched by name). HF conversion:
tests/hf/test_bert_token_classification.py."""

import json
import math

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

from conftest import replace
from tests.helpers.runs import run, write_jsonl
from tests.helpers.tiny_configs import bert as cfg_for
from zoo import tasks
from zoo.cli import eval as eval_cli
from zoo.configuration import DataConfig
from zoo.data import ner
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ZooDataError
from zoo.tasks import entities
from zoo.tasks import mlm
from zoo.tasks import token_classify as tc

IGNORE = entities.IGNORE


def tokens_cfg(tmp_path, source="builtin", **data):
    """The tiny BERT of tests/helpers/tiny_configs.py as a tagger over words and tags (7 tags)."""
    cfg = cfg_for("bert_tokens", str(tmp_path / "cache"), source=source,
                  **{"text_column": "tokens", "label_column": "ner_tags", **data})
    return replace(cfg, model=dict(num_classes=7))


# ---- spans and scores -----------------------------------------------------------------------------
@pytest.mark.parametrize("tags, want", [
    ("B-PER I-PER O B-LOC", [("PER", 0, 1), ("LOC", 3, 3)]),
    ("O B-LOC I-LOC", [("LOC", 1, 2)]),  # open at the end: closed there
    ("I-PER I-PER O", [("PER", 0, 1)]),  # I- after nothing / O starts a span (conlleval's lenient IOB2)
    ("B-PER I-LOC I-LOC", [("PER", 0, 0), ("LOC", 1, 2)]),  # a change of type closes and opens
    ("B-PER B-PER I-PER", [("PER", 0, 0), ("PER", 1, 2)]),  # B- always opens a new span
    ("O I-ORG B-ORG O", [("ORG", 1, 1), ("ORG", 2, 2)]),
    ("O O", []),
])
def test_spans_are_iob2_chunks(tags, want):
    assert entities.spans(tags.split()) == want


def test_scores_are_hand_computed_span_matches():
    true = ["B-PER I-PER O B-LOC".split(), "B-ORG I-ORG O".split(), "B-LOC I-LOC".split()]
    pred = ["B-PER O O B-LOC".split(),  # PER cut short: no match; LOC matches
            "B-ORG B-ORG O".split(),  # B/I mismatch: two ORG spans of one word, neither is the true one
            "B-LOC I-LOC".split()]  # exact
    s = entities.scores(entities.counts(true, pred))
    # true spans: PER, LOC | ORG | LOC = 4; predicted: PER, LOC | ORG, ORG | LOC = 5; matched: the two LOC
    assert (s["precision"], s["recall"]) == (pytest.approx(2 / 5), pytest.approx(2 / 4))
    assert s["f1"] == pytest.approx(2 * 0.4 * 0.5 / 0.9)
    assert s["accuracy"] == pytest.approx(7 / 9)  # words: 3/4 + 2/3 + 2/2 right
    assert s["per_type"]["LOC"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 2}
    assert s["per_type"]["ORG"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert s["per_type"]["PER"]["precision"] == 0.0 and s["per_type"]["PER"]["support"] == 1
    # A type mismatch over the right words matches nothing; no predicted span scores 0, not a division error.
    assert entities.scores(entities.counts([["B-LOC", "I-LOC"]], [["B-LOC", "I-ORG"]]))["f1"] == 0.0
    assert entities.scores(entities.counts([["B-LOC"]], [["O"]]))["precision"] == 0.0


def test_scores_equal_seqeval_on_random_sequences():
    metrics = pytest.importorskip("seqeval.metrics", reason="seqeval is not installed (pip install seqeval)")
    rng = np.random.default_rng(0)
    names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
    true = [[names[i] for i in rng.choice(7, n, p=[.5, .1, .1, .1, .05, .1, .05])] for n in rng.integers(1, 12, 200)]
    pred = [[t if rng.random() < 0.7 else names[rng.integers(7)] for t in row] for row in true]
    s = entities.scores(entities.counts(true, pred))
    assert s["precision"] == pytest.approx(metrics.precision_score(true, pred))
    assert s["recall"] == pytest.approx(metrics.recall_score(true, pred))
    assert s["f1"] == pytest.approx(metrics.f1_score(true, pred))
    report = metrics.classification_report(true, pred, output_dict=True)
    for typ, got in s["per_type"].items():
        assert got["f1"] == pytest.approx(report[typ]["f1-score"]) and got["support"] == report[typ]["support"]


def test_iob_names_only_get_span_scores():
    assert entities.is_iob(list(ner.TAGS))
    assert not entities.is_iob(["NOUN", "VERB", "O"]) and not entities.is_iob(["O"])
    assert not entities.is_iob(["O", "B-PER", "E-PER"])  # IOBES is not read as IOB2


# ---- data: alignment, the built-in set, errors ------------------------------------------------------
def test_labels_sit_on_each_words_first_piece(tmp_path, capsys):
    tok = get_tokenizer("bytes")
    sp, N = mlm.bert_specials(tok), IGNORE
    ex, cut = tc.encode(tok, sp, [["Ada", "met", "Al"], ["Ada", "met", "Al"]], [np.array([1, 3, 1])] * 2, 12)
    # [CLS] Ada met Al [SEP] [PAD] [PAD]: bytes, no spaces; the tag on each word's first byte
    np.testing.assert_array_equal(ex.ids[0], [sp.cls, *b"Ada", *b"met", *b"Al", sp.sep, sp.pad, sp.pad])
    np.testing.assert_array_equal(ex.labels[0], [N, 1, N, N, 3, N, N, 1, N, N, N, N])
    assert cut == 0 and ex.lengths.tolist() == [10, 10]
    ex, cut = tc.encode(tok, sp, [["Ada", "met", "Al"]], [np.array([1, 3, 1])], 6)  # cut inside "met"
    np.testing.assert_array_equal(ex.ids[0], [sp.cls, *b"Ada", ord("m"), sp.sep])
    np.testing.assert_array_equal(ex.labels[0], [N, 1, N, N, 3, N])
    assert cut == 1
    # Through the task: string tags get sorted ids, batches carry [B, T] labels.
    rows = [{"tokens": ["Ada", "met", f"w{i}"], "ner_tags": ["B-PER", "O", "O"]} for i in range(30)]
    rows += [{"tokens": ["in", "New", "York", f"w{i}"], "ner_tags": ["O", "B-LOC", "I-LOC", "O"]} for i in range(30)]
    cfg = replace(tokens_cfg(tmp_path, write_jsonl(tmp_path / "d.jsonl", rows)), model=dict(num_classes=4))
    data = tasks.build(cfg).make_data(cfg, 0, 1)
    assert json.loads(data.files["labels.json"]) == ["B-LOC", "B-PER", "I-LOC", "O"]
    b = data.train(0)
    assert {k: v.shape for k, v in b.items()} == {"inputs": (16, 32), "valid": (16, 32), "segment_ids": (16, 32),
                                                  "labels": (16, 32), "weights": (16,)}
    assert not b["segment_ids"].any() and ((b["labels"] != N) <= b["valid"]).all()
    assert sorted(np.unique(b["labels"][:, 1])) == [1, 3]  # B-PER on "A", O on "i"
    np.testing.assert_array_equal((b["labels"] != N).sum(1), np.where(b["labels"][:, 1] == 1, 3, 4))


def test_a_byte_level_bpe_gets_each_word_with_a_leading_space():
    class Bpe:  # " the" is one token, as "the": a leading space folds into the word
        def encode(self, text):
            return [len(text)]

        def encode_batch(self, texts):
            return [[hash(t) % 1000] for t in texts]

    words = ["New", "York"]
    assert tc.word_pieces(Bpe(), words) == Bpe().encode_batch([" New", " York"])
    bytes_tok = get_tokenizer("bytes")  # " the" is 4 bytes: no space
    assert tc.word_pieces(bytes_tok, words) == [list(b"New"), list(b"York")]


def test_builtin_set_and_tags_read_from_its_class_label(tmp_path, capsys):
    ds = ner.builtin_examples()
    assert len(ds) == ner.NUM_SENTENCES and ds.features["ner_tags"].feature.names == list(ner.TAGS)
    assert ds[:50] == ner.builtin_examples()[:50]  # the same sentences every time
    tags = np.concatenate([np.asarray(t) for t in ds["ner_tags"]])
    assert np.bincount(tags, minlength=7).min() > 300  # every tag, I- of each type included
    cfg = replace(tokens_cfg(tmp_path), model=dict(num_classes=0))
    assert tasks.check_data(cfg).model.num_classes == 7
    assert "model.num_classes=7 from data.label_column='ner_tags' (O, B-PER" in capsys.readouterr().out


@pytest.mark.parametrize("rows, data, culprit", [
    ([{"tokens": ["a", "b"], "ner_tags": ["O"]}] * 4, {}, "row 0 has 2 words in data.text_column='tokens' but 1 tags"),
    ([{"tokens": ["a"], "ner_tags": ["X"]}] * 4, {"label_names": "O,B-PER"}, "tags X that are not in data.label_names"),
    ([{"tokens": "a b", "ner_tags": ["O"]}] * 4, {}, "data.text_column='tokens' of"),
    ([{"tokens": ["a"], "tags": ["O"]}] * 4, {}, "data.label_column='ner_tags' is not a column"),
    ([{"tokens": ["a"], "ner_tags": ["O"]}, {"tokens": [], "ner_tags": []}] * 2, {},
     "row 1 of data.text_column='tokens' has no words"),
    ([{"tokens": ["a"], "ner_tags": [9]}] * 4, {}, "holds tag 9 (or a negative one), outside model.num_classes=7"),
    ([{"tokens": ["a"], "ner_tags": [0.5]}] * 4, {}, "holds lists of Value('float64'), not int or string tags"),
    ([{"tokens": ["a"], "ner_tags": ["O"]}] * 4, {"text_pair_column": "b"}, "bert_tokens tags one column of words"),
])
def test_bad_word_tagged_data_names_the_culprit(tmp_path, rows, data, culprit):
    cfg = tokens_cfg(tmp_path, write_jsonl(tmp_path / "d.jsonl", rows), **data)
    with pytest.raises(ZooDataError) as e:
        tasks.check_data(cfg)
    assert culprit in str(e.value) and "\n" not in str(e.value)


# ---- loss and learning ----------------------------------------------------------------------------
def test_loss_reads_labelled_positions_only(tmp_path):
    cfg = tokens_cfg(tmp_path)
    task = tasks.build(cfg)
    params = nn.unbox(task.init(jax.random.PRNGKey(0)))
    head = params["token_head"]["out"]
    params["token_head"]["out"] = {**head, "kernel": jax.random.normal(jax.random.PRNGKey(1), head["kernel"].shape)}
    b = {k: v[:4] for k, v in task.make_data(cfg, 0, 1).train(0).items()}
    b["weights"][3] = 0.0  # a padding row: its labels count for nothing
    loss_sum, aux = jax.jit(task.loss, static_argnums=3)(params, b, jax.random.PRNGKey(0), False)
    logits = jax.jit(task.model.apply)({"params": params}, b["inputs"], b["segment_ids"], b["valid"])
    at = (b["labels"] != IGNORE) & (b["weights"][:, None] > 0)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, np.maximum(b["labels"], 0))
    assert float(loss_sum) == pytest.approx(float(ce[at].sum()), rel=1e-5)
    assert float(aux["weight"]) == at.sum() < (b["valid"] & (b["weights"][:, None] > 0)).sum()
    assert float(aux["correct"]) == (np.argmax(logits, -1) == b["labels"])[at].sum()
    assert math.isfinite(float(loss_sum))


def test_a_few_steps_raise_entity_f1_and_zoo_eval_scores_the_run(tmp_path, capsys):
    cfg = replace(tokens_cfg(tmp_path, seq_len=64), model=dict(dropout=0.0), optim=dict(lr=5e-3, warmup=5),
                  train=dict(steps=60, batch_size=16, eval_every=60, eval_batches=4, log_every=20, save_every=60))
    task = tasks.build(cfg)
    data = task.make_data(cfg, 0, 1)
    before = task.evaluate_extra(nn.unbox(task.init(jax.random.PRNGKey(0))), data)
    assert before["eval_entity_f1"] == 0.0  # a fresh (zero) head says O everywhere: no span
    out = run(cfg, tmp_path / "run", devices=jax.devices()[:1])
    assert out["eval"]["eval_entity_f1"] > 0.3, out["eval"]
    # zoo-eval on 40 built-in rows given as string tags: matched to the run's tags by name, equal to the ids.
    rows = ner.builtin_examples().select(range(40))
    src = write_jsonl(tmp_path / "strings.jsonl", [{"words": r["tokens"], "tags": [ner.TAGS[t] for t in r["ner_tags"]]}
                                                   for r in rows])
    assert eval_cli.main([str(tmp_path / "run"), "--data", src, "--text-column", "words", "--label-column", "tags",
                          "--json"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    model, params, tok, run_cfg = eval_cli._load(str(tmp_path / "run"), "bert_tokens")
    want = tc.evaluate_source(model, params, tok, list(ner.TAGS), DataConfig(
        source="builtin", text_column="tokens", label_column="ner_tags"), max_rows=40, batch_size=8)
    assert got["examples"] == 40 and got["f1"] == pytest.approx(want["f1"]) and got["f1"] > 0.3
    assert set(got["per_type"]) == {"PER", "LOC", "ORG"}
    misc = write_jsonl(tmp_path / "misc.jsonl", [{"words": ["Oslo"], "tags": ["B-MISC"]}])
    assert eval_cli.main([str(tmp_path / "run"), "--data", misc, "--text-column", "words", "--label-column",
                          "tags"]) == 2
    assert "holds tags B-MISC that the run does not know; its tags: O, B-PER" in capsys.readouterr().err
