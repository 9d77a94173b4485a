"""Two-way key tables: one list of rows per architecture, from which import and export are both derived.

A row is (zoo param path, Hugging Face tensor name, transform): the path is "/"-separated through the
zoo param tree ("h_0/attn/query/kernel"), the name is the HF key with the wrapper prefix stripped (as
`io.Keys` presents it), and the transform is a named, invertible reshaping between the two layouts:

  `from_hf(keys, rows, cfg)`    walks the rows reading each HF tensor into the zoo tree
  `to_hf(params, rows, cfg)`    walks the same rows writing each zoo array out as an HF tensor

Transforms take the head count N and head dim H from the model config (D width, N heads, K key/value
heads, H head dim, F MLP width, V vocab); grouped-query key/value transforms read K off the tensor.
A `fused` transform maps one zoo param to part j of n equal slices of one HF tensor's last axis
(GPT-2's c_attn: query | key | value); export concatenates the parts back. A `Fusion` says otherwise how
the n parts share the tensor: Phi-3's qkv_proj stacks q | k | v of unequal sizes along the output rows,
GPT-NeoX's query_key_value interleaves them per head (N, 3, H).

Rows for a stack of layers are written once and templated by layer index (`layers`); `linear`, `conv`,
`ln`, `rms` and `attention` build the rows of the common sub-modules.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import numpy as np

from zoo.errors import ConversionError
from zoo.hf.io import Keys


@dataclasses.dataclass(frozen=True)
class Fusion:
    """How n zoo params share one HF tensor: `split(x, n, N, H)` -> its n parts, `join(parts, N, H)` the
    tensor back (N heads of width H)."""
    name: str
    split: Callable[[np.ndarray, int, int, int], list]
    join: Callable[[list, int, int], np.ndarray]


# the default: n equal slices of the last axis (GPT-2's Conv1D c_attn: [D, 3D])
LAST_AXIS = Fusion("last_axis", lambda x, n, N, H: np.split(x, n, axis=-1),
                   lambda parts, N, H: np.concatenate(parts, axis=-1))
# a torch Linear's output rows: n equal slices (Phi-3's gate_up_proj [2F, D]: gate | up)
ROWS = Fusion("rows", lambda x, n, N, H: np.split(x, n, axis=0), lambda parts, N, H: np.concatenate(parts, axis=0))
# query | key | value rows of N, K and K heads (Phi-3's qkv_proj [(N + 2K) * H, D]; K read off the tensor)
QKV_ROWS = Fusion("qkv_rows", lambda x, n, N, H: [x[:N * H], *np.split(x[N * H:], 2, axis=0)],
                  lambda parts, N, H: np.concatenate(parts, axis=0))
# query, key and value interleaved per head: rows (N, 3, H) (GPT-NeoX's query_key_value, weight and bias)
PER_HEAD_QKV = Fusion("per_head_qkv",
                      lambda x, n, N, H: list(np.moveaxis(x.reshape(N, n, H, *x.shape[1:]), 1, 0).reshape(
                          n, N * H, *x.shape[1:])),
                      lambda parts, N, H: np.stack([p.reshape(N, H, *p.shape[1:]) for p in parts], axis=1).reshape(
                          -1, *parts[0].shape[1:]))


@dataclasses.dataclass(frozen=True)
class Transform:
    """HF layout <-> zoo layout: `zoo(x, N, H)` on import, `hf(x, N, H)` its inverse on export."""
    name: str
    zoo: Callable[[np.ndarray, int, int], np.ndarray]
    hf: Callable[[np.ndarray, int, int], np.ndarray]
    part: tuple[int, int] | None = None  # (j, n): this param is part j of n of the HF tensor, as `fusion` splits it
    fusion: Fusion = LAST_AXIS


SAME = Transform("same", lambda x, N, H: x, lambda x, N, H: x)
# torch Linear [out, in] <-> zoo kernel [in, out]
LINEAR = Transform("linear", lambda x, N, H: x.T, lambda x, N, H: x.T)
# query/key/value: torch Linear [N*H, D] <-> zoo [D, N, H]
HEADS_IN = Transform("heads_in", lambda x, N, H: x.T.reshape(-1, N, H),
                     lambda x, N, H: x.reshape(x.shape[0], -1).T)
# attention output: torch Linear [D, N*H] <-> zoo [N, H, D]
HEADS_OUT = Transform("heads_out", lambda x, N, H: x.T.reshape(N, H, -1),
                      lambda x, N, H: x.reshape(-1, x.shape[-1]).T)
# GPT-2 Conv1D keeps kernels input-major already: [D, N*H] <-> [D, N, H] and [N*H, D] <-> [N, H, D]
CONV_HEADS_IN = Transform("conv_heads_in", lambda x, N, H: x.reshape(-1, N, H),
                          lambda x, N, H: x.reshape(x.shape[0], -1))
CONV_HEADS_OUT = Transform("conv_heads_out", lambda x, N, H: x.reshape(N, H, -1),
                           lambda x, N, H: x.reshape(-1, x.shape[-1]))
# per-head biases: [N*H] <-> [N, H]
HEADS_BIAS = Transform("heads_bias", lambda x, N, H: x.reshape(N, H), lambda x, N, H: x.reshape(-1))
# grouped-query key/value: torch Linear [K*H, D] <-> zoo [D, K, H]; K (not N) heads, so only H reshapes
KV_HEADS_IN = Transform("kv_heads_in", lambda x, N, H: x.T.reshape(x.shape[1], -1, H),
                        lambda x, N, H: x.reshape(x.shape[0], -1).T)
# their biases: [K*H] <-> [K, H]
KV_HEADS_BIAS = Transform("kv_heads_bias", lambda x, N, H: x.reshape(-1, H), lambda x, N, H: x.reshape(-1))


def fused(t: Transform, j: int, n: int, fusion: Fusion = LAST_AXIS) -> Transform:
    """`t` applied to part j of n of a fused HF tensor (`fusion`: n equal slices of its last axis by default)."""
    tag = "" if fusion is LAST_AXIS else f"{fusion.name}:"
    return dataclasses.replace(t, name=f"{t.name}[{tag}{j}/{n}]", part=(j, n), fusion=fusion)


Row = tuple[str, str, Transform]


# ---- row builders ---------------------------------------------------------------------------------
def linear(zoo: str, hf: str, bias: bool = True) -> list[Row]:
    """A torch Linear `hf` ([out, in] weight) as zoo Dense `zoo` ([in, out] kernel)."""
    return [(f"{zoo}/kernel", f"{hf}.weight", LINEAR)] + ([(f"{zoo}/bias", f"{hf}.bias", SAME)] if bias else [])


def conv(zoo: str, hf: str) -> list[Row]:
    """A GPT-2 Conv1D `hf` (input-major [in, out] weight, as zoo's kernel)."""
    return [(f"{zoo}/kernel", f"{hf}.weight", SAME), (f"{zoo}/bias", f"{hf}.bias", SAME)]


def ln(zoo: str, hf: str) -> list[Row]:
    """A LayerNorm: weight -> scale, bias -> bias."""
    return [(f"{zoo}/scale", f"{hf}.weight", SAME), (f"{zoo}/bias", f"{hf}.bias", SAME)]


def rms(zoo: str, hf: str) -> list[Row]:
    """An RMSNorm (T5LayerNorm): weight -> scale."""
    return [(f"{zoo}/scale", f"{hf}.weight", SAME)]


def attention(zoo: str, hf: str, names: tuple, bias: bool) -> list[Row]:
    """zoo attention `zoo` (query/key/value/out) from torch Linears `names` (q, k, v, o) under prefix `hf`."""
    rows = []
    for zoo_name, hf_name in zip(("query", "key", "value", "out"), names):
        z, h = f"{zoo}/{zoo_name}", f"{hf}{hf_name}"
        rows.append((f"{z}/kernel", f"{h}.weight", HEADS_OUT if zoo_name == "out" else HEADS_IN))
        if bias:
            rows.append((f"{z}/bias", f"{h}.bias", SAME if zoo_name == "out" else HEADS_BIAS))
    return rows


def under(zoo: str, hf: str, rows: Iterable[Row]) -> list[Row]:
    """`rows` with both sides prefixed: zoo `zoo/`, HF `hf` (given with its trailing dot)."""
    return [(f"{zoo}/{z}" if zoo else z, f"{hf}{h}", t) for z, h, t in rows]


def layers(n: int, zoo: str, hf: str, rows: Iterable[Row]) -> list[Row]:
    """One block's rows repeated for layers 0..n-1; `zoo` and `hf` are templates of {i}."""
    rows = list(rows)
    return [r for i in range(n) for r in under(zoo.format(i=i), hf.format(i=i), rows)]


# ---- derivation -----------------------------------------------------------------------------------
def from_hf(keys: Keys, rows: Iterable[Row], cfg) -> dict:
    """The zoo param tree the rows describe, read from `keys` (a missing key raises its ConversionError)."""
    N, H = cfg.num_heads, cfg.head_dim
    tree: dict = {}
    for path, name, t in rows:
        x = keys[name]
        try:
            if t.part is not None:
                j, n = t.part
                x = t.fusion.split(x, n, N, H)[j]
            y = t.zoo(x, N, H)
        except ValueError:  # a reshape or split the config's sizes do not fit
            raise ConversionError(f"checkpoint key {name!r} has shape {tuple(keys[name].shape)}, which does not fit "
                                  f"the config ({N} heads of width {H}); config.json and the weights disagree") from None
        *parents, leaf = path.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = y
    return tree


def to_hf(params: dict, rows: Iterable[Row], cfg, prefix: str = "", outside: tuple = ()) -> dict:
    """The HF tensors the rows describe, from the zoo tree `params`; every name gets `prefix` (the
    wrapper, "transformer." ...) except those starting with one of `outside` (heads beside it)."""
    N, H = cfg.num_heads, cfg.head_dim
    out: dict = {}
    parts: dict = {}
    for path, name, t in rows:
        x = params
        for p in path.split("/"):
            x = x[p]
        y = t.hf(np.asarray(x, np.float32), N, H)
        name = name if name.startswith(outside) else prefix + name
        if t.part is None:
            out[name] = y
        else:
            parts.setdefault(name, {})[t.part[0]] = (y, t.part[1], t.fusion)
    for name, got in parts.items():
        _, n, fusion = next(iter(got.values()))
        out[name] = fusion.join([got[j][0] for j in range(n)], N, H)
    return out
