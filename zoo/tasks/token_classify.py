"""Token classification (bert_tokens: NER, POS tagging) on BertTokenClassifier: word-tagged data -> padded
[CLS] rows with a label on each word's first piece, loss over those positions, entity F1 after evaluation.

Sources are those of bert_cls (`hub:NAME[/CONFIG]`, local json/jsonl/parquet, zoo.tasks.classify) with a
column of words (data.text_column, e.g. conll2003's `tokens`) and a column of as many tags
(data.label_column, e.g. `ner_tags`). Tags may be ints (a `datasets.ClassLabel` inside the list brings
their names, as conll2003's) or strings; string tags get ids in the order of data.label_names when given,
else in sorted order. `builtin` is the synthetic offline set of zoo.data.ner.

Words are cut into pieces one by one (a byte-level BPE gets each word with a leading space, as Hugging
Face's add_prefix_space does), and labels are aligned as the Hugging Face token-classification guide
aligns them: a word's tag on its first piece, IGNORE (-100) on its other pieces, [CLS], [SEP] and
padding; the loss and the token accuracy read labelled positions only (weight = their count). Rows longer
than data.seq_len are cut (counted, printed once); the words cut off are neither trained nor scored.
Validation rows are held out by a hash of their words (data.val_fraction). After each evaluation,
entity precision / recall / F1 (zoo.tasks.entities: seqeval's IOB2 spans) of the validation batches are
added when the tag names are IOB2; eval_accuracy is the accuracy over words.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import datasets
import jax.numpy as jnp
import numpy as np
import optax

from zoo.data import corpus, ner
from zoo.data.store import doc_hash, val_documents
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ZooDataError
from zoo.tasks import entities
from zoo.tasks.entities import IGNORE
from zoo.models.bert import BertTokenClassifier
from zoo.tasks.base import Data
from zoo.tasks.classify import ClsBatches, _Encoder, eval_batches
from zoo.tasks.mlm import BertSpecials, bert_specials, check_bert_vocab, check_ids


def load_examples(dcfg) -> datasets.Dataset:
    """The word-tagged source with its word and tag columns checked to exist (no second text column)."""
    if dcfg.text_pair_column:
        raise ZooDataError(f"data.text_pair_column={dcfg.text_pair_column!r}: task bert_tokens tags one column of "
                           f"words; set data.text_pair_column=''")
    ds = ner.builtin_examples() if dcfg.source == "builtin" else \
        corpus.load_hub(dcfg) if dcfg.source.startswith("hub:") else corpus.load_local(dcfg)
    for field in ("text_column", "label_column"):
        col = getattr(dcfg, field)
        if col not in ds.column_names:
            raise ZooDataError(f"data.{field}={col!r} is not a column of {dcfg.source}; columns: "
                               f"{', '.join(ds.column_names)} (bert_tokens reads words and their tags, e.g. "
                               f"data.text_column=tokens data.label_column=ner_tags)")
    return ds


def _inner(ds: datasets.Dataset, dcfg, field: str):
    """The feature of one item of a list column, refused if the column holds no lists."""
    col = getattr(dcfg, field)
    feature = ds.features[col]
    inner = getattr(feature, "feature", None)
    if inner is None or isinstance(inner, dict):
        raise ZooDataError(f"data.{field}={col!r} of {dcfg.source} holds {feature}, not a list per row (bert_tokens "
                           f"reads a list of words and a list of tags per row)")
    return inner


def words_of(ds: datasets.Dataset, dcfg) -> list[list[str]]:
    """The word lists, every row non-empty and every word a string."""
    col = dcfg.text_column
    if getattr(_inner(ds, dcfg, "text_column"), "dtype", None) not in ("string", "large_string"):
        raise ZooDataError(f"data.text_column={col!r} of {dcfg.source} holds {ds.features[col]}, not lists of words")
    rows = ds[col]
    empty = [i for i, r in enumerate(rows) if not r or any(w is None for w in r)]
    if empty:
        raise ZooDataError(f"row {empty[0]} of data.text_column={col!r} has no words or a missing one "
                           f"({len(empty)} such rows); remove them from the source")
    return rows


def tag_ids(ds: datasets.Dataset, dcfg) -> tuple[list[np.ndarray], list[str]]:
    """(tag ids per row, the tag names the data or data.label_names give, in id order; [] for bare ints)."""
    col, inner = dcfg.label_column, _inner(ds, dcfg, "label_column")
    rows = ds[col]
    given = [n.strip() for n in dcfg.label_names.split(",")] if dcfg.label_names else []
    if getattr(inner, "dtype", None) in ("string", "large_string"):
        names = given or sorted({t for r in rows for t in r if t is not None})
        index = {n: i for i, n in enumerate(names)}
        unknown = sorted({str(t) for r in rows for t in r if t not in index})
        if unknown:
            raise ZooDataError(f"data.label_column={col!r} holds tags {', '.join(unknown[:5])} that are not in "
                               f"data.label_names={dcfg.label_names!r}")
        return [np.asarray([index[t] for t in r], np.int64) for r in rows], names
    if isinstance(inner, datasets.ClassLabel) or str(getattr(inner, "dtype", "")).startswith(("int", "uint")):
        names = given or (list(inner.names) if isinstance(inner, datasets.ClassLabel) else [])
        return [np.asarray(r, np.int64) for r in rows], names
    raise ZooDataError(f"data.label_column={col!r} of {dcfg.source} holds lists of {inner}, not int or string tags")


def check_lengths(words: list[list[str]], ids: list[np.ndarray], dcfg) -> None:
    """As many tags as words in every row."""
    bad = next((i for i, (w, t) in enumerate(zip(words, ids)) if len(w) != len(t)), None)
    if bad is not None:
        raise ZooDataError(f"row {bad} has {len(words[bad])} words in data.text_column={dcfg.text_column!r} but "
                           f"{len(ids[bad])} tags in data.label_column={dcfg.label_column!r}")


def resolve_tags(ds: datasets.Dataset, dcfg, num_classes: int) -> tuple[list[np.ndarray], list[str]]:
    """(tag ids per row, tag names in id order padded to num_classes), checked against the words and
    num_classes; num_classes=0 takes the number the data implies."""
    col = dcfg.label_column
    ids, names = tag_ids(ds, dcfg)
    check_lengths(words_of(ds, dcfg), ids, dcfg)
    top = max((int(t.max()) for t in ids if len(t)), default=0)
    num_classes = num_classes or max(len(names), top + 1, 1)
    if len(names) > num_classes:
        raise ZooDataError(f"data.label_column={col!r} has {len(names)} tags ({', '.join(names[:8])}) but "
                           f"model.num_classes={num_classes}")
    bad = next((i for i, t in enumerate(ids) if len(t) and (t.min() < 0 or t.max() >= num_classes)), None)
    if bad is not None:
        raise ZooDataError(f"row {bad} of data.label_column={col!r} holds tag {int(ids[bad].max())} (or a "
                           f"negative one), outside model.num_classes={num_classes}")
    return ids, names + [str(i) for i in range(len(names), num_classes)]


def word_pieces(tokenizer, words: list[str]) -> list[list[int]]:
    """Each word's token ids. A tokenizer that folds a leading space into a word's token (byte-level BPE:
    " the" is one token, as "the") gets every word with one, as Hugging Face's add_prefix_space=True."""
    space = len(tokenizer.encode(" the")) == len(tokenizer.encode("the"))
    return tokenizer.encode_batch([" " + w if space else w for w in words])


