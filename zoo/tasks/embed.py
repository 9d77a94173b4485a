"""Contrastive fine-tuning of sentence embeddings (task=embed) on a BERT-family encoder (a decoder's:
zoo.tasks.embed_decoder): (anchor, positive) pairs, optionally a hard negative each, and sentence-transformers'
MultipleNegativesRankingLoss with in-batch negatives.

Data: any source of zoo.data (`hub:NAME[/CONFIG]`, local json/jsonl/parquet/csv/tsv) with the columns
sentence-transformers and TRL name, found automatically: anchor/positive (optional negative) or query/document
(optional negative). `builtin` is an offline set of pairs: the first sentence of a pydoc topic paragraph and the
rest of it, of the training topics only (zoo.data.pydoc_pairs). Each text is framed as `Pretrained.embed` frames it
([CLS] text [SEP], cut to data.seq_len); a batch is inputs/valid [B, K, T] (K = 2, or 3 with negatives) and weights
[B] (0: an eval batch's padding row).

Loss (per anchor i, over the whole global batch inside the jitted step, so under data parallelism the similarity
matrix spans every device's rows: every device's positives and negatives are each anchor's candidates):
  ce_i = logsumexp_j(scale * cos(a_i, c_j)) - scale * cos(a_i, p_i),  c = [p_1..p_B, n_1..n_B]
and with embed.symmetric the positive -> anchors direction is averaged in (MultipleNegativesSymmetricRankingLoss:
(lse_j(scale cos(a_i, c_j)) + lse_j(scale cos(p_i, a_j))) / 2 - scale cos(a_i, p_i)). With train.grad_accum > 1
the candidates are one microbatch's. Metrics: the mean loss and in-batch accuracy (argmax_j = i).

Pooling is the init_from checkpoint's (its sentence-transformers files, found through a converted base's source or
a run's own init_from), or embed.pooling; the run keeps modules.json, 1_Pooling/config.json and
sentence_bert_config.json in its workdir, so `zoo.load(run).embed` pools as it trained. embed.mini_batch=M is a
gradient cache (CachedMultipleNegativesRankingLoss, zoo.tasks.grad_cache): the encoder runs over chunks of M pairs
holding one chunk's activations at a time, the loss and its gradient unchanged, so a batch (and its in-batch
negatives) can outgrow the devices' memory for activations.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os

import datasets
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from zoo.data import corpus, pydoc_pairs
from zoo.data.batches import EpochOrder, process_rows
from zoo.data.store import doc_hash, val_documents
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ZooDataError
from zoo.models.bert import Bert, BertConfig
from zoo.tasks import grad_cache
from zoo.tasks.base import Data
from zoo.tasks.classify import _Encoder
from zoo.tasks.mlm import check_bert_vocab, check_ids
from zoo.task_settings import embed_poolings

# Column sets, first match wins: (anchor, positive, optional hard negative).
COLUMNS = (("anchor", "positive", "negative"), ("query", "document", "negative"))
# Every pooling zoo pools with -> its key in 1_Pooling/config.json (last: a decoder's last token; which of them
# task=embed trains a family with: zoo.task_settings.embed_poolings).
POOLINGS = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
            "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens", "last": "pooling_mode_lasttoken"}
MASKED = -1e9  # the logit of a padding row as a candidate: finite, so a padding row's own loss (weight 0) is not NaN


def builtin_pairs() -> datasets.Dataset:
    """Offline pairs: a pydoc topic paragraph's first sentence (anchor) and the rest of it (positive), of the
    training topics only (zoo.data.pydoc_pairs: `zoo-eval --task retrieval builtin` searches the others)."""
    anchors, positives = pydoc_pairs.pairs("train")
    return datasets.Dataset.from_dict({"anchor": anchors, "positive": positives})


def load_pairs(dcfg) -> datasets.Dataset:
    if dcfg.source == "builtin":
        return builtin_pairs()
    return corpus.load_hub(dcfg) if dcfg.source.startswith("hub:") else corpus.load_local(dcfg)


def columns_of(ds: datasets.Dataset, source: str) -> tuple[str, ...]:
    """(anchor, positive[, negative]) column names of `ds`, or a one-line error naming the columns found."""
    for a, p, n in COLUMNS:
        if a in ds.column_names and p in ds.column_names:
            return (a, p, n) if n in ds.column_names else (a, p)
    raise ZooDataError(f"data.source={source!r} has columns {', '.join(ds.column_names)}; task=embed reads "
                       f"anchor/positive (optional negative) or query/document (optional negative)")


def texts_of(ds: datasets.Dataset, col: str) -> list[str]:
    texts = ds[col]
    empty = [i for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
    if empty:
        raise ZooDataError(f"row {empty[0]} of column {col!r} is empty or not text ({len(empty)} such rows); "
                           f"remove them from the source")
    return texts


def encode(tokenizer, sp, texts: list[str], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids [N, T], lengths [N]): [CLS] text [SEP], cut to T = seq_len, as Pretrained.embed frames a text."""
    ids = np.full((len(texts), seq_len), sp.pad, np.int32)
    lengths = np.zeros(len(texts), np.int64)
    for i, x in enumerate(tokenizer.encode_batch(texts)):
        row = [sp.cls, *x[:seq_len - 2], sp.sep]
        ids[i, :len(row)], lengths[i] = row, len(row)
    return ids, lengths


