"""The token store: a corpus tokenized once, split into train and validation by document, written as
two flat token files (documents joined by eot) that later runs memory-map.

Stores live under data.cache_dir, keyed by source, split, column, tokenizer and format version; a
store is built in a temp dir and renamed into place, so a crash never leaves a half store.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass

import datasets
import numpy as np

from zoo.data.corpus import NAMED, load_documents, local_files
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ZooDataError
from zoo.runtime import quiet_datasets

FORMAT_VERSION = 1  # bump when the store layout or the train/val split changes: old stores are then ignored
DOCS_PER_PROC = 1000  # below this many documents per process, forking costs more than it saves


@dataclass
class TokenStore:
    """Train and validation token streams (documents joined by eot) memory-mapped from `path`."""

    train: np.ndarray  # 1-D memmap of token ids
    val: np.ndarray  # 1-D memmap of token ids
    path: str  # the store directory


def store_dtype(n_vocab: int) -> np.dtype:
    return np.dtype(np.uint16 if n_vocab <= 65535 else np.uint32)


def _fingerprint(source: str):
    """What changes a source's content without changing its name."""
    if source in NAMED:
        return NAMED[source][1]()
    if source.startswith("hub:"):
        return None
    return [(f, os.path.getsize(f), os.stat(f).st_mtime_ns) for f in local_files(source)]


def store_key(cfg, tokenizer) -> str:
    # A tokenizer read from files is keyed by their content (and kind and file name), not where they lie: a
    # run's own copy of its base's tokenizer shares the base's stores.
    fingerprint = getattr(tokenizer, "fingerprint", None)
    name = tokenizer.name if fingerprint is None else f"{type(tokenizer).__name__}:{os.path.basename(tokenizer.name)}"
    ident = dict(source=cfg.source, split=cfg.split, text_column=cfg.text_column, val_fraction=cfg.val_fraction,
                 tokenizer=name, tokenizer_fingerprint=fingerprint,
                 n_vocab=tokenizer.n_vocab, version=FORMAT_VERSION, fingerprint=_fingerprint(cfg.source))
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def doc_hash(text: str) -> float:
    """A document's place in [0, 1): from its text, so exact duplicates always land in the same split."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big") / 2.0**64


def val_documents(u: np.ndarray, val_fraction: float) -> np.ndarray:
    """bool[n] from the documents' hashes: validation iff below val_fraction, with at least one on each side."""
    is_val = u < val_fraction
    if not is_val.any():
        is_val[np.argmin(u)] = True
    if is_val.all():
        is_val[np.argmax(u)] = False
    return is_val


def _write_tokens(tokenized: datasets.Dataset, is_val: np.ndarray, dirname: str, dtype) -> dict:
    """Stream the tokenized documents into train.bin / val.bin in document order."""
    counts = dict(train_tokens=0, val_tokens=0)
    start = 0
    with open(os.path.join(dirname, "train.bin"), "wb") as ft, open(os.path.join(dirname, "val.bin"), "wb") as fv:
        for table in tokenized.with_format("arrow").iter(batch_size=10_000):
            ids = table.column("ids").combine_chunks()  # ListArray: one row of ids per document
            flat = ids.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)
            tok_val = np.repeat(is_val[start:start + len(ids)], ids.value_lengths().to_numpy())
            flat[~tok_val].tofile(ft)
            flat[tok_val].tofile(fv)
            counts["val_tokens"] += int(tok_val.sum())
            counts["train_tokens"] += int(len(flat) - tok_val.sum())
            start += len(ids)
    return counts


