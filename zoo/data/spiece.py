"""Reading a SentencePiece model file (spiece.model) without sentencepiece or protobuf.

spiece.model is a protobuf `ModelProto`; the few fields read here are parsed from the wire format:
the pieces (text, score, type), trainer_spec.unk_id and normalizer_spec.precompiled_charsmap.
`zoo.data.hf_tokenizers.t5_sentencepiece` assembles them into T5's tokenizer.
"""

from __future__ import annotations

import struct

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
