"""Tokenizer files for a zoo run whose tokenizer has none of its own (`to-hf` of a `bytes` or tiktoken run).

Both of zoo's own tokenizers are byte-level BPEs, which a `tokenizers` tokenizer.json writes exactly:

- `bytes` (ids 0..255 = the UTF-8 bytes, 256 = end-of-text) is a byte-level BPE with no merges: each
  byte maps to GPT-2's printable stand-in character, whose vocabulary id is the byte.
- a tiktoken encoding (cl100k_base, a local `.tiktoken` file, ...) is a byte-level BPE whose ids are
  its ranks. Its merges are recovered from the ranks (the two parts of each token are what tiktoken's
  own BPE, run on the token's bytes with the lower ranks only, leaves), and its split regex runs as a
  `Split` pre-tokenizer. Two constructs of tiktoken's (Rust) regexes read differently in Oniguruma,
  which `tokenizers` runs, and are rewritten: `{1,3}+` (possessive there, "repeat" here) and `$`
  (end of text there, end of line here: `\\z`).

The specials a task appends after the vocabulary come along with their ids: BERT's [CLS] [SEP]
[MASK] [PAD] (zoo.tasks.mlm, with "[CLS] a [SEP] (b [SEP])" as the post-processor, as zoo frames a
text or a pair), the encoder-decoder's BOS and PAD (zoo.tasks.seq2seq_data; zoo's sources carry no
specials). transformers' AutoTokenizer loads the files and gives zoo's ids, for any text: tokenizer_config.json sets
`split_special_tokens`, so a special token's text inside a document ("<|endoftext|>", "[MASK]") is plain
text there too, as zoo encodes it (by default a Hugging Face tokenizer would read it as the special).
"""

from __future__ import annotations

import json
import os
import re

from zoo.data.bpe import ENDOFTEXT, TiktokenTokenizer
from zoo.data.hf_bpe import RemappedBpe, unicode_to_byte
from zoo.data.tokenizers import ByteTokenizer
from zoo.errors import ConversionError

FILES = ("tokenizer.json", "tokenizer_config.json")
BERT_NAMES = {"cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]", "pad": "[PAD]"}
BOS, PAD = "<s>", "<pad>"  # the encoder-decoder's zoo-framing specials


def exportable(tokenizer) -> bool:
    """Whether tokenizer files can be written for `tokenizer` (zoo's bytes, or a tiktoken encoding)."""
    return isinstance(tokenizer, ByteTokenizer) or (isinstance(tokenizer, TiktokenTokenizer)
                                                     and not isinstance(tokenizer, RemappedBpe))


def _merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge of each multi-byte token, in rank order: its two parts as tiktoken's BPE leaves them
    when only lower ranks may merge (tiktoken merges by rank, as Hugging Face BPE merges by line)."""
    out = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, at = rank, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < best:
                    best, at = r, i
            if at < 0:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) != 2:
            raise ConversionError(f"the tiktoken rank {rank} ({token!r}) is no merge of two lower-ranked tokens; "
                                  f"its encoding has no Hugging Face BPE equivalent")
        out.append((parts[0], parts[1]))
    return out


def oniguruma(pattern: str) -> str:
    """A tiktoken (Rust regex) split pattern as `tokenizers`' Oniguruma reads it the same way."""
    pattern = re.sub(r"(\{\d+(?:,\d*)?\})\+", r"\1", pattern)  # possessive {m,n}+ -> greedy (no backtracking follows)
    return pattern.replace("$", r"\z") if r"\$" not in pattern else pattern


