"""Masked-LM pretraining (bert_mlm): BERT's special tokens, masking, packed [CLS] ... [SEP] batches from
the token store, and the task whose loss runs on the masked positions only.

The four BERT specials are appended after the tokenizer's vocabulary: [CLS] = n_vocab, [SEP] =
n_vocab + 1, [MASK] = n_vocab + 2, [PAD] = n_vocab + 3, so any tokenizer (bytes, tiktoken) works
unchanged and the model needs `vocab_size >= n_vocab + 4`. A tokenizer with its own specials (a
checkpoint's WordPiece; RoBERTa's and XLM-R's <s> </s> <mask> <pad>) says so with `special_ids`
({"cls", "sep", "mask", "pad"} -> id) and `ordinary_ids` (a range); those ids are used and nothing is
appended. Its `mask_text` marks a mask in fill-mask text ("<mask>" for RoBERTa) and `pair_seps` says how a
pair is joined (RoBERTa's <s> a </s></s> b </s>). A row holding an id outside the model's embedding table is
refused (`check_ids`) before any lookup: a gather there reads NaN, and every answer after it is wrong.

A training row is a window of T - 2 tokens from the flat token store (documents joined by eot),
framed as [CLS] window [SEP]; each document boundary inside it becomes a [SEP] too, and segment
ids alternate 0/1 from one document to the next. Then, as in the original BERT, round(15%) of each
row's non-special positions are chosen (at least one, uniformly without replacement); of those 80%
become [MASK], 10% a random ordinary token, 10% stay. The loss is taken on the chosen positions
only (`weights`), and `positions` [B, K] lists them (K = max_predictions(T), padded with position 0,
the never-chosen [CLS]), so the model runs its MLM head and the [V]-wide output on those K rows
instead of all T (BERT's masked_lm_positions). Windows and masks are drawn from
`np.random.default_rng([seed, step, ...])`, so the batch of a step is a pure function of
(seed, step): resume replays it exactly, and every process draws the same global batch and keeps
its own rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import jax
import jax.numpy as jnp

from zoo.data import corpus, store
from zoo.data.batches import process_rows
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ZooDataError
from zoo.models.bert import BertMlm
from zoo.nn import losses
from zoo.tasks.base import BaseTask, Data, attention_flops, count

SPECIALS = ("[CLS]", "[SEP]", "[MASK]", "[PAD]")
MASK_PROB = 0.15  # share of non-special positions chosen for prediction
MASK_TOKEN, RANDOM_TOKEN = 0.8, 0.1  # of the chosen: -> [MASK], -> a random token; the rest keep theirs
KEEP, MASK, RANDOM = 0, 1, 2  # what happened to a chosen position
EVAL_SEED = 1_000_003  # eval masks depend on neither train.seed nor the step: eval loss stays comparable


@dataclass(frozen=True)
class BertSpecials:
    """Ids of the specials for one tokenizer, and the range random replacements come from."""

    cls: int
    sep: int
    mask: int
    pad: int
    n_ordinary: int  # ordinary tokens end here (exclusive); the tokenizer's eot and others come after
    ordinary_start: int = 0  # ... and start here (WordPiece keeps [PAD], [unused*], [CLS], ... first)
    mask_text: str = SPECIALS[2]  # what marks a mask in fill-mask text: the tokenizer's own (RoBERTa: <mask>)
    mask_strip: tuple[bool, bool] = (False, False)  # the mask takes the spaces on its (left, right) (RoBERTa: left)
    pair_seps: int = 1  # separators between a pair's texts: [SEP] (BERT), </s></s> (RoBERTa, XLM-R)

    @property
    def vocab_needed(self) -> int:
        return max(self.cls, self.sep, self.mask, self.pad, self.n_ordinary - 1) + 1

    def n_framing(self, pair: bool) -> int:
        """Specials in a framed row: [CLS] a [SEP], and pair_seps more before a pair's b."""
        return 2 + (self.pair_seps if pair else 0)

    def is_special(self, ids):
        """Not an ordinary token: never chosen for prediction ([UNK] and [unused*] included)."""
        return (ids < self.ordinary_start) | (ids >= self.n_ordinary)


