"""A row's work on zoo-serve's engine (`Sequence`: its prompt, sampling settings, where its tokens go) and the names
and buckets of the engine's programs."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np


@dataclasses.dataclass
class Sequence:
    """One row's work: its prompt ids, sampling settings and where its tokens go (`emit(ids, finish)`: new ids,
    and at the end the finish reason, "stop" or "length")."""

    prompt: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    key: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(2, np.uint32))  # its sampling key's data
    emit: Callable = lambda ids, finish: None
    cancelled: Callable = lambda: False  # true once its client is gone: the row is freed at the next chunk
    stream: bool = False  # its client streams: while it decodes, chunks are one step (each token sent as sampled)
    grammar: object = None  # a zoo.infer.grammar.Matcher: its tokens keep to a JSON schema (one step a chunk)
    adapter: int = 0  # the slot of the LoRA adapter its rows run (zoo.engine.adapters; 0: the base alone)
    generated: int = 0
    sent: int = 0  # 1: its first token went out as its prompt was prefilled (Engine._first), before its decode
    enqueued: float = dataclasses.field(default_factory=time.perf_counter)


def powers(start: int, limit: int) -> list[int]:
    """Powers of two from `start` below `limit`, then `limit`: the buckets a program compiles for."""
    out, b = [], start
    while b < limit:
        out.append(b)
        b *= 2
    return out + [limit]


def prefill_name(P: int, S: int) -> str:
    return f"prefill of up to {P} prompt tokens" + (f" after up to {S - P} held, over {S} slots" if S > P else "")


def decode_name(B: int, K: int, L: int) -> str:
    return f"decode of {B} row{'s' * (B > 1)} x up to {K} step{'s' * (K > 1)} over {L} slots"
