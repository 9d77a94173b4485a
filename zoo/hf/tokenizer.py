"""Tokenizers that travel with a Hugging Face checkpoint, loaded from its directory, offline.

- GPT-2 byte-level BPE (vocab.json + merges.txt) becomes a tiktoken encoding built from the files
  alone (no download), with the checkpoint's own ids.
- BERT WordPiece (tokenizer.json, else vocab.txt + tokenizer_config.json) goes through the
  `tokenizers` package, which tiktoken cannot stand in for (lower-casing, accent stripping, "##"
  continuations). Its `encode` gives the text's ids without [CLS] / [SEP] (zoo frames rows itself),
  and `special_ids` / `ordinary_ids` hand the vocabulary's own specials to zoo.mlm.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

import numpy as np
import tiktoken

from zoo.tokenizers import ENDOFTEXT, TiktokenTokenizer, ZooDataError, encoding_spec


def _fingerprint(directory: str, names) -> str:
    h = hashlib.sha256()
    for n in names:
        with open(os.path.join(directory, n), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable stand-in character of each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class RemappedBpe(TiktokenTokenizer):
    """tiktoken BPE whose ranks follow merges.txt; ids are the checkpoint's vocabulary ids.

    tiktoken merges by the rank of the merged bytes, Hugging Face by the merge's line in
    merges.txt: ranks = 256 + line number reproduce it. The two numberings coincide for GPT-2's
    own files; a tokenizer trained elsewhere (special tokens first, say) needs the id table.
    """

    def __init__(self, encoding, rank_to_id: np.ndarray, n_vocab: int, eot: int, name: str, fingerprint: str):
        super().__init__(encoding, name=name, fingerprint=fingerprint)
        self.rank_to_id = rank_to_id
        self.id_to_rank = {int(i): r for r, i in enumerate(rank_to_id) if i >= 0}
        self.n_vocab, self.eot_token = n_vocab, eot

    def encode(self, text: str) -> list[int]:
        return self.rank_to_id[self.encoding.encode(text, disallowed_special=())].tolist()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.rank_to_id[r].tolist() for r in self.encoding.encode_batch(list(texts), disallowed_special=())]

    def decode(self, ids) -> str:
        return self.encoding.decode([self.id_to_rank[int(i)] for i in ids if int(i) in self.id_to_rank])


def gpt2_bpe(directory: str) -> TiktokenTokenizer:
    with open(os.path.join(directory, "vocab.json"), encoding="utf-8") as f:
        vocab: dict[str, int] = json.load(f)
    with open(os.path.join(directory, "merges.txt"), encoding="utf-8") as f:
        merges = [line.split() for line in f.read().splitlines() if line and not line.startswith("#version")]
    to_byte = _unicode_to_byte()
    as_bytes = lambda token: bytes(to_byte[c] for c in token)
    byte_char = {b: c for c, b in to_byte.items()}
    ranks = {bytes([b]): b for b in range(256)}
    rank_ids = [vocab.get(byte_char[b], -1) for b in range(256)]
    for a, b in merges:
        merged = as_bytes(a) + as_bytes(b)
        if merged not in ranks:
            ranks[merged] = len(rank_ids)
            rank_ids.append(vocab.get(a + b, -1))
    eot = vocab.get(ENDOFTEXT, len(vocab))
    special = {ENDOFTEXT: len(rank_ids)}
    rank_ids.append(eot)
    enc = tiktoken.Encoding(name=f"bpe:{os.path.abspath(directory)}", pat_str=encoding_spec("r50k_base")[0],
                            mergeable_ranks=ranks, special_tokens=special)
    return RemappedBpe(enc, np.asarray(rank_ids), max(max(vocab.values()) + 1, eot + 1), eot,
                       name=os.path.abspath(directory), fingerprint=_fingerprint(directory, ["vocab.json", "merges.txt"]))


class WordPiece:
    """A `tokenizers.Tokenizer` with a WordPiece model behind the zoo tokenizer surface.

    Documents are separated by [SEP] (`eot_token`), as BERT's pretraining data was. As in Hugging
    Face, a literal "[SEP]" or "[MASK]" in the text is that special token.
    """

    def __init__(self, tok, name: str, fingerprint: str, names: dict[str, str]):
        tok.no_padding()  # a checkpoint's tokenizer.json may pad and truncate (MiniLM: to 128)
        tok.no_truncation()
        self.tok, self.name, self.fingerprint = tok, name, fingerprint
        vocab = tok.get_vocab(with_added_tokens=True)
        missing = [t for t in names.values() if t not in vocab]
        if missing:
            raise ZooDataError(f"data.tokenizer={name!r}: the vocabulary has no {', '.join(missing)}")
        self.n_vocab = max(vocab.values()) + 1
        self.special_ids = {k: vocab[t] for k, t in names.items() if k != "unk"}
        self.eot_token = self.special_ids["sep"]
        self.ordinary_ids = _ordinary_ids(vocab, self.n_vocab)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)


def _ordinary_ids(vocab: dict[str, int], n_vocab: int) -> range:
    """The longest run of ids holding no bracketed token ([PAD], [unused7], [CLS], ...): what MLM
    masking may draw as a random replacement and fill-mask may predict ([999, 30522) for BERT's)."""
    bracketed = sorted(i for t, i in vocab.items() if re.fullmatch(r"\[[^\[\]\s]+\]", t))
    edges = [-1, *bracketed, n_vocab]
    lo, hi = max(zip(edges, edges[1:]), key=lambda e: e[1] - e[0])
    return range(lo + 1, hi)


def wordpiece(directory: str) -> WordPiece:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    conf = {}
    if os.path.isfile(os.path.join(directory, "tokenizer_config.json")):
        with open(os.path.join(directory, "tokenizer_config.json"), encoding="utf-8") as f:
            conf = json.load(f)
    token = lambda k, default: conf[k]["content"] if isinstance(conf.get(k), dict) else conf.get(k) or default
    names = {k: token(f"{k}_token", f"[{k.upper()}]") for k in ("cls", "sep", "mask", "pad", "unk")}
    files = [f for f in ("tokenizer.json", "tokenizer_config.json") if os.path.isfile(os.path.join(directory, f))]
    if "tokenizer.json" in files:  # the whole pipeline as Hugging Face runs it
        tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    else:  # a slow-tokenizer checkpoint: rebuild BertTokenizer's pipeline from its settings
        files = ["vocab.txt", *files]
        tok = Tokenizer(models.WordPiece.from_file(os.path.join(directory, "vocab.txt"), unk_token=names["unk"]))
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=conf.get("tokenize_chinese_chars", True),
            strip_accents=conf.get("strip_accents"), lowercase=conf.get("do_lower_case", True))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        # Matched whole in raw text, as transformers does; one the vocabulary lacks is reported, not added.
        tok.add_special_tokens([t for t in names.values() if tok.token_to_id(t) is not None])
    return WordPiece(tok, os.path.abspath(directory), _fingerprint(directory, files), names)


def _is_wordpiece(directory: str) -> bool:
    path = os.path.join(directory, "tokenizer.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("model", {}).get("type") == "WordPiece"
    return os.path.isfile(os.path.join(directory, "vocab.txt"))


def load_dir(directory: str):
    if os.path.isfile(os.path.join(directory, "vocab.json")) and os.path.isfile(os.path.join(directory, "merges.txt")):
        return gpt2_bpe(directory)
    if _is_wordpiece(directory):
        return wordpiece(directory)
    raise ZooDataError(f"data.tokenizer={directory!r} is a directory without a known tokenizer "
                       f"(expected vocab.json + merges.txt, a WordPiece tokenizer.json, or vocab.txt)")


def save_dir(src: str, dst: str) -> list[str]:
    """Copy the tokenizer files of a checkpoint directory; returns the names copied."""
    import shutil
    from zoo.hf.io import TOKENIZER_FILES
    os.makedirs(dst, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
            copied.append(name)
    return copied
