"""Attention weights as a model computes them, what each head does with them, and their heat maps.

`attention_weights` applies a model with the "intermediates" collection mutable, so that every
`zoo.nn.attention.Attention` sows the softmax rows its own einsum path computes (see there), and returns
them as `Weights`, one per attention layer: GPT's causal self-attention, BERT's bidirectional
self-attention, the encoder-decoder's encoder self-, decoder self- and cross-attention. `head_stats`
measures one head on one input (how much weight goes to the previous token, the first, the token itself,
and how far away); `draw` makes the heat maps, one panel per head (matplotlib, imported when called).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import jax
import numpy as np
from flax import traverse_util

# Weights.kind -> what it is called in titles and printed lines, in the order a model runs them.
KINDS = {"self": "self-attention", "encoder": "encoder self-attention", "decoder": "decoder self-attention",
         "cross": "cross-attention"}
ROLE_AT = 0.5  # mean weight above which a head is named for where it looks (previous-token head, ...)


@dataclass(frozen=True)
class Weights:
    """One attention layer's softmax rows for a batch."""

    kind: str  # self | encoder | decoder | cross (see KINDS)
    layer: int  # the block's index in its stack
    w_BNTS: np.ndarray  # float32, batch x heads x queries x keys; each row sums to 1


def attention_weights(model, params, *inputs, **kwargs) -> tuple[object, list[Weights]]:
    """(the model's output, its attention weights in KINDS order, layer by layer) for `inputs`; `kwargs` go
    to the model's call (static: compiled in)."""
    apply = jax.jit(functools.partial(model.apply, mutable=["intermediates"], **kwargs))  # faster than op by op
    out, variables = apply({"params": params}, *inputs)
    return out, collect(variables["intermediates"])


def collect(intermediates) -> list[Weights]:
    """The sown `attention_weights` of an intermediates tree. The path names the layer: h_3 (GPT), layer_3
    (BERT), layers_3 (encoder-decoder), or one [L, ...] stack from a scanned stack; `cross` names the
    decoder's cross-attention and the first key the encoder or decoder stack."""
    found = []
    for path, sown in traverse_util.flatten_dict(intermediates).items():
        if path[-1] != "attention_weights":
            continue
        module, stack = path[-2], path[0]
        kind = "cross" if module == "cross" else stack if stack in ("encoder", "decoder") else "self"
        index = [int(m.group(1)) for p in path[:-2] if (m := re.search(r"_(\d+)$", p))]
        w = np.asarray(sown[0], np.float32)  # sown once per call: a tuple of one
        if index:
            found.append(Weights(kind, index[-1], w))
        else:  # a scanned stack: its layers along axis 0
            found += [Weights(kind, i, w_i) for i, w_i in enumerate(w)]
    order = list(KINDS)
    return sorted(found, key=lambda x: (order.index(x.kind), x.layer))


def head_stats(w_TS: np.ndarray, self_attention: bool = True) -> dict[str, float]:
    """One head on one input, averaged over its queries (after the first for self-attention, whose
    first query of a causal head has a single key to look at):

    self-attention: `previous` (weight on the token before), `first` (on token 0), `self` (on itself),
    `distance` (sum over keys of weight x |query - key|, in tokens); cross-attention, where positions
    of two sequences do not compare: `first` (on the first source token) and `peak` (the largest weight).
    """
    T = w_TS.shape[0]
    if not self_attention:
        return {"first": float(w_TS[:, 0].mean()), "peak": float(w_TS.max(-1).mean())}
    t = np.arange(1, T) if T > 1 else np.arange(T)
    dist_TS = np.abs(np.arange(T)[:, None] - np.arange(w_TS.shape[1])[None, :])
    return {"previous": float(w_TS[t, np.maximum(t - 1, 0)].mean()), "first": float(w_TS[t, 0].mean()),
            "self": float(w_TS[t, t].mean()), "distance": float((w_TS * dist_TS)[t].sum(-1).mean())}


def role(stats: dict[str, float]) -> str:
    """A name for a head that puts most of its weight in one place: the positional heads."""
    for key, name in (("previous", "previous-token head"), ("first", "first-token head"), ("self", "self head")):
        if stats.get(key, 0.0) >= ROLE_AT:
            return name
    return ""


def describe(stats: dict[str, float]) -> str:
    """The stats as one line's worth: `previous 0.91, first 0.02, self 0.05, distance 1.1`."""
    return ", ".join(f"{k} {v:.2f}" if k != "distance" else f"{k} {v:.1f}" for k, v in stats.items())


@dataclass(frozen=True)
class Panel:
    """One head's weights with the token labels of its rows (queries) and columns (keys)."""

    title: str
    w_TS: np.ndarray
    rows: list[str]
    cols: list[str]


def draw(grid: list[list[Panel]], path: str, title: str = "") -> int:
    """Heat maps (white 0 to dark 1, one colour scale for all), one row of panels per list; the number drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nrows, ncols = len(grid), max(len(r) for r in grid)
    longest = max(max(len(p.rows), len(p.cols)) for r in grid for p in r)
    size = min(max(1.0 + 0.1 * longest, 2.5), 7.0)  # inches per panel: room for a label per token
    font = min(max(0.75 * 72 * (size - 0.8) / longest, 3.0), 9.0)  # points: about one token's width
    fig, axes = plt.subplots(nrows, ncols, figsize=(ncols * size + 1.0, nrows * size + 0.5), squeeze=False,
                             layout="constrained")
    image = None
    for ax_row, panels in zip(axes, grid):
        for ax, panel in zip(ax_row, panels):
            image = ax.imshow(panel.w_TS, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_title(panel.title, fontsize=9)
            ax.set_xticks(range(len(panel.cols)), panel.cols, fontsize=font)
            for tick in ax.get_xticklabels():  # characters stay upright, longer tokens ([CLS]) stand on end
                tick.set_rotation(90 if len(tick.get_text()) > 1 else 0)
            ax.set_yticks(range(len(panel.rows)), panel.rows, fontsize=font)
            ax.tick_params(length=0, pad=1)
        for ax in ax_row[len(panels):]:
            ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.colorbar(image, ax=axes, shrink=0.5, aspect=40, label="attention weight")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return sum(len(r) for r in grid)