def _base(tokenizer):
    """(vocab, merges, split pattern or None, the tokenizer's own specials) of zoo's tokenizer."""
    to_byte = unicode_to_byte()
    if isinstance(tokenizer, ByteTokenizer):
        return dict(to_byte), [], None, _own_specials(tokenizer)
    enc = tokenizer.encoding
    byte_char = {b: c for c, b in to_byte.items()}
    text = lambda bs: "".join(byte_char[b] for b in bs)
    ranks = enc._mergeable_ranks
    vocab = {text(t): r for t, r in ranks.items()}
    merges = [(text(a), text(b)) for a, b in _merges(ranks)]
    return vocab, merges, oniguruma(enc._pat_str), _own_specials(tokenizer)


def _task_specials(cfg, tokenizer) -> tuple[dict[str, int], dict, tuple | None]:
    """(specials token -> id, tokenizer_config roles, post-processor template) of the run's task."""
    eot = next((t for t, i in _own_specials(tokenizer).items() if i == tokenizer.eot_token), ENDOFTEXT)
    if cfg.model.family == "bert":
        from zoo.tasks.mlm import bert_specials
        sp = bert_specials(tokenizer)
        specials = {name: getattr(sp, k) for k, name in BERT_NAMES.items()}
        roles = {**{f"{k}_token": name for k, name in BERT_NAMES.items()},
                 "model_input_names": ["input_ids", "token_type_ids", "attention_mask"]}
        return specials, roles, ("[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1")
    if cfg.model.family == "encdec":
        from zoo.tasks.seq2seq_data import framing
        sp = framing(tokenizer)
        return {BOS: sp.decoder_start, PAD: sp.pad}, {"eos_token": eot, "bos_token": BOS, "pad_token": PAD}, None
    return {}, {"eos_token": eot, "bos_token": eot}, None


def _own_specials(tokenizer) -> dict[str, int]:
    """The tokenizer's own specials (token -> id): bytes' end-of-text, a tiktoken encoding's."""
    if isinstance(tokenizer, ByteTokenizer):
        return {ENDOFTEXT: tokenizer.eot_token}
    return dict(tokenizer.encoding._special_tokens)


def build(cfg, tokenizer):
    """(tokenizers.Tokenizer, tokenizer_config.json dict) for run config `cfg` whose tokenizer is
    `tokenizer` (zoo's bytes or a tiktoken encoding), with its task's specials; None when its ids do
    not fit the model (a converted checkpoint that came without tokenizer files: data.tokenizer is
    bytes in name only)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    if not exportable(tokenizer):
        raise ConversionError(f"data.tokenizer={cfg.data.tokenizer!r} has no Hugging Face tokenizer files to export")
    vocab, merges, pattern, own = _base(tokenizer)
    extra, roles, template = _task_specials(cfg, tokenizer)
    specials = {**own, **extra}
    taken = {i: t for t, i in vocab.items()}
    for t, i in specials.items():
        if vocab.get(t, i) != i or taken.get(i, t) != t:
            raise ConversionError(f"data.tokenizer={cfg.data.tokenizer!r}: the special {t} (id {i}) collides with "
                                  f"the vocabulary; no Hugging Face tokenizer can hold both")
        vocab[t] = i
    if max(vocab.values()) >= cfg.model.vocab_size:
        return None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.pre_tokenizer = byte_level if pattern is None else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(pattern), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in sorted(specials, key=specials.get)])
    if template is not None:
        used = [(t, i) for t, i in specials.items() if t in template[0] + template[1]]
        tok.post_processor = processors.TemplateProcessing(single=template[0], pair=template[1], special_tokens=used)
    # split_special_tokens: a special's text inside a document stays text, as zoo encodes it, so both give the
    # same ids for any text (the specials' ids come only from framing: the post-processor, the task)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "model_max_length": cfg.data.seq_len, "split_special_tokens": True, **roles}
    return tok, config


def write(out_dir: str, tok, config: dict) -> list[str]:
    """Write what `build` gave as tokenizer.json + tokenizer_config.json; returns the files written."""
    tok.save(os.path.join(out_dir, FILES[0]))
    with open(os.path.join(out_dir, FILES[1]), "w") as f:
        json.dump(config, f, indent=2)
    return list(FILES)
