"""The seq2seq task's data: framing, source/target pairs, tokens, padded batches as a pure function of (seed, step).

Sources are those of zoo.data.corpus: `builtin`, `hub:NAME[/CONFIG]` or local json/jsonl/parquet/csv/tsv files,
with a source and a target column (`data.source_column`, `data.target_column`; `a.b` reads key b of
a dict column a, as in WMT's `translation.de`). `builtin` is the offline default task and ignores
the column settings: every distinct run of 3-8 consecutive plain words inside the clauses of
Python's pydoc topics (text cut at punctuation, digits and blank lines), with its target the same
words in reverse order ("Classes are callable" -> "callable are Classes"). Phrases longer than
data.seq_len - 1 tokens are left out. Held-out phrases are new word sequences that share words and
shorter runs with training ones: the task tests reversal, not vocabulary.

Framing (`Framing`, its special ids): zoo's own framing puts them after the tokenizer's vocabulary: EOS = the
tokenizer's eot id, BOS = n_vocab, PAD = n_vocab + 1, so the model needs vocab_size >= n_vocab + 2.
A source is its tokens; a target is its tokens + EOS; the decoder input is BOS + target[:-1]. A
converted T5 or BART checkpoint brings its own framing (seq2seq.json beside its tokenizer files, see
zoo.hf): T5 source "text </s>", target "text </s>", decoder start <pad>; BART source "<s> text </s>",
target "<s> text </s>", decoder start </s>. Longer sequences are truncated to data.seq_len (a
source keeps its prefix and suffix) and counted (printed once); a cut target has no EOS, so the
model is never taught to stop at a cut. A missing column and empty or non-text rows are refused
with a one-line ZooDataError.

Batches are padded per batch, to the smallest power of two >= the longest source (target) of the
global batch (at least 8, at most data.seq_len), so few shapes compile. Training walks a fresh
permutation of the train pairs each epoch, drawn from (seed, epoch); validation pairs are held out
by a hash of their text (data.val_fraction), so duplicates never straddle the split.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import datasets
import numpy as np

from zoo.data import corpus
from zoo.data.batches import EpochOrder, process_rows
from zoo.data.store import doc_hash, val_documents
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ZooDataError
from zoo.infer.decoding import BEAM_STYLES

MIN_WORDS, MAX_WORDS = 3, 8  # builtin: clause length in words
MIN_PAD = 8  # shortest padded length of a batch


@dataclass(frozen=True)
class Framing:
    """A run's special ids and sequence framing, and the beam-search ranking its decoding uses."""

    decoder_start: int  # the decoder's first input (zoo: BOS after the vocabulary; T5: <pad>; BART: </s>)
    eos: int  # ends every target; decoding stops on it
    pad: int  # fills batches (never weighted)
    src_prefix: tuple[int, ...] = ()  # ids before a source's tokens (BART: <s>)
    src_suffix: tuple[int, ...] = ()  # ids after a source's tokens (T5, BART: </s>)
    tgt_prefix: tuple[int, ...] = ()  # ids before a target's tokens (BART: <s>); EOS always follows them
    beam_style: str = "gnmt"  # length penalty and stopping of beam search: gnmt (zoo) | hf (transformers)
    length_penalty: float = 0.6  # default alpha of that penalty
    early_stopping: bool | str = False  # hf only: transformers' early_stopping (True, False or "never")

    @property
    def bos(self) -> int:
        """zoo's name for the decoder start (its own framing's BOS)."""
        return self.decoder_start

    @property
    def vocab_needed(self) -> int:
        return max(self.decoder_start, self.eos, self.pad, *self.src_prefix, *self.src_suffix, *self.tgt_prefix) + 1

    def source(self, ids: list[int], seq_len: int) -> list[int]:
        """A source's framed ids, its text cut so that the whole fits seq_len."""
        room = max(seq_len - len(self.src_prefix) - len(self.src_suffix), 0)
        return [*self.src_prefix, *ids[:room], *self.src_suffix]

    def target(self, ids: list[int]) -> list[int]:
        return [*self.tgt_prefix, *ids, self.eos]