class Pairs:
    """Encoded rows: ids [N, K, T], lengths [N, K] (K: anchor, positive[, negative])."""

    def __init__(self, ids: np.ndarray, lengths: np.ndarray):
        self.ids, self.lengths = ids, lengths

    def __len__(self):
        return len(self.ids)

    def rows(self, idx: np.ndarray, weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
        valid_BKT = np.arange(self.ids.shape[-1]) < self.lengths[idx][..., None]
        return {"inputs": self.ids[idx], "valid": valid_BKT,
                "weights": np.ones(len(idx), np.float32) if weights is None else weights.astype(np.float32)}


class PairBatches:
    """step -> this process's rows of the global batch: epoch-wise permutations from (seed, epoch)."""

    def __init__(self, pairs: Pairs, global_batch: int, seed: int, process_index: int = 0, process_count: int = 1):
        self.pairs, self.order = pairs, EpochOrder(len(pairs), global_batch, seed)
        self.rows = process_rows(global_batch, process_index, process_count)

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        return self.pairs.rows(self.order(step)[self.rows])


def eval_batches(pairs: Pairs, global_batch: int, num_batches: int, process_index: int = 0,
                 process_count: int = 1) -> list[dict[str, np.ndarray]]:
    """The first num_batches * B validation pairs in order; a short last batch is padded with weight-0 rows."""
    rows, out = process_rows(global_batch, process_index, process_count), []
    for b in range(min(num_batches, math.ceil(len(pairs) / global_batch))):
        pos = np.arange(b * global_batch, (b + 1) * global_batch)
        real = pos < len(pairs)
        out.append(pairs.rows(np.where(real, pos, 0)[rows], real[rows]))
    return out


def pool_hidden(h_BTD, valid_BT, mode: str):
    """float32[B, D]: the hidden states pooled as `mode` (POOLINGS) says; Pretrained.embed pools with this too."""
    h_BTD = h_BTD.astype(jnp.float32)
    m_BT1 = valid_BT[..., None].astype(jnp.float32)
    n_B1 = jnp.maximum(m_BT1.sum(1), 1.0)
    if mode == "cls":
        return h_BTD[:, 0]
    if mode == "max":
        return jnp.max(jnp.where(m_BT1 > 0, h_BTD, -jnp.inf), 1)
    if mode == "last":
        last_B = valid_BT.sum(1) - 1
        return jnp.take_along_axis(h_BTD, last_B[:, None, None], 1)[:, 0]
    return (h_BTD * m_BT1).sum(1) / (n_B1 if mode == "mean" else jnp.sqrt(n_B1))


def unit(x_BD):
    """Each row L2-normalised, with torch's cos_sim / Normalize eps."""
    return x_BD / jnp.maximum(jnp.linalg.norm(x_BD, axis=-1, keepdims=True), 1e-12)


def mnrl(a_BD, docs_CD, w_B, scale: float, symmetric: bool):
    """(ce_B, correct_B): MultipleNegativesRankingLoss per anchor (its symmetric variant with `symmetric`) of
    anchors a_BD against candidates docs_CD (positives first, then each negative column; C = B * (K - 1)); rows of
    weight 0 are no candidates."""
    a_BD, docs_CD = unit(a_BD), unit(docs_CD)
    B = a_BD.shape[0]
    real_C = jnp.tile(w_B > 0, docs_CD.shape[0] // B)
    logits_BC = jnp.where(real_C[None], scale * a_BD @ docs_CD.T, MASKED)
    pos_B = jnp.diagonal(logits_BC[:, :B])
    log_z_B = jax.nn.logsumexp(logits_BC, axis=1)
    if symmetric:  # positive i against every anchor, its own softmax, averaged with the anchor's
        logits_BB = jnp.where((w_B > 0)[None], scale * docs_CD[:B] @ a_BD.T, MASKED)
        log_z_B = (log_z_B + jax.nn.logsumexp(logits_BB, axis=1)) / 2
    return log_z_B - pos_B, jnp.argmax(logits_BC, axis=1) == jnp.arange(B)


class Embedder(nn.Module):
    """The bare encoder, as `bert` (the params of a converted BertModel): (ids, segments, valid) -> x_BTD."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, ids_BT, segment_ids_BT, valid_BT, *, deterministic: bool = True):
        return Bert(self.cfg, name="bert")(ids_BT, segment_ids_BT, valid_BT, deterministic)


def st_dir(path: str, depth: int = 4) -> str | None:
    """The directory whose sentence-transformers files describe init_from `path`: itself, the Hugging Face
    directory a converted base came from (converted.json), or a run's own init_from, followed back."""
    for _ in range(depth):
        if not path or not os.path.isdir(path):
            return None
        if os.path.isfile(os.path.join(path, "modules.json")):
            return path
        nxt = ""
        for name, key in (("converted.json", "source"), ("config.json", "init_from")):
            try:
                with open(os.path.join(path, name)) as f:
                    nxt = json.load(f).get(key) or ""
            except (OSError, ValueError, AttributeError):
                continue
            if nxt:
                break
        path = nxt if not nxt or os.path.isabs(nxt) else os.path.join(path, nxt)
    return None


@dataclasses.dataclass(frozen=True)
class Pooling:
    """What a checkpoint's sentence-transformers files say (read for task=embed and for Pretrained.embed)."""

    mode: str  # mean | cls | max | mean_sqrt_len | last (POOLINGS)
    normalize: bool  # modules.json lists a Normalize module
    max_len: int  # sentence_bert_config.json's max_seq_length (else the model's positions)
    prompts: tuple = ()  # config_sentence_transformers.json's named prompts, ((name, text), ...) sorted


def _json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def st_pooling(d: str | None, max_len: int, default: str = "mean", modes=tuple(POOLINGS), hint: str = "") -> Pooling:
    """The pooling of the sentence-transformers files in `d` (None, or no Pooling module: `default`,
    unnormalised); a Pooling module that asks for none, several or another than one of `modes` is refused in one
    line (ending with `hint`)."""
    if d is None:
        return Pooling(default, False, max_len)
    modules = _json(os.path.join(d, "modules.json")) or []
    types = {m.get("type", "").rsplit(".", 1)[-1]: m.get("path", "") for m in modules if isinstance(m, dict)}
    mode = default
    if "Pooling" in types:
        where = os.path.join(d, types["Pooling"], "config.json")
        cfg = _json(where) or {}
        chosen = [m for m, key in POOLINGS.items() if cfg.get(key)]
        chosen += ["weightedmean"] if cfg.get("pooling_mode_weightedmean_tokens") else []
        if len(chosen) != 1 or chosen[0] not in modes:
            raise ZooDataError(f"{where} asks for another pooling ({', '.join(chosen) or 'none'}) than exactly one "
                               f"of {', '.join(modes)}{hint}")
        mode = chosen[0]
    st = _json(os.path.join(d, "sentence_bert_config.json")) or {}
    if st.get("max_seq_length"):
        max_len = min(max_len, int(st["max_seq_length"]))
    prompts = (_json(os.path.join(d, "config_sentence_transformers.json")) or {}).get("prompts") or {}
    return Pooling(mode, "Normalize" in types, max_len, tuple(sorted(prompts.items())))


def read_pooling(d: str | None, max_len: int, family: str = "bert") -> Pooling:
    """task=embed's pooling of the sentence-transformers files in `d` for a model of `family` (None: an encoder's
    mean, a decoder's last token, unnormalised): one of the family's embed_poolings."""
    modes = embed_poolings(family)
    return st_pooling(d, max_len, modes[0], modes=modes, hint=", which task=embed trains with; set embed.pooling")


class EmbedTask(_Encoder):
    """Contrastive sentence embeddings: MNRL over the global batch (weight = anchors); metrics loss, accuracy."""

    name = "embed"
    PERPLEXITY = False  # a loss per pair, not per token

    def __init__(self, cfg):
        self.cfg, self.model = cfg, Embedder(cfg.model)

    @functools.cached_property
    def pooling(self) -> Pooling:
        """The init_from checkpoint's pooling (an encoder's mean, a decoder's last token, unnormalised, without
        sentence-transformers files), with embed.pooling's mode when set."""
        pool = read_pooling(st_dir(self.cfg.init_from), self.cfg.model.max_len, self.cfg.model.family)
        return dataclasses.replace(pool, mode=self.cfg.embed.pooling or pool.mode)

    def hidden_states(self, params, ids_NT, valid_NT, train: bool, rng):
        """x_NTD: the encoder's last hidden states of the framed rows."""
        return self.model.apply({"params": params}, ids_NT, jnp.zeros_like(ids_NT), valid_NT, deterministic=not train,
                                rngs={"dropout": rng})

    @classmethod
    def check_vocab(cls, cfg, tokenizer):
        """The tokenizer fits the model; returns what `frame` takes (the encoder's special tokens)."""
        return check_bert_vocab(cfg.model, tokenizer)

    @staticmethod
    def frame(tokenizer, specials, texts: list[str], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids [N, T], lengths [N]) of texts as Pretrained.embed frames them."""
        return encode(tokenizer, specials, texts, seq_len)

    def loss(self, params, batch, rng, train):
        ids_BKT, valid_BKT, w_B = batch["inputs"], batch["valid"], batch["weights"]
        B, K, T = ids_BKT.shape

        def embed_rows(ids_bKT, valid_bKT, rng):  # [b, K, T] -> e_bKD, the pooled vector of each text
            b = ids_bKT.shape[0]
            ids_NT, valid_NT = ids_bKT.reshape(b * K, T), valid_bKT.reshape(b * K, T)
            h_NTD = self.hidden_states(params, ids_NT, valid_NT, train, rng)
            return pool_hidden(h_NTD, valid_NT, self.pooling.mode).reshape(b, K, -1)

        e = self.cfg.embed
        if 0 < e.mini_batch < B:  # the gradient cache: one chunk's activations at a time (zoo.tasks.grad_cache)
            e_BKD = grad_cache.map_rows(embed_rows, (ids_BKT, valid_BKT), e.mini_batch, rng)
        else:
            e_BKD = embed_rows(ids_BKT, valid_BKT, rng)
        docs_CD = e_BKD[:, 1:].swapaxes(0, 1).reshape(B * (K - 1), -1)  # positives, then each negative column
        ce_B, correct_B = mnrl(e_BKD[:, 0], docs_CD, w_B, e.scale, e.symmetric)
        return jnp.sum(ce_B * w_B), {"weight": jnp.sum(w_B), "correct": jnp.sum(correct_B * w_B),
                                     "tokens": jnp.sum(valid_BKT * w_B[:, None, None])}

    def train_metrics(self, totals: dict) -> dict:
        return {"accuracy": totals["correct"] / max(totals["weight"], 1.0)} if "correct" in totals else {}

    @classmethod
    def check_data(cls, cfg, vocab: bool = True):
        d = cfg.data
        if vocab:
            cls.check_vocab(cfg, get_tokenizer(d.tokenizer))
        ds = load_pairs(d)
        cols = columns_of(ds, d.source)
        texts = [texts_of(ds, col) for col in cols]
        if all(a == p for a, p in zip(texts[0], texts[1])):
            raise ZooDataError(f"data.source={d.source!r}: every {cols[1]} equals its {cols[0]} ({len(ds)} rows), so "
                               f"the loss teaches nothing; give each {cols[0]} another text that should match it")
        if len(ds) < 2:
            raise ZooDataError(f"data.source={d.source!r} has {len(ds)} pair; a train/val split needs 2")
        return cfg

    def make_data(self, cfg, process_index: int, process_count: int) -> Data:
        d, tokenizer = cfg.data, get_tokenizer(cfg.data.tokenizer)
        sp = self.check_vocab(cfg, tokenizer)
        ds = load_pairs(d)
        cols = columns_of(ds, d.source)
        texts = [texts_of(ds, c) for c in cols]
        enc = [self.frame(tokenizer, sp, t, d.seq_len) for t in texts]
        ids_NKT = np.stack([e[0] for e in enc], 1)
        check_ids(ids_NKT, cfg.model.vocab_size, tokenizer, f"data.source={d.source!r}")
        lengths_NK = np.stack([e[1] for e in enc], 1)
        is_val = val_documents(np.asarray([doc_hash(a + "\x00" + p) for a, p in zip(texts[0], texts[1])]),
                               d.val_fraction)
        train, val = Pairs(ids_NKT[~is_val], lengths_NK[~is_val]), Pairs(ids_NKT[is_val], lengths_NK[is_val])
        print(f"data: task=embed reads columns {', '.join(cols)} of data.source={d.source!r} "
              f"({len(train)} training pairs)", flush=True)
        return Data(train=PairBatches(train, cfg.train.batch_size, cfg.train.seed, process_index, process_count),
                    eval=eval_batches(val, cfg.train.batch_size, cfg.train.eval_batches, process_index, process_count),
                    tokenizer=tokenizer, rows=len(train))

    def evaluate_extra(self, params, data) -> dict:
        """Retrieval on the validation pairs the evaluation reads (train.eval_batches of them), as `zoo-eval --task
        retrieval` scores a BEIR set: each anchor a query whose one relevant passage is its positive, every one of
        those positives the corpus, exact cosine search: eval_ndcg@10, eval_mrr@10, eval_recall@1 and @10. Left
        out on several processes (each holds only its own rows)."""
        from zoo.eval import retrieval
        real = [(b["inputs"][i, :2], b["valid"][i, :2]) for b in data.eval for i in np.flatnonzero(b["weights"] > 0)]
        if len(real) < 2 or jax.process_count() > 1:
            return {}
        if any(len(x.sharding.device_set) > 1 for x in jax.tree.leaves(params)):  # one device: gathered once
            params = jax.device_put(jax.device_get(params), jax.local_devices()[0])
        ids_NT = np.concatenate([r[0] for r in real])  # anchor, positive, anchor, positive, ...
        valid_NT = np.concatenate([r[1] for r in real])
        B = 2 * self.cfg.train.batch_size
        vectors = []
        for i in range(0, len(ids_NT), B):  # every chunk padded to B rows: one program
            ids, valid = ids_NT[i:i + B], valid_NT[i:i + B]
            pad = B - len(ids)
            ids, valid = np.pad(ids, ((0, pad), (0, 0))), np.pad(valid, ((0, pad), (0, 0)), constant_values=True)
            vectors.append(np.asarray(self._pooled(params, ids, valid))[:B - pad])
        e_N2D = np.concatenate(vectors).reshape(len(real), 2, -1)
        _, idx = retrieval.search(e_N2D[:, 0], e_N2D[:, 1], k=10)
        ranked = {str(q): [str(d) for d in row] for q, row in enumerate(idx)}
        scores = retrieval.metrics(ranked, {str(q): {str(q): 1} for q in range(len(real))}, k_values=(1, 10))
        return {f"eval_{k}": v for k, v in scores.items() if k != "queries"}

    @functools.cached_property
    def _pooled(self):
        """(params, ids_NT, valid_NT) -> e_ND, jitted: the texts' pooled vectors, no dropout."""
        return jax.jit(lambda params, ids_NT, valid_NT: pool_hidden(
            self.hidden_states(params, ids_NT, valid_NT, False, jax.random.PRNGKey(0)), valid_NT, self.pooling.mode))

    def prepare(self, params, data, workdir, resume, mesh):
        """The run's sentence-transformers files, so zoo.load(run).embed (and SentenceTransformer) pool as it trained."""
        if jax.process_index() == 0:
            write_st_files(workdir, self.pooling, self.cfg.model.d_model)


def write_st_files(workdir: str, pool: Pooling, dim: int) -> None:
    """modules.json, 1_Pooling/config.json (and 2_Normalize/ when normalised), sentence_bert_config.json."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if pool.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        os.makedirs(os.path.join(workdir, "2_Normalize"), exist_ok=True)
    pooling = {"word_embedding_dimension": dim, **{k: pool.mode == m for m, k in POOLINGS.items()},
               "pooling_mode_weightedmean_tokens": False, "include_prompt": True}
    os.makedirs(os.path.join(workdir, "1_Pooling"), exist_ok=True)
    for name, obj in (("modules.json", modules), ("1_Pooling/config.json", pooling),
                      ("sentence_bert_config.json", {"max_seq_length": pool.max_len, "do_lower_case": False})):
        with open(os.path.join(workdir, name), "w") as f:
            json.dump(obj, f, indent=2)
