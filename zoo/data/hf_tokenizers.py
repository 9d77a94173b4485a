"""Tokenizers that travel with a Hugging Face checkpoint, loaded from its directory, offline.

- GPT-2 byte-level BPE (vocab.json + merges.txt) becomes a tiktoken encoding built from the files
  alone (no download), with the checkpoint's own ids.
  BART's files are the same kind (its <s> <pad> </s> <unk> come first; </s> is its `eot_token`).
- BERT WordPiece (tokenizer.json, else vocab.txt + tokenizer_config.json) goes through the
  `tokenizers` package, which tiktoken cannot stand in for (lower-casing, accent stripping, "##"
  continuations). Its `encode` gives the text's ids without [CLS] / [SEP] (zoo frames rows itself),
  and `special_ids` / `ordinary_ids` hand the vocabulary's own specials to zoo.tasks.mlm.
- A BPE or SentencePiece vocabulary that holds all four BERT roles (cls, sep, mask, pad: as
  tokenizer_config.json names them, else RoBERTa's and XLM-R's <s> </s> <mask> <pad>) hands them over the
  same way (`bert_roles`), with the mask's text, how many separators join a pair (RoBERTa's </s></s>) and
  the text of every special: a converted RoBERTa or XLM-R frames its rows with its own ids.
- Any other tokenizer.json (T5's SentencePiece unigram; Llama's, Mistral's and Qwen2's BPE, byte-level
  or Metaspace) goes through `tokenizers` as it is; a T5 directory with only spiece.model is rebuilt
  into the same pipeline transformers builds from it. `encode` gives ids without the checkpoint's
  specials (no BOS); `eot_token` is its EOS (tokenizer_config.json's eos_token), `bos_token` its BOS.
  vocab.json + merges.txt beside a tokenizer.json whose pipeline is not GPT-2's (Qwen2's split regex
  and NFC) are left to the tokenizer.json.

A chat template (chat_template.jinja, or `chat_template` in tokenizer_config.json) is copied with the
files and written back by `to-hf`; zoo.data.chat renders it. For its text every tokenizer here has
`encode_with_offsets` (ids and start characters; the checkpoint's special tokens, `eot_text` among them,
read as their ids) beside `encode`.

`special_prefix` is what transformers' `tokenizer(text)` puts before a text's ids (zoo.data.tokenizers.encode_text):
as transformers 5 decides it, tokenizer.json's post-processor when the directory has one (its template's
leading specials: Llama 2/3's, Mistral's and Gemma's BOS; none for GPT-2, Qwen2 or SmolLM2; tokenizer_config's
add_bos_token is then ignored, as there), else tokenizer_config.json's add_bos_token (GPT-2's files: default
false). Specials a template puts after the text (an EOS) are left out: zoo ends its rows itself.

A converted encoder-decoder's directory also holds seq2seq.json (zoo's, written by zoo.hf.from_hf):
how the checkpoint frames sources and targets. It is attached as the tokenizer's `seq2seq` dict,
which zoo.tasks.seq2seq_data.framing reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct

import numpy as np
import tiktoken

from zoo.data import spiece
from zoo.data.bpe import ENDOFTEXT, TiktokenTokenizer, encoding_spec
from zoo.data.hf_bpe import RemappedBpe, unicode_to_byte
from zoo.errors import ZooDataError

SEQ2SEQ_FILE = "seq2seq.json"  # zoo's: the seq2seq framing of a converted T5 / BART checkpoint
# The files of a Hugging Face checkpoint's tokenizer, copied into (and out of) a zoo run.
TOKENIZER_FILES = ("vocab.json", "merges.txt", "vocab.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "spiece.model", "chat_template.jinja")


def _fingerprint(directory: str, names) -> str:
    h = hashlib.sha256()
    for n in names:
        with open(os.path.join(directory, n), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def gpt2_bpe(directory: str) -> TiktokenTokenizer:
    with open(os.path.join(directory, "vocab.json"), encoding="utf-8") as f:
        vocab: dict[str, int] = json.load(f)
    with open(os.path.join(directory, "merges.txt"), encoding="utf-8") as f:
        merges = [line.split() for line in f.read().splitlines() if line and not line.startswith("#version")]
    to_byte = unicode_to_byte()
    as_bytes = lambda token: bytes(to_byte[c] for c in token)
    byte_char = {b: c for c, b in to_byte.items()}
    ranks = {bytes([b]): b for b in range(256)}
    rank_ids = [vocab.get(byte_char[b], -1) for b in range(256)]
    for a, b in merges:
        merged = as_bytes(a) + as_bytes(b)
        if merged not in ranks:
            ranks[merged] = len(rank_ids)
            rank_ids.append(vocab.get(a + b, -1))
    eot = vocab.get(ENDOFTEXT, vocab.get("</s>", len(vocab)))  # GPT-2's <|endoftext|>, BART's </s>
    spec = _tokenizer_json(directory)
    eot_text = "</s>" if ENDOFTEXT not in vocab and "</s>" in vocab else ENDOFTEXT
    special = {ENDOFTEXT: len(rank_ids)}
    # Decoding <|endoftext|> gives its text; BART's </s> (like its <s> <pad> <mask>) decodes to nothing.
    rank_ids.append(eot if ENDOFTEXT in vocab else -1)
    if eot_text not in special:  # BART's </s>: a special only for encode_with_offsets to read
        special[eot_text] = len(rank_ids)
        rank_ids.append(-1)
    enc = tiktoken.Encoding(name=f"bpe:{os.path.abspath(directory)}", pat_str=encoding_spec("r50k_base")[0],
                            mergeable_ranks=ranks, special_tokens=special)
    tok = RemappedBpe(enc, np.asarray(rank_ids), max(max(vocab.values()) + 1, eot + 1), eot, eot_text=eot_text,
                      name=os.path.abspath(directory), fingerprint=_fingerprint(directory, ["vocab.json", "merges.txt"]))
    if spec is not None:  # transformers runs tokenizer.json's post-processor (ids in the same vocabulary)
        from tokenizers import Tokenizer
        tok.special_prefix = special_prefix(Tokenizer.from_str(json.dumps(spec)))
    else:  # GPT2Tokenizer from the files: its add_bos_token (default false) decides
        conf = _tokenizer_config(directory)
        bos = _token(conf, "bos_token", "")
        tok.special_prefix = (vocab[bos],) if conf.get("add_bos_token") is True and bos in vocab else ()
    return tok


def special_prefix(tok) -> tuple[int, ...]:
    """The special ids a `tokenizers.Tokenizer`'s post-processor puts before a text (transformers' BOS), read off
    the encoding of one character: its leading run of specials."""
    e = tok.encode("a", add_special_tokens=True)
    n = next((i for i, special in enumerate(e.special_tokens_mask) if not special), 0)
    return tuple(e.ids[:n])


class HfTokenizer:
    """A `tokenizers.Tokenizer` behind the zoo tokenizer surface: ids without the checkpoint's
    specials (zoo frames rows itself), decoding skips specials; `special_prefix` what transformers puts first (the
    module's docstring)."""

    def __init__(self, tok, name: str, fingerprint: str):
        tok.no_padding()  # a checkpoint's tokenizer.json may pad and truncate (MiniLM: to 128)
        tok.no_truncation()
        self.tok, self.name, self.fingerprint = tok, name, fingerprint
        self.special_prefix = special_prefix(tok)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """(ids, start character of each id); added tokens in the text (<|im_start|>, `eot_text`) are theirs."""
        e = self.tok.encode(text, add_special_tokens=False)
        return e.ids, [start for start, _ in e.offsets]

    @property
    def eot_text(self) -> str:
        return self.tok.id_to_token(self.eot_token)

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)


