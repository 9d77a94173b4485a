"""tiktoken-based BPE: the zoo-tokenizer wrapper of a `tiktoken.Encoding`, the regex and specials of
tiktoken's named encodings (read offline), and local `.tiktoken` ranks files.

Text that happens to contain `<|endoftext|>` is encoded as ordinary text: documents are separated by
`eot_token` ids that the pipeline appends, never by strings inside a document. Only
`encode_with_offsets`, for text a chat template wrote (zoo.data.chat), reads `eot_text` as `eot_token`.
"""

from __future__ import annotations

import hashlib
import os
import types

import tiktoken
import tiktoken.load
from tiktoken_ext import openai_public

from zoo.errors import ZooDataError

ENDOFTEXT = "<|endoftext|>"
# The encoding whose regex a `.tiktoken` file of an unknown name is split with.
FALLBACK_ENCODING = "cl100k_base"


class TiktokenTokenizer:
    """A `tiktoken.Encoding` behind the zoo tokenizer surface."""

    def __init__(self, encoding: tiktoken.Encoding, name: str | None = None, fingerprint: str | None = None):
        self.encoding = encoding
        self.name = name or encoding.name
        self.fingerprint = fingerprint  # content hash of a local ranks file; part of the token-store key
        self.n_vocab = encoding.n_vocab
        self.eot_token = encoding.eot_token
        self.eot_text = encoding.decode_single_token_bytes(encoding.eot_token).decode("utf-8")

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode(text, disallowed_special=())

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """(ids, start character of each id), with `eot_text` read as `eot_token`."""
        ranks = self.encoding.encode(text, allowed_special={self.eot_text}, disallowed_special=())
        return self._ids(ranks), self.encoding.decode_with_offsets(ranks)[1]

    def _ids(self, ranks: list[int]) -> list[int]:
        return ranks

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_batch(list(texts), disallowed_special=())

    def decode(self, ids) -> str:
        return self.encoding.decode([int(i) for i in ids])


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
                           f"bytes, {', '.join(tiktoken.list_encoding_names())}")
    with open(full, "rb") as f:
        content = f.read()
    if content[:4] == b"GGUF":
        raise ZooDataError(f"data.tokenizer={path!r} is a GGUF file: its tokenizer is read once the file is "
                           f"converted; train.py and zoo.train convert it for you (data.tokenizer=FILE.gguf, or "
                           f"init_from=FILE.gguf with data.tokenizer=init_from), or name the directory "
                           f"`zoo-convert from-gguf FILE.gguf OUT` writes (data.tokenizer=OUT/tokenizer)")
    sha = hashlib.sha256(content).hexdigest()
    try:
        # tiktoken caches every file it reads by path; pinning the hash makes an edited file miss that cache.
        ranks = tiktoken.load.load_tiktoken_bpe(full, expected_hash=sha)
    except ValueError as e:
        reason = str(e).splitlines()[0][:120]  # the parser quotes the offending line: a binary file's is noise
        raise ZooDataError(f"data.tokenizer={path!r} is not a .tiktoken ranks file ({reason})") from None
    stem = os.path.basename(full).split(".")[0]
    if stem in openai_public.ENCODING_CONSTRUCTORS:
        pat_str, special = encoding_spec(stem)
    else:
        pat_str, special = encoding_spec(FALLBACK_ENCODING)[0], {ENDOFTEXT: len(ranks)}
    encoding = tiktoken.Encoding(name=stem, pat_str=pat_str, mergeable_ranks=ranks, special_tokens=special)
    # Path and content hash identify it: different files, or one file edited, must not share a token store.
    return TiktokenTokenizer(encoding, name=full, fingerprint=sha)


