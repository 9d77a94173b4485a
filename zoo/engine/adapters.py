"""zoo-serve's LoRA adapters per request: one base, a table of PEFT adapters beside it, each request's `model` naming
the adapter its rows run (zoo-serve BASE --adapter NAME=PATH; zoo.serve.adapters has the routes).

The table holds, per Einsum that some adapter targets, the adapters stacked ([slots + 1, in..., R] and
[slots + 1, R, out...], zoo.nn.multi_lora): slot 0 is the zero adapter (the base's rows), each adapter takes a slot,
zero-padded to the table's rank R and with its scale (alpha / r) folded into B. Every engine row carries its slot,
and every program (prefill, decode) gathers each row's A and B, so rows of different adapters decode in one batch.

The table's shape is fixed when the server starts: `slots` (--max-loras, default max(SLOTS, the adapters given)),
the rank R (--max-lora-rank, default the largest adapter given) and the Einsums targeted (those of the adapters
given at start, and those of --lora-targets: PEFT module names such as q_proj,v_proj, or "all"; each targeted layer
costs every decode step its rows' gathered A and B). An adapter loaded later (POST /v1/load_lora_adapter) is
written into a free slot: no shape changes and nothing compiles. One the table cannot hold (no free slot, a rank
above R, a layer the table does not hold) is refused in one line naming the setting to restart with. An adapter's
base is checked by its tensors' shapes against the served base (zoo.hf.peft._plan: its layer names and sizes);
base_model_name_or_path is not compared (the same base may be served from a GGUF file, a Hugging Face directory or a
zoo run).
"""

from __future__ import annotations

import dataclasses
import os

import jax.numpy as jnp
import numpy as np

from zoo.errors import ArgumentError, ConversionError

SLOTS = 4  # the fewest adapter slots a table holds by default: room to load adapters after the start


class InUse(ArgumentError):
    """An adapter asked to unload while sequences run it."""


@dataclasses.dataclass
class Adapter:
    """One PEFT adapter read for the table: its rank and, per Einsum path, A [in..., r] and B [r, out...] scaled."""
    rank: int
    pairs: dict
    path: str


def read(lm, path: str) -> Adapter:
    """The PEFT LoRA adapter directory `path` for base `lm` (a zoo.Pretrained decoder), every tensor checked against
    the base's layers (zoo.hf.peft); ConversionError in one line for an adapter of another base."""
    from zoo.hf import io, peft
    from zoo.nn import lora
    if not isinstance(path, str) or not peft.is_adapter_dir(path):
        raise ArgumentError(f"{path!r} is not a PEFT adapter directory (adapter_config.json, no config.json)")
    c = peft.read_config(path)
    cfg = lm.config
    if cfg.model.scan_layers:  # PEFT names unscanned layers; the engine decodes them unscanned (h_0, h_1, ...)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, scan_layers=False))
    lora_cfg, params = peft._plan(c, io.read_tensors(path), cfg, lm.source or "", os.path.join(path, peft.WEIGHTS))
    whole = sorted(p for p in params if not lora.is_adapter(p))
    if whole:
        raise ConversionError(f"{path!r} saves {whole[0]} whole (modules_to_save); zoo-serve's adapters hold LoRA "
                              f"layers only (serve it alone, merged)")
    r = lora_cfg.model.lora_rank
    scale = lora_cfg.model.lora_alpha / r
    pairs = {p.removesuffix("/lora_a"): (np.asarray(params[p], np.float32),
                                         np.asarray(params[p.removesuffix("a") + "b"], np.float32) * scale)
             for p in params if p.endswith("/lora_a")}
    return Adapter(r, pairs, path)


def _layers(lm, targets: str, rank: int) -> dict:
    """{Einsum path: (in shape, out shape)} of the base's layers that PEFT module names `targets` pick ("all": every
    layer PEFT adapts); ArgumentError listing the names where one picks nothing."""
    from zoo.hf import peft
    cfg = lm.config
    if cfg.model.scan_layers:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, scan_layers=False))
    sites = peft.layers(cfg, rank)[0]
    names = sorted({m.rsplit(".", 1)[-1] for m in sites})
    wanted = names if targets == "all" else [t.strip() for t in targets.split(",") if t.strip()]
    for t in wanted:
        if not any(peft.hit(m, [t]) for m in sites):
            raise ArgumentError(f"--lora-targets names {t!r}, no layer of the base; choose from {', '.join(names)} "
                                f"or all")
    return {e: (s.a[:-1], s.b[1:]) for m, s in sites.items() if peft.hit(m, wanted) for e in s.einsums}


