"""Sequence classification (bert_cls) from [CLS], and the bare encoder of a converted BertModel
(bert_encoder): labelled data (text or text pair + label -> padded [CLS] batches), loss, macro-F1.

Sources are those of zoo.data (`hub:NAME[/CONFIG]`, local json/jsonl/parquet/csv/tsv) with a text column,
an optional second text column (`data.text_pair_column`) and a label column. Labels may be ints
(a `datasets.ClassLabel` brings its names) or strings; string labels get ids in the order of
`data.label_names` when given, else in sorted order. `builtin` is an offline labelled set made
from the built-in corpus: each paragraph of Python's pydoc topics, labelled with the family of the
topic it comes from (`TOPIC_FAMILIES`); paragraphs that occur under two families are dropped.

A row is [CLS] a [SEP] (b [SEP]) (RoBERTa's: <s> a </s></s> b </s>) then [PAD]s up to data.seq_len,
with `valid` marking the real tokens and segment id 1 on b. Longer examples are truncated, longest text
first, and counted (printed once); empty text, a missing column, labels outside model.num_classes and
token ids outside model.vocab_size are refused with a one-line ZooDataError. Validation examples are
held out by a hash of their text (data.val_fraction), so duplicates never straddle the split. Training
batches walk a fresh permutation each epoch, drawn from (seed, epoch): the batch of a step is a pure
function of (seed, step).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass

import datasets
import numpy as np

import jax
import jax.numpy as jnp
import optax

from zoo.data import corpus
from zoo.data.batches import EpochOrder, process_rows
from zoo.data.store import doc_hash, val_documents
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ConfigError, ZooDataError
from zoo.models.bert import BertClassifier, BertEncoder
from zoo.tasks.base import BaseTask, Data, attention_flops, count
from zoo.tasks.mlm import BertSpecials, check_bert_vocab, check_ids

# The offline default labelled set: pydoc topic -> family (every topic of the corpus is in one).
TOPIC_FAMILIES = {
    "statements": "assert assignment async augassign break class compound continue del else for function global "
                  "if import nonlocal pass raise return try while with yield",
    "expressions": "atom-identifiers atom-literals attribute-references await binary bitwise booleans calls "
                   "comparisons conversions dict exprlists formatstrings identifiers imaginary in integers floating "
                   "lambda lists numbers operator-summary power shifting slicings strings subscriptions unary",
    "data model": "attribute-access callable-types context-managers customization id-classes numeric-types objects "
                  "sequence-types specialattrs specialnames types",
    "library": "bltin-code-objects bltin-ellipsis-object bltin-null-object bltin-type-objects debugger "
               "dynamic-features exceptions execmodel naming string-methods truth typesfunctions typesmapping "
               "typesmethods typesmodules typesseq typesseq-mutable",
}
MIN_PARAGRAPH = 40  # characters; shorter paragraphs are mostly headings and one-line grammar rules


def builtin_examples() -> datasets.Dataset:
    """One row per distinct paragraph of the pydoc topics: text, label (ClassLabel over TOPIC_FAMILIES)."""
    from pydoc_data.topics import topics
    families: dict[str, set] = {}
    for family, names in TOPIC_FAMILIES.items():
        for topic in names.split():
            for para in re.split(r"\n\s*\n", topics[topic]):
                para = para.strip()
                if len(para) >= MIN_PARAGRAPH:
                    families.setdefault(para, set()).add(family)
    names = list(TOPIC_FAMILIES)
    rows = [(p, names.index(f.pop())) for p, f in families.items() if len(f) == 1]
    return datasets.Dataset.from_dict({"text": [r[0] for r in rows], "label": [r[1] for r in rows]},
                                      features=datasets.Features({"text": datasets.Value("string"),
                                                                  "label": datasets.ClassLabel(names=names)}))


def load_examples(dcfg) -> datasets.Dataset:
    """The labelled source with its text / pair / label columns checked to exist."""
    if dcfg.source == "builtin":
        ds = builtin_examples()
    elif dcfg.source.startswith("hub:"):
        ds = corpus.load_hub(dcfg)
    else:
        ds = corpus.load_local(dcfg)
    for field in ("text_column", "text_pair_column", "label_column"):
        col = getattr(dcfg, field)
        if col and col not in ds.column_names:
            raise ZooDataError(f"data.{field}={col!r} is not a column of {dcfg.source}; "
                               f"columns: {', '.join(ds.column_names)}")
    return ds


def label_ids(ds: datasets.Dataset, dcfg) -> tuple[np.ndarray, list[str]]:
    """(label ids [N], the class names the data or data.label_names give, in id order; [] for bare ints)."""
    col = dcfg.label_column
    feature, values = ds.features[col], ds[col]
    empty = [i for i, v in enumerate(values) if v is None or (isinstance(v, str) and not v.strip())]
    if empty:
        raise ZooDataError(f"row {empty[0]} of data.label_column={col!r} is empty ({len(empty)} empty rows); "
                           f"remove them from the source")
    given = [n.strip() for n in dcfg.label_names.split(",")] if dcfg.label_names else []
    if getattr(feature, "dtype", None) in ("string", "large_string"):
        names = given or sorted({v for v in values if v is not None})
        index = {n: i for i, n in enumerate(names)}
        unknown = sorted({str(v) for v in values if v not in index})
        if unknown:
            raise ZooDataError(f"data.label_column={col!r} holds labels {', '.join(unknown[:5])} that are not in "
                               f"data.label_names={dcfg.label_names!r}")
        ids = np.asarray([index[v] for v in values], np.int64)
    elif isinstance(feature, datasets.ClassLabel) or str(getattr(feature, "dtype", "")).startswith(("int", "uint")):
        ids = np.asarray(values, np.int64)
        names = given or (list(feature.names) if isinstance(feature, datasets.ClassLabel) else [])
    else:
        hint = " (an empty cell turns a CSV column of ints into floats)" if "float" in str(feature) else ""
        raise ZooDataError(f"data.label_column={col!r} of {dcfg.source} holds {feature}, not int or string "
                           f"labels{hint}")
    return ids, names


def num_labels(ds: datasets.Dataset, dcfg) -> int:
    """The number of classes the label column implies: its names, or its largest id + 1."""
    ids, names = label_ids(ds, dcfg)
    return max(len(names), int(ids.max()) + 1 if len(ids) else 0, 1)


def _two_classes(ids: np.ndarray, names: list[str], dcfg) -> None:
    """Training data of one class is refused: its classifier learns nothing (the loss is 0 from the start)."""
    seen = np.unique(ids)
    if len(seen) < 2:
        one = names[int(seen[0])] if len(seen) and int(seen[0]) < len(names) else seen.tolist()
        raise ZooDataError(f"data.label_column={dcfg.label_column!r} of data.source={dcfg.source!r} holds one class "
                           f"only ({one}) in its {len(ids)} rows; a classifier needs rows of 2 classes or more")


def resolve_labels(ds: datasets.Dataset, dcfg, num_classes: int) -> tuple[np.ndarray, list[str]]:
    """(label ids [N], class names in id order), checked against num_classes."""
    col = dcfg.label_column
    ids, names = label_ids(ds, dcfg)
    if len(names) > num_classes:
        raise ZooDataError(f"data.label_column={col!r} has {len(names)} classes ({', '.join(names[:8])}) but "
                           f"model.num_classes={num_classes}")
    bad = np.flatnonzero((ids < 0) | (ids >= num_classes))
    if len(bad):
        raise ZooDataError(f"label {ids[bad[0]]} (row {bad[0]}) of data.label_column={col!r} is outside "
                           f"model.num_classes={num_classes} ({len(bad)} such rows)")
    names = names + [str(i) for i in range(len(names), num_classes)]
    return ids, names


def label_names(cfg) -> list[str]:
    """Class names of a run: data.label_names if set, else read from the labelled source again."""
    if cfg.data.label_names:
        names = [n.strip() for n in cfg.data.label_names.split(",")]
        return names + [str(i) for i in range(len(names), cfg.model.num_classes)]
    ds = load_examples(cfg.data).select_columns([cfg.data.label_column])
    return resolve_labels(ds, cfg.data, cfg.model.num_classes)[1]


def _texts(ds: datasets.Dataset, field: str, col: str) -> list[str]:
    texts = ds[col]
    empty = [i for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
    if empty:
        raise ZooDataError(f"row {empty[0]} of data.{field}={col!r} is empty ({len(empty)} empty rows); "
                           f"remove them from the source")
    return texts


def truncate(a: list, b: list | None, budget: int) -> tuple[list, list | None]:
    """Drop tokens from the end of the longer text until both fit in `budget` (longest first)."""
    if b is None:
        return a[:budget], None
    la, lb = len(a), len(b)
    if la + lb > budget:
        short = min(la, lb)
        if short <= budget - short:  # only the longer text is cut
            la, lb = (budget - lb, lb) if la >= lb else (la, budget - la)
        else:  # both are cut to halves (a, cut first on ties, gets the smaller)
            la, lb = budget // 2, budget - budget // 2
    return a[:la], b[:lb]


def frame(a: list, b: list | None, sp: BertSpecials) -> tuple[list, int]:
    """([CLS] a [SEP] (b [SEP]), index where segment 1 starts: the row length when there is no b). A tokenizer
    whose pairs take two separators joins them as RoBERTa's does: <s> a </s></s> b </s>."""
    ids = [sp.cls, *a, sp.sep]
    if b is None:
        return ids, len(ids)
    ids += [sp.sep] * (sp.pair_seps - 1)
    return ids + [*b, sp.sep], len(ids)