def framing(tokenizer) -> Framing:
    """The tokenizer's seq2seq framing (a converted checkpoint's seq2seq.json), else zoo's: BOS and PAD
    after the vocabulary, EOS = the tokenizer's eot."""
    framing = getattr(tokenizer, "seq2seq", None)
    if framing is None:
        return Framing(decoder_start=tokenizer.n_vocab, eos=tokenizer.eot_token, pad=tokenizer.n_vocab + 1)
    try:
        sp = Framing(**{k: tuple(v) if isinstance(v, list) else v for k, v in framing.items()})
    except TypeError as e:
        raise ZooDataError(f"data.tokenizer={tokenizer.name!r}: its seq2seq.json is malformed ({e})") from None
    if sp.beam_style not in BEAM_STYLES:
        raise ZooDataError(f"data.tokenizer={tokenizer.name!r}: seq2seq.json beam_style={sp.beam_style!r}; "
                           f"choose one of {', '.join(BEAM_STYLES)}")
    return sp


def check_framing(model_cfg, tokenizer) -> Framing:
    sp = framing(tokenizer)
    if model_cfg.vocab_size < sp.vocab_needed:
        if getattr(tokenizer, "seq2seq", None) is None:
            raise ZooDataError(f"model.vocab_size={model_cfg.vocab_size} is smaller than the vocabulary of "
                               f"data.tokenizer={tokenizer.name!r} ({tokenizer.n_vocab}) + BOS + PAD = "
                               f"{sp.vocab_needed}")
        raise ZooDataError(f"model.vocab_size={model_cfg.vocab_size} is smaller than the special ids of "
                           f"data.tokenizer={tokenizer.name!r} (seq2seq.json) need: {sp.vocab_needed}")
    return sp


# ---- pairs --------------------------------------------------------------------------------------
@functools.cache
def builtin_phrases(min_words: int = MIN_WORDS, max_words: int = MAX_WORDS) -> tuple[str, ...]:
    """Distinct runs of min..max consecutive plain (alphabetic) words inside the clauses of the pydoc
    topics (text cut at punctuation, digits and blank lines), sorted."""
    from pydoc_data.topics import topics
    phrases = set()
    for key in sorted(topics):
        for piece in re.split(r"[^A-Za-z \n]+", topics[key]):
            for clause in re.split(r"\n\s*\n", piece):
                words = clause.split()
                for k in range(min_words, max_words + 1):
                    phrases.update(" ".join(words[i:i + k]) for i in range(len(words) - k + 1))
    return tuple(sorted(phrases))


def reverse_words(text: str) -> str:
    return " ".join(text.split()[::-1])


def builtin_pairs(max_tokens: int | None = None, tokenizer=None) -> datasets.Dataset:
    """The offline task: (phrase, its words reversed); phrases over max_tokens tokens are left out."""
    phrases = builtin_phrases()
    if max_tokens is not None:
        lengths = [len(ids) for ids in tokenizer.encode_batch(phrases)]
        phrases = [c for c, n in zip(phrases, lengths) if n <= max_tokens]
    return datasets.Dataset.from_dict({"source": phrases, "target": [reverse_words(c) for c in phrases]})


def _resolve_column(ds: datasets.Dataset, field: str, col: str, source: str) -> tuple[str, str]:
    """(column, key) for data.<field>=col: a column, or key of a dict column ("translation.de")."""
    if col in ds.column_names:
        return col, ""
    top, _, key = col.partition(".")
    if top not in ds.column_names:
        raise ZooDataError(f"data.{field}={col!r} is not a column of {source}; columns: {', '.join(ds.column_names)}")
    feature = ds.features[top]
    keys = list(getattr(feature, "languages", None) or (feature if isinstance(feature, dict) else []))
    if not key or key not in keys:
        raise ZooDataError(f"data.{field}={col!r}: column {top!r} has no key {key!r}; "
                           f"keys: {', '.join(keys) if keys else f'none (it holds {feature})'}")
    return top, key


def _texts(chunk: dict, field: str, col: str, top: str, key: str, first_row: int) -> list[str]:
    values = chunk[top] if not key else [v.get(key) if isinstance(v, dict) else None for v in chunk[top]]
    bad = [i for i, t in enumerate(values) if not isinstance(t, str) or not t.strip()]
    if bad:
        raise ZooDataError(f"row {first_row + bad[0]} of data.{field}={col!r} is empty or not text; "
                           f"remove such rows from the source")
    return values


