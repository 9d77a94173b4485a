"""A T5 tokenizer from spiece.model alone (no tokenizer.json), without sentencepiece or protobuf.

spiece.model is a protobuf `ModelProto`; the few fields read here are parsed from the wire format:
the pieces (text, score, type), trainer_spec.unk_id and normalizer_spec.precompiled_charsmap. They
are assembled into the pipeline transformers 5 builds from the same file for T5Tokenizer: a
Unigram model over the pieces, then `extra_ids` sentinels <extra_id_{n-1}> .. <extra_id_0> appended
(score 0), the precompiled normalizer, WhitespaceSplit + Metaspace("▁", always) pre-tokenizers and
the Metaspace decoder. Ids equal transformers' for the same directory (tested).
"""

from __future__ import annotations

import os
import struct

from zoo.tokenizers import ZooDataError

UNIGRAM, CONTROL = 1, 3  # TrainerSpec.ModelType and SentencePiece.Type values


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, i
        shift += 7


def _fields(buf: bytes):
    """(field number, value) of a message: ints for varints, bytes for length-delimited, raw 4/8 bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield field, value


def read_model(path: str) -> dict:
    """{'pieces': [(text, score, type)], 'unk_id', 'model_type', 'charsmap'} of a SentencePiece model file."""
    with open(path, "rb") as f:
        buf = f.read()
    out = {"pieces": [], "unk_id": 0, "model_type": UNIGRAM, "charsmap": b""}
    for field, value in _fields(buf):
        if field == 1:  # SentencePiece: 1 piece, 2 score (float), 3 type (NORMAL = 1 by default)
            piece = {1: b"", 2: b"\0\0\0\0", 3: 1}
            piece.update(_fields(value))
            out["pieces"].append((piece[1].decode("utf-8"), struct.unpack("<f", piece[2])[0], piece[3]))
        elif field == 2:  # TrainerSpec: 3 model_type, 40 unk_id
            spec = dict(_fields(value))
            out["model_type"], out["unk_id"] = spec.get(3, UNIGRAM), spec.get(40, 0)
        elif field == 3:  # NormalizerSpec: 2 precompiled_charsmap
            out["charsmap"] = dict(_fields(value)).get(2, b"")
    return out


def t5_sentencepiece(directory: str):
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from zoo.hf.tokenizer import Pretrained, _fingerprint, _token, _tokenizer_config
    name = os.path.abspath(directory)
    try:
        spm = read_model(os.path.join(directory, "spiece.model"))
    except (ValueError, IndexError, UnicodeDecodeError, struct.error) as e:
        raise ZooDataError(f"data.tokenizer={name!r}: spiece.model is not a SentencePiece model ({e})") from None
    if spm["model_type"] != UNIGRAM or not spm["pieces"]:
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
    specials = [p for p, _, kind in spm["pieces"] if kind == CONTROL] + [unk] + extra
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in specials])
    files = ["spiece.model"] + (["tokenizer_config.json"] if conf else [])
    return Pretrained(tok, name, _fingerprint(directory, files), _token(conf, "eos_token", "</s>"))