def _write_meta(dirname: str, meta: dict) -> None:
    with open(os.path.join(dirname, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)


def _build(cfg, tokenizer, key: str, tmp: str) -> None:
    docs = load_documents(cfg)
    if len(docs) < 2:
        raise ZooDataError(f"data.source={cfg.source!r} has {len(docs)} document; a train/val split by "
                           f"document needs at least 2")
    dtype, eot = store_dtype(tokenizer.n_vocab), tokenizer.eot_token

    def tokenize(batch):
        return {"ids": [ids + [eot] for ids in tokenizer.encode_batch(batch["text"])],
                "u": [doc_hash(t) for t in batch["text"]]}

    num_proc = min(cfg.num_proc, max(1, len(docs) // DOCS_PER_PROC))
    with quiet_datasets():  # its "tokenizing" bar
        tokenized = docs.map(
            tokenize, batched=True, batch_size=1000, num_proc=num_proc if num_proc > 1 else None,
            remove_columns=docs.column_names,
            features=datasets.Features({"ids": datasets.List(datasets.Value(dtype.name)),
                                        "u": datasets.Value("float64")}),
            # The Arrow intermediate lives in the temp dir, so it vanishes with it; a given fingerprint
            # spares datasets from hashing the tokenizer (a BPE table) to name the cache file.
            cache_file_name=os.path.join(tmp, "arrow", "ids.arrow"), new_fingerprint=key, desc="tokenizing")
    is_val = val_documents(tokenized.data.column("u").to_numpy(), cfg.val_fraction)
    counts = _write_tokens(tokenized, is_val, tmp, dtype)
    del tokenized
    shutil.rmtree(os.path.join(tmp, "arrow"), ignore_errors=True)
    _write_meta(tmp, dict(
        format=FORMAT_VERSION, source=cfg.source, split=cfg.split, text_column=cfg.text_column,
        tokenizer=tokenizer.name, n_vocab=tokenizer.n_vocab, eot_token=eot, dtype=dtype.name,
        val_fraction=cfg.val_fraction, train_documents=int((~is_val).sum()), val_documents=int(is_val.sum()),
        **counts))


def open_store(path: str) -> TokenStore:
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    train, val = (np.memmap(os.path.join(path, f"{split}.bin"), dtype=meta["dtype"], mode="r")
                  for split in ("train", "val"))
    return TokenStore(train=train, val=val, path=path)


def build_token_store(cfg, tokenizer) -> TokenStore:
    """Tokenize the corpus once into `cache_dir/<key>`; later calls reuse it without reading the source."""
    root = os.path.expanduser(cfg.cache_dir)
    key = store_key(cfg, tokenizer)
    path = os.path.join(root, key)
    if os.path.exists(os.path.join(path, "meta.json")):
        return open_store(path)
    os.makedirs(root, exist_ok=True)
    # Built in a sibling temp dir and renamed into place: a crash leaves no half store under `key`.
    tmp = tempfile.mkdtemp(prefix=f".{key}.partial-", dir=root)
    try:
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide a shared cache's stores from other users
        _build(cfg, tokenizer, key, tmp)
        publish(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return open_store(path)


def publish(tmp: str, path: str) -> None:
    """Rename a cache directory built in `tmp` (its meta.json written last) into place at `path`: whatever lies
    there without a meta.json is debris and goes; if another process put a complete one there first, it is the same
    (the same key) and stays."""
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "meta.json")):
        shutil.rmtree(path)
    try:
        os.rename(tmp, path)
    except OSError:
        if not os.path.exists(os.path.join(path, "meta.json")):
            raise


def check_length(store: TokenStore, seq_len: int, source: str) -> None:
    """Both streams must hold one full training row (seq_len inputs + 1 target)."""
    for split, tokens in (("train", store.train), ("val", store.val)):
        if len(tokens) < seq_len + 1:
            raise ZooDataError(f"data.source={source!r} has {len(tokens)} {split} tokens, fewer than "
                               f"data.seq_len + 1 = {seq_len + 1}; lower data.seq_len or use a larger corpus")


def prepare(cfg, tokenizer=None):
    """(tokenizer, store) for a run, with the store checked to be long enough for `cfg.seq_len`."""
    tokenizer = tokenizer if tokenizer is not None else get_tokenizer(cfg.tokenizer)
    store = build_token_store(cfg, tokenizer)
    check_length(store, cfg.seq_len, cfg.source)
    return tokenizer, store