def pair_chunks(dcfg, tokenizer=None, chunk: int = 10_000):
    """(sources, targets) of data.source in chunks of `chunk` rows, columns checked first: a large
    corpus (WMT) never sits in memory as Python strings all at once."""
    if dcfg.source == "builtin":
        tokenizer = tokenizer or get_tokenizer(dcfg.tokenizer)
        ds, src_col, tgt_col = builtin_pairs(dcfg.seq_len - 1, tokenizer), "source", "target"
    else:
        ds = corpus.load_hub(dcfg) if dcfg.source.startswith("hub:") else corpus.load_local(dcfg)
        src_col, tgt_col = dcfg.source_column, dcfg.target_column
    src = _resolve_column(ds, "source_column", src_col, dcfg.source)
    tgt = _resolve_column(ds, "target_column", tgt_col, dcfg.source)
    if len(ds) < 2:
        raise ZooDataError(f"data.source={dcfg.source!r} has {len(ds)} pair; a train/val split needs 2")
    ds = ds.select_columns(sorted({src[0], tgt[0]}))
    for first, rows in zip(range(0, len(ds), chunk), ds.iter(batch_size=chunk)):
        yield (_texts(rows, "source_column", src_col, *src, first), _texts(rows, "target_column", tgt_col, *tgt, first))


def load_pairs(dcfg, tokenizer=None) -> tuple[list[str], list[str]]:
    """(sources, targets) of data.source as two lists (small sources; training streams `pair_chunks`)."""
    sources, targets = [], []
    for s, t in pair_chunks(dcfg, tokenizer):
        sources += s
        targets += t
    return sources, targets


# ---- tokens -------------------------------------------------------------------------------------
@dataclass
class Ragged:
    """Token rows of different lengths: row i is ids[offsets[i]:offsets[i + 1]]."""

    ids: np.ndarray  # int32, all rows concatenated
    offsets: np.ndarray  # int64 [N + 1]

    @classmethod
    def of(cls, rows: list[list[int]]) -> Ragged:
        lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
        ids = np.fromiter((t for r in rows for t in r), np.int32, int(lengths.sum()))
        return cls(ids, np.concatenate([[0], np.cumsum(lengths)]))

    @classmethod
    def concat(cls, parts: list[Ragged]) -> Ragged:
        starts = np.cumsum([0] + [len(p.ids) for p in parts[:-1]])
        offsets = [parts[0].offsets[:1]] + [p.offsets[1:] + s for p, s in zip(parts, starts)]
        return cls(np.concatenate([p.ids for p in parts]), np.concatenate(offsets))

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def take(self, idx: np.ndarray) -> Ragged:
        lengths = self.lengths[idx]
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        # Row r's tokens: ids[start_r : start_r + length_r], gathered in one fancy index.
        within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
        return Ragged(self.ids[np.repeat(self.offsets[idx], lengths) + within], offsets)

    def padded(self, idx: np.ndarray, length: int, pad: int) -> np.ndarray:
        out = np.full((len(idx), length), pad, np.int32)
        for row, i in enumerate(idx):
            r = self.ids[self.offsets[i]:self.offsets[i + 1]]
            out[row, :len(r)] = r
        return out


@dataclass
class Pairs:
    src: Ragged  # source tokens
    tgt: Ragged  # target tokens + EOS (no EOS when cut)

    def __len__(self):
        return len(self.src.offsets) - 1

    def take(self, idx: np.ndarray) -> Pairs:
        return Pairs(self.src.take(idx), self.tgt.take(idx))


def encode_pairs(tokenizer, sp: Framing, sources: list[str], targets: list[str], seq_len: int):
    """(Pairs, sources truncated, targets truncated)."""
    n_frame = len(sp.src_prefix) + len(sp.src_suffix)
    src = tokenizer.encode_batch(sources)
    tgt = [sp.target(ids) for ids in tokenizer.encode_batch(targets)]
    n_src, n_tgt = sum(len(s) + n_frame > seq_len for s in src), sum(len(t) > seq_len for t in tgt)
    return Pairs(Ragged.of([sp.source(s, seq_len) for s in src]), Ragged.of([t[:seq_len] for t in tgt])), n_src, n_tgt