def bert_specials(tokenizer) -> BertSpecials:
    own = getattr(tokenizer, "special_ids", None)
    if own:  # a vocabulary that holds [CLS] [SEP] [MASK] [PAD] (or <s> </s> <mask> <pad>) itself
        ordinary = tokenizer.ordinary_ids
        return BertSpecials(**own, n_ordinary=ordinary.stop, ordinary_start=ordinary.start,
                            mask_text=getattr(tokenizer, "mask_text", SPECIALS[2]),
                            mask_strip=getattr(tokenizer, "mask_strip", (False, False)),
                            pair_seps=getattr(tokenizer, "pair_seps", 1))
    n = tokenizer.n_vocab
    # Every zoo tokenizer numbers its own specials (eot, ...) after the ordinary tokens.
    return BertSpecials(cls=n, sep=n + 1, mask=n + 2, pad=n + 3, n_ordinary=tokenizer.eot_token)


def special_texts(tokenizer, sp: BertSpecials) -> dict[int, str]:
    """id -> text of the specials (the vocabulary's own, else the four appended ones), which decoding skips."""
    own = getattr(tokenizer, "special_texts", None)
    return dict(own) if own else dict(zip((sp.cls, sp.sep, sp.mask, sp.pad), SPECIALS))


def check_ids(ids, vocab_size: int, tokenizer, where: str) -> None:
    """Refuse ids outside the model's embedding table [0, vocab_size), before any lookup reads them (a gather
    there gives NaN, silently)."""
    ids = np.asarray(ids)
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise ZooDataError(f"{where}: token id {int(bad[0])} is outside the model's embedding table of "
                           f"model.vocab_size={vocab_size} rows; tokenizer {getattr(tokenizer, 'name', tokenizer)!r} "
                           f"does not fit this model")


def check_bert_vocab(model_cfg, tokenizer) -> BertSpecials:
    sp = bert_specials(tokenizer)
    if getattr(tokenizer, "special_ids", None):
        if model_cfg.vocab_size < max(tokenizer.n_vocab, sp.vocab_needed):
            raise ZooDataError(f"model.vocab_size={model_cfg.vocab_size} is smaller than the vocabulary of "
                               f"data.tokenizer={tokenizer.name!r} ({tokenizer.n_vocab}, its own "
                               f"{' '.join(SPECIALS)} included)")
    elif model_cfg.vocab_size < sp.vocab_needed:
        raise ZooDataError(f"model.vocab_size={model_cfg.vocab_size} is smaller than the vocabulary of "
                           f"data.tokenizer={tokenizer.name!r} ({tokenizer.n_vocab}) + 4 BERT specials "
                           f"{' '.join(SPECIALS)} = {sp.vocab_needed}")
    return sp


def frame(windows_BW: np.ndarray, eot: int, sp: BertSpecials) -> tuple[np.ndarray, np.ndarray]:
    """Token windows [B, T-2] -> (ids_BT = [CLS] window [SEP] with eot -> [SEP], segment_ids_BT)."""
    B = windows_BW.shape[0]
    body_BW = np.where(windows_BW == eot, sp.sep, windows_BW)
    ids_BT = np.concatenate([np.full((B, 1), sp.cls), body_BW, np.full((B, 1), sp.sep)], axis=1).astype(np.int32)
    is_sep_BT = ids_BT == sp.sep
    # A [SEP] closes its segment; the next document starts the other one.
    segment_ids_BT = ((np.cumsum(is_sep_BT, axis=1) - is_sep_BT) % 2).astype(np.int32)
    return ids_BT, segment_ids_BT


def max_predictions(seq_len: int) -> int:
    """K: the most positions a row of length T can have chosen (ceil(15% of T) >= round(15% of T - 2))."""
    return math.ceil(MASK_PROB * seq_len)


def choose(rng: np.random.Generator, ids_BT: np.ndarray, sp: BertSpecials) -> tuple[np.ndarray, np.ndarray]:
    """(chosen_BT bool, action_BT in {KEEP, MASK, RANDOM}): round(15%) of each row's non-specials (at
    least one), split 80/10/10."""
    eligible_BT = ~sp.is_special(ids_BT)
    n_B = eligible_BT.sum(1)
    want_B = np.where(n_B > 0, np.maximum(1, np.floor(MASK_PROB * n_B + 0.5)), 0).astype(np.int64)
    # A random rank among the row's eligible positions; the `want` lowest ranks are chosen.
    keys_BT = np.where(eligible_BT, rng.random(ids_BT.shape), np.inf)
    rank_BT = np.argsort(np.argsort(keys_BT, axis=1, kind="stable"), axis=1, kind="stable")
    chosen_BT = rank_BT < want_B[:, None]
    u_BT = rng.random(ids_BT.shape)
    action_BT = np.where(u_BT < MASK_TOKEN, MASK, np.where(u_BT < MASK_TOKEN + RANDOM_TOKEN, RANDOM, KEEP))
    return chosen_BT, np.where(chosen_BT, action_BT, KEEP)