@dataclass
class Examples:
    """Framed examples padded to T: ids [N, T], lengths [N], where segment 1 starts [N], labels [N]."""

    ids: np.ndarray
    lengths: np.ndarray
    seg_start: np.ndarray
    labels: np.ndarray

    def __len__(self):
        return len(self.labels)

    def rows(self, idx: np.ndarray, weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
        pos_1T = np.arange(self.ids.shape[1])[None]
        valid_BT = pos_1T < self.lengths[idx, None]
        return {"inputs": self.ids[idx], "valid": valid_BT,
                "segment_ids": ((pos_1T >= self.seg_start[idx, None]) & valid_BT).astype(np.int32),
                "labels": self.labels[idx].astype(np.int32),
                "weights": np.ones(len(idx), np.float32) if weights is None else weights.astype(np.float32)}


def encode(tokenizer, sp: BertSpecials, texts: list[str], pairs: list[str] | None, labels: np.ndarray,
           seq_len: int) -> tuple[Examples, int]:
    """Tokenize, truncate and pad; returns the examples and how many were truncated."""
    enc_a = tokenizer.encode_batch(texts)
    enc_b = tokenizer.encode_batch(pairs) if pairs is not None else [None] * len(texts)
    budget = seq_len - sp.n_framing(pairs is not None)
    ids = np.full((len(texts), seq_len), sp.pad, np.int32)
    lengths, seg_start = np.zeros(len(texts), np.int64), np.zeros(len(texts), np.int64)
    truncated = 0
    for i, (a, b) in enumerate(zip(enc_a, enc_b)):
        if len(a) + len(b or ()) > budget:
            truncated += 1
            a, b = truncate(a, b, budget)
        row, seg_start[i] = frame(a, b, sp)
        ids[i, :len(row)], lengths[i] = row, len(row)
    return Examples(ids, lengths, seg_start, labels), truncated


def examples(cfg, tokenizer, sp: BertSpecials) -> tuple[Examples, Examples, list[str]]:
    """(train, val, class names) of the labelled source in cfg.data."""
    d = cfg.data
    ds = load_examples(d)
    texts = _texts(ds, "text_column", d.text_column)
    pairs = _texts(ds, "text_pair_column", d.text_pair_column) if d.text_pair_column else None
    labels, names = resolve_labels(ds, d, cfg.model.num_classes)
    if len(texts) < 2:
        raise ZooDataError(f"data.source={d.source!r} has {len(texts)} example; a train/val split needs 2")
    every, truncated = encode(tokenizer, sp, texts, pairs, labels, d.seq_len)
    check_ids(every.ids, cfg.model.vocab_size, tokenizer, f"data.source={d.source!r}")
    if truncated:
        print(f"data: truncated {truncated} of {len(texts)} examples to data.seq_len={d.seq_len} tokens "
              f"(longest text first)", flush=True)
    keys = texts if pairs is None else [a + "\x00" + b for a, b in zip(texts, pairs)]
    is_val = val_documents(np.asarray([doc_hash(k) for k in keys]), d.val_fraction)
    split = lambda m: Examples(every.ids[m], every.lengths[m], every.seg_start[m], every.labels[m])
    return split(~is_val), split(is_val), names


class ClsBatches:
    """step -> this process's rows of the global batch: epoch-wise permutations from (seed, epoch)."""

    def __init__(self, ex: Examples, global_batch: int, seed: int, process_index: int = 0, process_count: int = 1):
        self.ex, self.order = ex, EpochOrder(len(ex), global_batch, seed)
        self.rows = process_rows(global_batch, process_index, process_count)

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        idx = self.order(step)[self.rows]
        return self.ex.rows(idx)


def eval_batches(ex: Examples, global_batch: int, num_batches: int, process_index: int = 0,
                 process_count: int = 1) -> list[dict[str, np.ndarray]]:
    """The first num_batches * B validation examples in order; a short last batch is padded with weight 0."""
    rows = process_rows(global_batch, process_index, process_count)
    out = []
    for b in range(min(num_batches, math.ceil(len(ex) / global_batch))):
        pos = np.arange(b * global_batch, (b + 1) * global_batch)
        real = pos < len(ex)
        out.append(ex.rows(np.where(real, pos, 0)[rows], real[rows]))
    return out


def macro_f1(totals: dict, num_classes: int) -> dict:
    """Macro-F1 over the classes present in labels or predictions, from summed per-class counts."""
    f1s = []
    for c in range(num_classes):
        tp, pred, true = (totals.get(f"{k}_{c}", 0.0) for k in ("tp", "pred", "true"))
        if pred + true > 0:
            f1s.append(2 * tp / (pred + true))
    return {"eval_macro_f1": sum(f1s) / len(f1s) if f1s else 0.0}


class _Encoder(BaseTask):
    """What the [CLS] tasks share: the init of a BERT over (ids, segments, valid), and 6N + attention FLOPs."""

    EXCLUDE = ("['position']", "['segment']", "['word']")  # lookups only: no output matmul ties the embedding in

    def init(self, rng):
        ids = jnp.zeros((1, self.cfg.data.seq_len), jnp.int32)
        return self.model.init(rng, ids, ids, jnp.ones(ids.shape, bool))["params"]

    def flops_per_token(self, seq_len):
        m = self.cfg.model
        n = count(jax.eval_shape(self.init, jax.random.PRNGKey(0)), exclude=self.EXCLUDE)
        return 6 * n + attention_flops(m.num_layers, m.num_heads, m.head_dim, seq_len)


class ClsTask(_Encoder):
    """[CLS] classification: one label per example (weight = examples); per-class sums for macro-F1."""

    name = "bert_cls"
    PERPLEXITY = False  # a loss per example, not per token: exp(loss) is no perplexity

    def __init__(self, cfg):
        self.cfg, self.model = cfg, BertClassifier(cfg.model)

    def loss(self, params, batch, rng, train):
        C = self.cfg.model.num_classes
        logits_BC = self.model.apply({"params": params}, batch["inputs"], batch["segment_ids"], batch["valid"],
                                     deterministic=not train, rngs={"dropout": rng})
        labels_B, w_B = batch["labels"], batch["weights"]
        ce_B = optax.softmax_cross_entropy_with_integer_labels(logits_BC, labels_B)
        pred_B = jnp.argmax(logits_BC, -1)
        pred_C = jnp.sum(jax.nn.one_hot(pred_B, C) * w_B[:, None], 0)
        true_BC = jax.nn.one_hot(labels_B, C) * w_B[:, None]
        tp_C = jnp.sum(true_BC * jax.nn.one_hot(pred_B, C), 0)
        # Scalars, one per class and count: the trainer sums every aux value as a float.
        per_class = {f"{k}_{c}": v[c] for k, v in (("tp", tp_C), ("pred", pred_C), ("true", jnp.sum(true_BC, 0)))
                     for c in range(C)}
        return jnp.sum(ce_B * w_B), {"weight": jnp.sum(w_B), "correct": jnp.sum((pred_B == labels_B) * w_B),
                                     "tokens": jnp.sum(batch["valid"] * w_B[:, None]), **per_class}

    def eval_metrics(self, totals: dict) -> dict:
        return macro_f1(totals, self.cfg.model.num_classes)

    @classmethod
    def check_data(cls, cfg, vocab: bool = True):
        """The columns, texts and labels checked; model.num_classes=0 becomes the number of classes."""
        d = cfg.data
        if vocab:
            check_bert_vocab(cfg.model, get_tokenizer(d.tokenizer))
        ds = load_examples(d)
        _texts(ds, "text_column", d.text_column)
        if d.text_pair_column:
            _texts(ds, "text_pair_column", d.text_pair_column)
        if len(ds) < 2:
            raise ZooDataError(f"data.source={d.source!r} has {len(ds)} example; a train/val split needs 2")
        if cfg.model.num_classes == 0:
            n = num_labels(ds, d)
            ids, names = resolve_labels(ds, d, n)
            _two_classes(ids, names, d)
            print(f"data: model.num_classes={n} from data.label_column={d.label_column!r} "
                  f"({', '.join(names[:8])}{', ...' if n > 8 else ''})", flush=True)
            return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_classes=n))
        _two_classes(*resolve_labels(ds, d, cfg.model.num_classes), d)
        return cfg

    def make_data(self, cfg, process_index: int, process_count: int) -> Data:
        """`files` carries labels.json (class names in id order)."""
        tokenizer = get_tokenizer(cfg.data.tokenizer)
        sp = check_bert_vocab(cfg.model, tokenizer)
        train, val, names = examples(cfg, tokenizer, sp)
        return Data(train=ClsBatches(train, cfg.train.batch_size, cfg.train.seed, process_index, process_count),
                    eval=eval_batches(val, cfg.train.batch_size, cfg.train.eval_batches, process_index,
                                      process_count),
                    tokenizer=tokenizer, files={"labels.json": json.dumps(names)}, rows=len(train))


class EncoderTask(_Encoder):
    """A converted bare BertModel (MiniLM, ...): hidden states and pooled [CLS], no objective of its own.
    It is a starting point: fine-tune it with task=bert_cls (or bert_mlm) and init_from=<this run>."""

    name = "bert_encoder"

    def __init__(self, cfg):
        self.cfg, self.model = cfg, BertEncoder(cfg.model)

    def _no_objective(self, *_):
        raise ConfigError("task=bert_encoder has no training objective; train a bert_cls or bert_mlm config "
                          "with --set init_from=<this run> instead")

    loss = make_data = _no_objective