@dataclass
class Examples:
    """Framed rows padded to T: ids [N, T], lengths [N], labels [N, T] (IGNORE where no word starts)."""

    ids: np.ndarray
    lengths: np.ndarray
    labels: np.ndarray

    def __len__(self):
        return len(self.ids)

    def rows(self, idx: np.ndarray, weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
        valid_BT = np.arange(self.ids.shape[1])[None] < self.lengths[idx, None]
        return {"inputs": self.ids[idx], "valid": valid_BT, "segment_ids": np.zeros(valid_BT.shape, np.int32),
                "labels": self.labels[idx].astype(np.int32),
                "weights": np.ones(len(idx), np.float32) if weights is None else weights.astype(np.float32)}

    def select(self, mask: np.ndarray) -> "Examples":
        return Examples(self.ids[mask], self.lengths[mask], self.labels[mask])


def encode(tokenizer, sp: BertSpecials, words: list[list[str]], tags: list[np.ndarray],
           seq_len: int) -> tuple[Examples, int]:
    """[CLS] pieces [SEP] rows with aligned labels, padded to seq_len; returns them and how many were cut."""
    flat = word_pieces(tokenizer, [w for row in words for w in row])
    ids = np.full((len(words), seq_len), sp.pad, np.int32)
    labels = np.full((len(words), seq_len), IGNORE, np.int32)
    lengths = np.zeros(len(words), np.int64)
    truncated, k = 0, 0
    for i, (row, tags_W) in enumerate(zip(words, tags)):
        pieces, labelled = [sp.cls], [IGNORE]
        for tag in tags_W:
            p = flat[k]
            k += 1
            pieces += p
            labelled += [int(tag)] + [IGNORE] * (len(p) - 1) if p else []  # a word of no pieces is not seen
        if len(pieces) > seq_len - 1:
            truncated += 1
            pieces, labelled = pieces[:seq_len - 1], labelled[:seq_len - 1]
        pieces.append(sp.sep)
        labelled.append(IGNORE)
        ids[i, :len(pieces)], labels[i, :len(pieces)], lengths[i] = pieces, labelled, len(pieces)
    return Examples(ids, lengths, labels), truncated


def examples(cfg, tokenizer, sp: BertSpecials) -> tuple[Examples, Examples, list[str]]:
    """(train, val, tag names) of the word-tagged source in cfg.data."""
    d = cfg.data
    ds = load_examples(d)
    words = words_of(ds, d)
    tags, names = resolve_tags(ds, d, cfg.model.num_classes)
    if len(words) < 2:
        raise ZooDataError(f"data.source={d.source!r} has {len(words)} example; a train/val split needs 2")
    every, truncated = encode(tokenizer, sp, words, tags, d.seq_len)
    check_ids(every.ids, cfg.model.vocab_size, tokenizer, f"data.source={d.source!r}")
    if truncated:
        print(f"data: truncated {truncated} of {len(words)} examples to data.seq_len={d.seq_len} tokens (the words "
              f"cut off are not trained or scored)", flush=True)
    is_val = val_documents(np.asarray([doc_hash(" ".join(w)) for w in words]), d.val_fraction)
    return every.select(~is_val), every.select(is_val), names


def evaluate_source(model, params, tokenizer, names: list[str], data_cfg, *, batch_size: int = 32,
                    max_rows: int | None = None) -> dict:
    """entities.scores() of a bert_tokens run on a word-tagged source (a DataConfig naming it and its word and tag
    columns), plus {examples, words, truncated}. The source's tags are matched to the run's `names` by name
    (strings, or a ClassLabel's names), bare ints taken as the run's ids; rows are framed as training frames
    them, cut at the model's positions (the words cut off are not scored, and the rows counted)."""
    ds = load_examples(data_cfg)
    if max_rows is not None:
        ds = ds.select(range(min(max_rows, len(ds))))
    if not len(ds):
        raise ZooDataError(f"data.source={data_cfg.source!r} has no rows to score")
    words = words_of(ds, data_cfg)
    ids, theirs = tag_ids(ds, dataclasses.replace(data_cfg, label_names=""))
    check_lengths(words, ids, data_cfg)
    if theirs:  # by name: the source may number its tags otherwise than the run
        index = np.asarray([names.index(n) if n in names else -1 for n in theirs])
        used = sorted({int(t) for r in ids for t in r})
        unknown = [theirs[t] for t in used if t < len(theirs) and index[t] < 0]
        if unknown or (used and used[-1] >= len(theirs)):
            raise ZooDataError(f"data.label_column={data_cfg.label_column!r} holds tags "
                               f"{', '.join(unknown[:5]) or used[-1]} that the run does not know; its tags: "
                               f"{', '.join(names)}")
        ids = [index[r] for r in ids]
    bad = next((i for i, r in enumerate(ids) if len(r) and (r.min() < 0 or r.max() >= len(names))), None)
    if bad is not None:
        raise ZooDataError(f"row {bad} of data.label_column={data_cfg.label_column!r} holds a tag outside the run's "
                           f"{len(names)} tags")
    ex, truncated = encode(tokenizer, bert_specials(tokenizer), words, ids, model.cfg.max_len)
    T = min(model.cfg.max_len, -(-int(ex.lengths.max()) // 8) * 8)  # one padded length for every batch
    ex = Examples(ex.ids[:, :T], ex.lengths, ex.labels[:, :T])
    batches = eval_batches(ex, batch_size, -(-len(ex) // batch_size))
    sums = entities.evaluate(model, params, batches, names)
    return {"examples": len(ex), "words": sums["words"], "truncated": truncated, **entities.scores(sums)}


class TokenTask(_Encoder):
    """Token classification: a tag per word on its first piece (weight = labelled positions); entity
    precision / recall / F1 of the validation batches after each evaluation (evaluate_extra)."""

    name = "bert_tokens"
    PERPLEXITY = False  # exp of a tagging loss is no perplexity of text

    def __init__(self, cfg):
        self.cfg, self.model = cfg, BertTokenClassifier(cfg.model)

    def loss(self, params, batch, rng, train):
        logits_BTC = self.model.apply({"params": params}, batch["inputs"], batch["segment_ids"], batch["valid"],
                                      deterministic=not train, rngs={"dropout": rng})
        labels_BT = batch["labels"]
        w_BT = (labels_BT != IGNORE) * batch["weights"][:, None]
        ce_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTC, jnp.maximum(labels_BT, 0))
        correct = jnp.sum((jnp.argmax(logits_BTC, -1) == labels_BT) * w_BT)
        return jnp.sum(ce_BT * w_BT), {"weight": jnp.sum(w_BT), "correct": correct,
                                       "tokens": jnp.sum(batch["valid"] * batch["weights"][:, None])}

    def evaluate_extra(self, params, data: Data) -> dict:
        """eval_entity_precision / _recall / _f1 of the validation batches (IOB2 tag names only)."""
        names = json.loads(data.files["labels.json"])
        if not entities.is_iob(names) or not data.eval:
            return {}
        s = entities.scores(entities.evaluate(self.model, params, data.eval, names))
        return {f"eval_entity_{k}": s[k] for k in ("precision", "recall", "f1")}

    @classmethod
    def check_data(cls, cfg, vocab: bool = True):
        """The columns, words and tags checked; model.num_classes=0 becomes the number of tags."""
        d = cfg.data
        if vocab:
            check_bert_vocab(cfg.model, get_tokenizer(d.tokenizer))
        ds = load_examples(d)
        if len(ds) < 2:
            raise ZooDataError(f"data.source={d.source!r} has {len(ds)} example; a train/val split needs 2")
        _, names = resolve_tags(ds, d, cfg.model.num_classes)
        if not entities.is_iob(names):
            print(f"data: the tags ({', '.join(names[:8])}{', ...' if len(names) > 8 else ''}) are not IOB2 "
                  f"(O, B-X, I-X): no entity F1, token accuracy only", flush=True)
        if cfg.model.num_classes == 0:
            print(f"data: model.num_classes={len(names)} from data.label_column={d.label_column!r} "
                  f"({', '.join(names[:8])}{', ...' if len(names) > 8 else ''})", flush=True)
            return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_classes=len(names)))
        return cfg

    def make_data(self, cfg, process_index: int, process_count: int) -> Data:
        """`files` carries labels.json (tag names in id order)."""
        tokenizer = get_tokenizer(cfg.data.tokenizer)
        sp = check_bert_vocab(cfg.model, tokenizer)
        train, val, names = examples(cfg, tokenizer, sp)
        return Data(train=ClsBatches(train, cfg.train.batch_size, cfg.train.seed, process_index, process_count),
                    eval=eval_batches(val, cfg.train.batch_size, cfg.train.eval_batches, process_index,
                                      process_count),
                    tokenizer=tokenizer, files={"labels.json": json.dumps(names)}, rows=len(train))