class WordPiece(HfTokenizer):
    """A WordPiece model (BERT). Documents are separated by [SEP] (`eot_token`), as BERT's
    pretraining data was. As in Hugging Face, a literal "[SEP]" or "[MASK]" in the text is that
    special token.
    """

    def __init__(self, tok, name: str, fingerprint: str, names: dict[str, str]):
        super().__init__(tok, name, fingerprint)
        vocab = tok.get_vocab(with_added_tokens=True)
        missing = [t for t in names.values() if t not in vocab]
        if missing:
            raise ZooDataError(f"data.tokenizer={name!r}: the vocabulary has no {', '.join(missing)}")
        self.n_vocab = max(vocab.values()) + 1
        self.special_ids = {k: vocab[t] for k, t in names.items() if k != "unk"}
        self.eot_token = self.special_ids["sep"]
        self.ordinary_ids = _ordinary_ids(vocab, self.n_vocab)
        self.mask_text, self.pair_seps = names["mask"], 1
        self.special_texts = {vocab[t]: t for t in names.values()}


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


class Pretrained(HfTokenizer):
    """Any other `tokenizers.Tokenizer` (T5's SentencePiece unigram, BART's or Llama's tokenizer.json);
    `eot_token` is its EOS (</s>), `bos_token` its BOS (None if it has none)."""

    def __init__(self, tok, name: str, fingerprint: str, eos: str, bos: str | None = None):
        super().__init__(tok, name, fingerprint)
        vocab = tok.get_vocab(with_added_tokens=True)
        if eos not in vocab:
            raise ZooDataError(f"data.tokenizer={name!r}: the vocabulary has no EOS token {eos!r}")
        self.n_vocab, self.eot_token = max(vocab.values()) + 1, vocab[eos]
        self.bos_token = vocab.get(bos) if bos else None