def encode_sources(tokenizer, texts: list[str], seq_len: int, sp: Framing | None = None):
    """(src_BS, src_valid_BS) for decoding, framed as `sp` (default: the tokenizer's); a source longer
    than seq_len is refused, not cut."""
    sp = sp or framing(tokenizer)
    rows = [[*sp.src_prefix, *ids, *sp.src_suffix] if ids else [] for ids in tokenizer.encode_batch(list(texts))]
    for text, ids in zip(texts, rows):
        if not ids:
            raise ZooDataError("an input text is empty; give at least one character")
        if len(ids) > seq_len:
            shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
            raise ZooDataError(f"input {shown} is {len(ids)} tokens, above the model's data.seq_len={seq_len}")
    r = Ragged.of(rows)
    S = padded_length(int(r.lengths.max()), seq_len)
    idx = np.arange(len(rows))
    return r.padded(idx, S, 0), np.arange(S)[None] < r.lengths[:, None]


def split_pairs(cfg, tokenizer, sp: Framing) -> tuple[Pairs, Pairs]:
    """(train, val) pairs of cfg.data, tokenized chunk by chunk; truncations printed once."""
    d = cfg.data
    parts, hashes, n_src, n_tgt = [], [], 0, 0
    for sources, targets in pair_chunks(d, tokenizer):
        pairs, ns, nt = encode_pairs(tokenizer, sp, sources, targets, d.seq_len)
        parts.append(pairs)
        hashes += [doc_hash(s + "\x00" + t) for s, t in zip(sources, targets)]
        n_src, n_tgt = n_src + ns, n_tgt + nt
    pairs = Pairs(Ragged.concat([p.src for p in parts]), Ragged.concat([p.tgt for p in parts]))
    if n_src or n_tgt:
        print(f"data: truncated {n_src} sources and {n_tgt} targets (target + EOS) of {len(pairs)} pairs to "
              f"data.seq_len={d.seq_len} tokens", flush=True)
    is_val = val_documents(np.asarray(hashes), d.val_fraction)
    return pairs.take(np.flatnonzero(~is_val)), pairs.take(np.flatnonzero(is_val))


# ---- batches ------------------------------------------------------------------------------------
def padded_length(longest: int, seq_len: int) -> int:
    return min(max(MIN_PAD, 1 << max(longest - 1, 0).bit_length()), seq_len)


def make_batch(pairs: Pairs, idx: np.ndarray, rows: slice, sp: Framing, seq_len: int,
               weights_B: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """This process's `rows` of the global batch `idx`, padded to the global batch's lengths."""
    S = padded_length(int(pairs.src.lengths[idx].max()), seq_len)
    T = padded_length(int(pairs.tgt.lengths[idx].max()), seq_len)
    local = idx[rows]
    tgt_BT = pairs.tgt.padded(local, T, sp.pad)
    w_B = np.ones(len(local), np.float32) if weights_B is None else weights_B[rows]
    return {"src": pairs.src.padded(local, S, sp.pad),
            "src_valid": np.arange(S)[None] < pairs.src.lengths[local, None],
            "tgt_in": np.concatenate([np.full((len(local), 1), sp.decoder_start, np.int32), tgt_BT[:, :-1]], axis=1),
            "tgt_out": tgt_BT,
            "weights": ((np.arange(T)[None] < pairs.tgt.lengths[local, None]) * w_B[:, None]).astype(np.float32)}


class Seq2SeqBatches:
    """step -> this process's rows of the global batch: epoch-wise permutations from (seed, epoch)."""

    def __init__(self, pairs: Pairs, sp: Framing, seq_len: int, global_batch: int, seed: int,
                 process_index: int = 0, process_count: int = 1):
        self.pairs, self.sp, self.seq_len = pairs, sp, seq_len
        self.order = EpochOrder(len(pairs), global_batch, seed)
        self.rows = process_rows(global_batch, process_index, process_count)

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        idx = self.order(step)
        return make_batch(self.pairs, idx, self.rows, self.sp, self.seq_len)


def eval_batches(pairs: Pairs, sp: Framing, seq_len: int, global_batch: int, num_batches: int,
                 process_index: int = 0, process_count: int = 1) -> list[dict[str, np.ndarray]]:
    """The first num_batches * B validation pairs in order; a short last batch is filled with weight-0 rows."""
    rows = process_rows(global_batch, process_index, process_count)
    out = []
    for b in range(min(num_batches, math.ceil(len(pairs) / global_batch))):
        pos = np.arange(b * global_batch, (b + 1) * global_batch)
        real = pos < len(pairs)
        out.append(make_batch(pairs, np.where(real, pos, 0), rows, sp, seq_len, real.astype(np.float32)))
    return out