def mask_tokens(rng: np.random.Generator, ids_BT: np.ndarray, sp: BertSpecials) -> dict[str, np.ndarray]:
    """Masked inputs, targets (the original ids) and weights (1 at the chosen positions)."""
    chosen_BT, action_BT = choose(rng, ids_BT, sp)
    random_BT = rng.integers(sp.ordinary_start, sp.n_ordinary, size=ids_BT.shape)
    inputs_BT = np.where(action_BT == MASK, sp.mask, np.where(action_BT == RANDOM, random_BT, ids_BT))
    return {"inputs": inputs_BT.astype(np.int32), "targets": ids_BT.astype(np.int32),
            "weights": chosen_BT.astype(np.float32)}


def chosen_positions(weights_BT: np.ndarray, K: int) -> np.ndarray:
    """positions_BK: the chosen positions of each row in order, then 0 ([CLS], never chosen) up to K."""
    chosen_BT = weights_BT > 0
    if chosen_BT[:, 0].any() or chosen_BT.sum(1).max(initial=0) > K:
        raise ValueError(f"a row chooses position 0 or more than {K} positions")
    order_BT = np.argsort(~chosen_BT, axis=1, kind="stable")[:, :K]
    return np.where(np.take_along_axis(chosen_BT, order_BT, 1), order_BT, 0).astype(np.int32)


def _batch(tokens, starts, seq_len: int, eot: int, sp: BertSpecials, rng) -> dict[str, np.ndarray]:
    windows_BW = np.asarray(tokens[starts[:, None] + np.arange(seq_len - 2)], dtype=np.int64)
    ids_BT, segment_ids_BT = frame(windows_BW, eot, sp)
    masked = mask_tokens(rng, ids_BT, sp)
    return {**masked, "positions": chosen_positions(masked["weights"], max_predictions(seq_len)),
            "segment_ids": segment_ids_BT, "valid": np.ones(ids_BT.shape, bool)}  # packed rows have no padding


def _rows(batch: dict, rows: slice) -> dict:
    return {k: np.ascontiguousarray(v[rows]) for k, v in batch.items()}


class MlmBatches:
    """step -> this process's rows of the global MLM batch, a pure function of (seed, step)."""

    def __init__(self, tokens, seq_len: int, global_batch: int, seed: int, eot: int, sp: BertSpecials,
                 process_index: int = 0, process_count: int = 1):
        if seq_len < 3:
            raise ZooDataError(f"data.seq_len={seq_len} leaves no room between [CLS] and [SEP]; use >= 3")
        if seed < 0:
            raise ZooDataError(f"seed={seed} must be >= 0 (train.seed)")
        self.tokens, self.seq_len, self.global_batch, self.seed, self.eot, self.sp = \
            tokens, seq_len, global_batch, seed, eot, sp
        self.rows = process_rows(global_batch, process_index, process_count)

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        starts = np.random.default_rng([self.seed, step]).integers(
            0, len(self.tokens) - (self.seq_len - 2) + 1, size=self.global_batch)
        batch = _batch(self.tokens, starts, self.seq_len, self.eot, self.sp,
                       np.random.default_rng([self.seed, step, 1]))
        return _rows(batch, self.rows)


