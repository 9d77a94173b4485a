"""Attention masks (split out of zoo.nn.attention, which imports them, so callers keep reading them there):
boolean, True = may attend, shaped [B, 1, T, S] (broadcastable). A causal mask over absolute positions (cached
decoding), a padding mask, a sliding window over index distances, the segment mask of packed examples (several
per row, chat fine-tuning), and cuDNN's packed layout of the same segment ids (each example's length and offset),
which `zoo.nn.attention.attention` passes cuDNN instead of a segment mask.
"""

from __future__ import annotations

import jax.numpy as jnp


def causal_mask(positions_T, length: int):
    """mask_11TS: query at absolute position p may attend keys 0..p (cached decoding)."""
    return (jnp.arange(length)[None, :] <= positions_T[:, None])[None, None]


def padding_mask(valid_BS, valid_BT=None):
    """mask_B1TS from key validity (and optionally query validity): True = may attend."""
    valid_BT = valid_BS if valid_BT is None else valid_BT
    return valid_BT[:, None, :, None] & valid_BS[:, None, None, :]


def window_mask(T: int, S: int, window: int, local=None):
    """mask_11TS of a sliding window over index distances: query i sees keys j with i - j < window; where
    `local` is a traced bool (a scanned stack's per-layer flag), only when it is True (else every key)."""
    window_TS = jnp.arange(T)[:, None] - jnp.arange(S)[None, :] < window
    if local is not None and local is not True:
        window_TS = window_TS | jnp.logical_not(local)
    return window_TS[None, None]


def segment_mask(segment_ids_BT):
    """mask_B1TT of packed examples: a query attends only keys of its own example (equal segment id; the
    padding's id 0 attends only padding, so no row is empty)."""
    return segment_ids_BT[:, None, :, None] == segment_ids_BT[:, None, None, :]


def packed_layout(segment_ids_BT, max_segments: int):
    """cuDNN's packed layout of segment ids (examples 1..k in order, contiguous, padding 0 at the end):
    (seqlen_BM, offsets_BM1), each example's length and start, -1 past a row's last example
    (jax._src.cudnn.fused_attention_stablehlo.dot_product_attention's q_seqlen / q_offsets)."""
    B, T = segment_ids_BT.shape
    rows_BT = jnp.broadcast_to(jnp.arange(B)[:, None], (B, T))
    slot_BT = jnp.where(segment_ids_BT > 0, segment_ids_BT - 1, max_segments)  # padding: out of range, dropped
    counts_BM = jnp.zeros((B, max_segments), jnp.int32).at[rows_BT, slot_BT].add(1, mode="drop")
    present_BM = counts_BM > 0
    starts_BM = jnp.cumsum(counts_BM, axis=1) - counts_BM
    seqlen_BM = jnp.where(present_BM, counts_BM, -1)
    offsets_BM = jnp.where(present_BM, starts_BM, -1)
    return seqlen_BM, jnp.concatenate([offsets_BM, jnp.full((B, 1), -1, jnp.int32)], axis=1)