def _tokenizer_config(directory: str) -> dict:
    path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _token(conf: dict, key: str, default: str) -> str:
    value = conf.get(key)
    return value["content"] if isinstance(value, dict) else value or default


def pretrained(directory: str) -> Pretrained:
    from tokenizers import Tokenizer
    files = [f for f in ("tokenizer.json", "tokenizer_config.json") if os.path.isfile(os.path.join(directory, f))]
    tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    conf = _tokenizer_config(directory)
    return Pretrained(tok, os.path.abspath(directory), _fingerprint(directory, files),
                      _token(conf, "eos_token", "</s>"), _token(conf, "bos_token", ""))


BERT_ROLES = ("cls", "sep", "mask", "pad")
ROBERTA_ROLES = {"cls": "<s>", "sep": "</s>", "mask": "<mask>", "pad": "<pad>"}  # XLM-R's and BART's too


def _pair_seps(spec: dict | None, sep: str) -> int:
    """How many separators stand between a pair's texts: tokenizer.json's post-processor says (RoBERTa's
    `<s> A </s></s> B </s>`: 2; BERT's `[CLS] A [SEP] B [SEP]`: 1), else 2 for a </s> separator."""
    post = (spec or {}).get("post_processor") or {}
    for p in post.get("processors") or [post]:  # a Sequence of processors, or one
        kind = p.get("type")
        if kind in ("RobertaProcessing", "BertProcessing"):
            return 2 if kind == "RobertaProcessing" else 1
        pair = [next(iter(item)) for item in p.get("pair") or []]  # TemplateProcessing
        if pair.count("Sequence") == 2:
            a, b = (i for i, item in enumerate(pair) if item == "Sequence")
            return b - a - 1
    return 2 if sep == "</s>" else 1


def bert_roles(tok, directory: str):
    """`tok` (a BPE or SentencePiece tokenizer of `directory`) with the BERT roles of its vocabulary attached,
    when it holds all four: `special_ids` (cls, sep, mask, pad -> id: as tokenizer_config.json names them, else
    RoBERTa's <s> </s> <mask> <pad>), `ordinary_ids` (the longest run of ids holding no special token),
    `mask_text`, `mask_strip` (whether the mask token takes the spaces on its left / right, as RoBERTa's
    <mask> does on its left), `pair_seps` and `special_texts` (id -> text of every special token). A vocabulary
    without them (GPT-2's, T5's, Llama's) is left as it is."""
    conf, spec = _tokenizer_config(directory), _tokenizer_json(directory)
    added = {a["content"]: a for a in (spec or {}).get("added_tokens") or []}
    if isinstance(tok, HfTokenizer):
        vocab = tok.tok.get_vocab(with_added_tokens=True)
    else:  # vocab.json, and the added tokens (<mask>) a tokenizer.json may hold beside it
        with open(os.path.join(directory, "vocab.json"), encoding="utf-8") as f:
            vocab = {**json.load(f), **{t: a["id"] for t, a in added.items()}}
    names = {k: _token(conf, f"{k}_token", "") or ROBERTA_ROLES[k] for k in BERT_ROLES}
    if any(t not in vocab for t in names.values()):
        return tok
    others = [_token(conf, f"{k}_token", "") for k in ("unk", "bos", "eos")] + \
        [t for t, a in added.items() if a.get("special")]
    texts = {vocab[t]: t for t in [*names.values(), *others] if t in vocab}
    tok.n_vocab = max(tok.n_vocab, max(vocab.values()) + 1)
    edges = [-1, *sorted(texts), tok.n_vocab]
    lo, hi = max(zip(edges, edges[1:]), key=lambda e: e[1] - e[0])
    mask = added.get(names["mask"]) or (conf["mask_token"] if isinstance(conf.get("mask_token"), dict) else {})
    tok.special_ids = {k: vocab[t] for k, t in names.items()}
    tok.ordinary_ids = range(lo + 1, hi)
    tok.mask_text, tok.mask_strip = names["mask"], (bool(mask.get("lstrip")), bool(mask.get("rstrip")))
    tok.pair_seps, tok.special_texts = _pair_seps(spec, names["sep"]), texts
    return tok