def eval_batches(tokens, seq_len: int, global_batch: int, num_batches: int, eot: int, sp: BertSpecials,
                 process_index: int = 0, process_count: int = 1) -> list[dict[str, np.ndarray]]:
    """Fixed validation batches: consecutive windows (wrapping a short stream), fixed masks."""
    rows = process_rows(global_batch, process_index, process_count)
    W = seq_len - 2
    n_windows = max(len(tokens) // W, 1)
    out = []
    for b in range(num_batches):
        starts = (np.arange(b * global_batch, (b + 1) * global_batch) % n_windows) * W
        out.append(_rows(_batch(tokens, starts, seq_len, eot, sp, np.random.default_rng([EVAL_SEED, b])), rows))
    return out


def encode_masked(text: str, tokenizer, sp: BertSpecials) -> list[int]:
    """[CLS] text [SEP] with every literal mask text in `text` ("[MASK]"; RoBERTa's "<mask>") as the mask id
    (for fill-mask), as Hugging Face's tokenizer reads it: by the tokenizer itself where it knows the mask as
    a token, else split around it (the spaces the mask takes, as RoBERTa's takes those on its left, dropped)."""
    if tokenizer.encode(sp.mask_text) == [sp.mask]:
        return [sp.cls, *tokenizer.encode(text), sp.sep]
    pieces = text.split(sp.mask_text)
    lstrip, rstrip = sp.mask_strip
    ids = [sp.cls]
    for i, piece in enumerate(pieces):
        if i:
            ids.append(sp.mask)
        piece = piece.lstrip() if i and rstrip else piece
        ids.extend(tokenizer.encode(piece.rstrip() if i < len(pieces) - 1 and lstrip else piece))
    return ids + [sp.sep]


class MlmTask(BaseTask):
    """Masked-LM pretraining: loss and accuracy on the chosen positions only (weight = their count)."""

    name = "bert_mlm"
    UNIFORM_OVER_VOCAB = True
    EXCLUDE = ("['position']", "['segment']")  # lookups; the word embedding is also the tied output matmul

    def __init__(self, cfg):
        self.cfg, self.model = cfg, BertMlm(cfg.model)

    def init(self, rng):
        ids = jnp.zeros((1, self.cfg.data.seq_len), jnp.int32)
        return self.model.init(rng, ids, ids, jnp.ones(ids.shape, bool))["params"]

    def loss(self, params, batch, rng, train):
        # The head and the [V]-wide output run on the K chosen positions only (BERT's masked_lm_positions).
        pos_BK = batch["positions"]
        h_BKD = self.model.apply({"params": params}, batch["inputs"], batch["segment_ids"], batch["valid"],
                                 deterministic=not train, positions_BK=pos_BK, hidden=True, rngs={"dropout": rng})
        pick = lambda x_BT: jnp.take_along_axis(x_BT, pos_BK, axis=1)
        loss_sum, correct = losses.linear_cross_entropy(
            h_BKD, params["bert"]["embed"]["word"]["embedding"], pick(batch["targets"]), pick(batch["weights"]),
            bias_V=params["mlm_head"]["bias"], label_smoothing=self.cfg.train.label_smoothing if train else 0.0)
        return loss_sum, {"weight": jnp.sum(batch["weights"]), "correct": correct,
                          "tokens": jnp.sum(batch["valid"].astype(jnp.float32))}

    def flops_per_token(self, seq_len):
        # 6N plus attention; the tied output matmul and the head's transform run on K of T positions, so
        # they count K/T per token.
        m = self.cfg.model
        boxed = jax.eval_shape(self.init, jax.random.PRNGKey(0))
        head = count(boxed["mlm_head"]) + count(boxed["bert"]["embed"]["word"])
        full = 6 * count(boxed, exclude=self.EXCLUDE) + attention_flops(m.num_layers, m.num_heads, m.head_dim, seq_len)
        return full - 6 * head * (1 - max_predictions(seq_len) / seq_len)

    @classmethod
    def check_data(cls, cfg, vocab: bool = True):
        if vocab:
            check_bert_vocab(cfg.model, get_tokenizer(cfg.data.tokenizer))
        if cfg.data.source not in corpus.NAMED:  # the file or dataset opens and holds text in its column
            corpus.load_documents(cfg.data)
        return cfg

    def make_data(self, cfg, process_index: int, process_count: int) -> Data:
        tokenizer, tokens = store.prepare(cfg.data)
        sp = check_bert_vocab(cfg.model, tokenizer)
        eot = tokenizer.eot_token
        train = MlmBatches(tokens.train, cfg.data.seq_len, cfg.train.batch_size, cfg.train.seed, eot, sp,
                           process_index, process_count)
        evals = eval_batches(tokens.val, cfg.data.seq_len, cfg.train.batch_size, cfg.train.eval_batches, eot, sp,
                             process_index, process_count)
        return Data(train=train, eval=evals, tokenizer=tokenizer, rows=len(tokens.train) // (cfg.data.seq_len - 2))