class AdapterTable:
    """The adapters served beside one base (see the module's docstring): `names` maps each to its slot; `tables`
    ({Einsum path: (a, b)}) is what the engine's programs take."""

    def __init__(self, shapes: dict, slots: int, rank: int):
        self.slots, self.rank, self.shapes = slots, rank, shapes  # shapes: {path: (in shape, out shape)}
        self.names: dict[str, int] = {}
        self._last = 0  # the slot written last
        self.paths: dict[str, str] = {}  # name -> the directory it was read from
        self.tables = {p: (jnp.zeros((slots + 1, *i, rank), jnp.float32), jnp.zeros((slots + 1, rank, *o), jnp.float32))
                       for p, (i, o) in shapes.items()}

    @classmethod
    def build(cls, lm, paths: dict, slots: int | None = None, rank: int | None = None,
              targets: str | None = None) -> "AdapterTable":
        """The table of the adapters `paths` ({name: directory}) on `lm`, with `slots` slots (default max(SLOTS,
        len(paths))) of rank `rank` (default the largest adapter's), over the layers they target and `targets`
        (PEFT module names, comma-separated, or "all": room for adapters loaded later)."""
        if not paths and (rank is None or not targets):
            raise ArgumentError("an adapter table needs an adapter (--adapter NAME=PATH), or --max-lora-rank and "
                                "--lora-targets to load them later")
        got = {name: read(lm, p) for name, p in paths.items()}
        rank = rank or max(a.rank for a in got.values())
        slots = max(SLOTS, len(got)) if slots is None else slots
        if slots < len(got):
            raise ArgumentError(f"--max-loras {slots} holds fewer adapters than the {len(got)} given (--adapter)")
        shapes = _layers(lm, targets, rank) if targets else {}
        for a in got.values():
            shapes.update({p: (x.shape[:-1], y.shape[1:]) for p, (x, y) in a.pairs.items()})
        table = cls(dict(sorted(shapes.items())), slots, rank)
        for name, a in got.items():
            table.put(name, a)
        return table

    def args(self, index):
        """What a program takes for rows running the adapters of slots `index` (zoo.engine.programs)."""
        return self.tables, jnp.asarray(index, jnp.int32)

    def check(self, name: str, a: Adapter) -> None:
        """ArgumentError in one line where the table cannot hold adapter `a` as it is shaped."""
        if a.rank > self.rank:
            raise ArgumentError(f"adapter {name!r} has rank {a.rank}; this server's adapters hold rank {self.rank} at "
                                f"most (restart it with --max-lora-rank {a.rank})")
        outside = sorted(p for p in a.pairs if p not in self.shapes)
        if outside:
            raise ArgumentError(f"adapter {name!r} adapts {outside[0]}, which no adapter given at the start targets; "
                                f"restart the server with that layer among --lora-targets (or all)")

    def put(self, name: str, a: Adapter, engine=None) -> int:
        """Write adapter `a` into a free slot under `name` (on the engine's thread: between two decode chunks);
        its slot. The prefixes stored under that slot's former adapter are forgotten."""
        self.check(name, a)
        if name in self.names:
            raise ArgumentError(f"an adapter named {name!r} is loaded already; unload it first")
        taken = set(self.names.values())  # the free slot after the last taken first: a slot just freed is reused last
        free = sorted((s for s in range(1, self.slots + 1) if s not in taken), key=lambda s: (s <= self._last, s))
        if not free:
            raise ArgumentError(f"all {self.slots} adapter slots are taken (--max-loras {self.slots}); unload one "
                                f"first")
        slot, tables = free[0], {}
        for p, (ta, tb) in self.tables.items():
            x, y = a.pairs.get(p, (np.zeros((*self.shapes[p][0], 0)), np.zeros((0, *self.shapes[p][1]))))
            x = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, self.rank - x.shape[-1])])  # rank r -> R: zeros
            y = np.pad(y, [(0, self.rank - y.shape[0])] + [(0, 0)] * (y.ndim - 1))
            tables[p] = ta.at[slot].set(x), tb.at[slot].set(y)
        self._forget(slot, engine)
        self.tables, self.names[name], self.paths[name], self._last = tables, slot, a.path, slot
        return slot

    def remove(self, name: str, engine=None) -> int:
        """Unload adapter `name` (on the engine's thread), zeroing its slot; refused while sequences run it."""
        if name not in self.names:
            raise KeyError(name)
        slot = self.names[name]
        if engine is not None:
            running = [s for s in [*engine.rows, *engine.deferred, *list(engine.waiting.queue)]
                       if s is not None and s.adapter == slot]
            if running:
                raise InUse(f"adapter {name!r} has {len(running)} sequence(s) running or waiting; unload it "
                                    f"once they finish")
        self.tables = {p: (ta.at[slot].set(0), tb.at[slot].set(0)) for p, (ta, tb) in self.tables.items()}
        self._forget(slot, engine)
        del self.names[name], self.paths[name]
        return slot

    @staticmethod
    def _forget(slot: int, engine) -> None:
        """The stored prefixes computed under `slot` (zoo.engine.pages): keys and values of an adapter no longer
        there."""
        if engine is not None:
            engine.book.forget(slot)