def t5_sentencepiece(directory: str) -> Pretrained:
    """T5's tokenizer from spiece.model alone (no tokenizer.json): the pipeline transformers 5 builds from
    the same file for T5Tokenizer. A Unigram model over the pieces, then `extra_ids` sentinels
    <extra_id_{n-1}> .. <extra_id_0> appended (score 0), the precompiled normalizer, WhitespaceSplit +
    Metaspace("▁", always) pre-tokenizers and the Metaspace decoder. Ids equal transformers' (tested)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    name = os.path.abspath(directory)
    try:
        spm = spiece.read_model(os.path.join(directory, "spiece.model"))
    except (ValueError, IndexError, UnicodeDecodeError, struct.error) as e:
        raise ZooDataError(f"data.tokenizer={name!r}: spiece.model is not a SentencePiece model ({e})") from None
    if spm["model_type"] != spiece.UNIGRAM or not spm["pieces"]:
        raise ZooDataError(f"data.tokenizer={name!r}: spiece.model is not a unigram SentencePiece model "
                           f"(model_type={spm['model_type']}); T5 tokenizers are unigram")
    conf = _tokenizer_config(directory)
    n_extra = int(conf.get("extra_ids", 100))
    extra = [f"<extra_id_{i}>" for i in range(n_extra - 1, -1, -1)]  # <extra_id_0> gets the last id
    vocab = [(p, s) for p, s, _ in spm["pieces"]] + [(t, 0.0) for t in extra]
    tok = Tokenizer(models.Unigram(vocab, unk_id=spm["unk_id"], byte_fallback=False))
    if spm["charsmap"]:
        tok.normalizer = normalizers.Precompiled(spm["charsmap"])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    unk = spm["pieces"][spm["unk_id"]][0]
    specials = [p for p, _, kind in spm["pieces"] if kind == spiece.CONTROL] + [unk] + extra
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in specials])
    files = ["spiece.model"] + (["tokenizer_config.json"] if conf else [])
    return Pretrained(tok, name, _fingerprint(directory, files), _token(conf, "eos_token", "</s>"))


def _tokenizer_json(directory: str) -> dict | None:
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _gpt2_pipeline(spec: dict | None) -> bool:
    """Whether vocab.json + merges.txt say the whole tokenizer: there is no tokenizer.json, or it runs
    GPT-2's pipeline (no normalizer, byte-level with GPT-2's split regex and no prefix space), as GPT-2's
    and BART's do. Qwen2's also ships those files, but splits with its own regex after NFC."""
    if spec is None:
        return True
    pre = spec.get("pre_tokenizer") or {}
    return not spec.get("normalizer") and pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and \
        not pre.get("add_prefix_space")


def load_dir(directory: str):
    """The tokenizer of a Hugging Face directory (with its seq2seq framing attached, if it has one)."""
    spec = _tokenizer_json(directory)
    kind = None if spec is None else spec.get("model", {}).get("type")
    has = lambda name: os.path.isfile(os.path.join(directory, name))
    if has("vocab.json") and has("merges.txt") and _gpt2_pipeline(spec):
        tok = bert_roles(gpt2_bpe(directory), directory)
    elif kind == "WordPiece" or (kind is None and has("vocab.txt")):
        tok = wordpiece(directory)
    elif kind is not None:
        tok = bert_roles(pretrained(directory), directory)
    elif has("spiece.model"):
        tok = t5_sentencepiece(directory)
    else:
        raise ZooDataError(f"data.tokenizer={directory!r} is a directory without a known tokenizer (expected "
                           f"vocab.json + merges.txt, tokenizer.json, vocab.txt or spiece.model)")
    if has(SEQ2SEQ_FILE):
        with open(os.path.join(directory, SEQ2SEQ_FILE), encoding="utf-8") as f:
            tok.seq2seq = json.load(f)
    return tok


def save_dir(src: str, dst: str) -> list[str]:
    """Copy the tokenizer files of a checkpoint directory; returns the names copied. `dst` is created
    only when there is something to copy (no empty tokenizer folder)."""
    copied = [name for name in TOKENIZER_FILES if os.path.isfile(os.path.join(src, name))]
    if copied:
        os.makedirs(dst, exist_ok=True)
    for name in copied:
        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    return copied
