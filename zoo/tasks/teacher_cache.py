"""The teacher's top-k logits cached offline (distill.top_k = k > 0): a teacher too large, or too slow, to run beside
the student in every step runs once, before training, over every training row, and keeps at each position its k
largest logits, their ids and the logsumexp of all its logits at distill.temperature; the step then reads them
(zoo.tasks.distill.Cached: the KL over the k ids plus one bucket for the rest) and the teacher's weights are never
held beside the student's.

Rows: the training set cut into fixed rows, each read whole by the teacher once. gpt_lm's rows are the token stream's
consecutive windows (row i: tokens [i T, (i + 1) T] of the train split, T = data.seq_len; the live teacher's run draws
windows at random offsets instead, which no cache can hold); sft's are its packed rows (data.packing's plan). A
step's rows are drawn one permutation per epoch from (train.seed, epoch) (zoo.data.batches.EpochOrder), so a batch is
a pure function of (seed, step) and a resumed run reads what the uninterrupted one read.

The cache lives under data.cache_dir, in `teacher-<key>/` (ids.npy int32[N, T, k], logits.npy float32[N, T, k],
lse.npy float32[N, T], meta.json), keyed by the teacher (its source, and the size and modification time of each of
its files), k, the temperature and a digest of every row's tokens: another teacher, corpus, tokenizer, seq_len,
packing or temperature gets another cache; another alpha, seed or student reuses it. It is built in a sibling
temporary directory and renamed into place, so an interrupted build leaves nothing a later run would take for a
cache. The logits are kept raw (the temperature divides them in the step), in float32.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time

import jax
import numpy as np

from zoo.data.batches import EpochOrder, process_rows
from zoo.data.store import publish
from zoo.errors import ConfigError, TrainError

FORMAT_VERSION = 2  # bump when the files or the rows change: older caches are then ignored
# name -> (dtype, whether it has the top-k axis): the cache's files, and its batch keys teacher_<name>
ARRAYS = {"ids": (np.int32, True), "logits": (np.float32, True), "lse": (np.float32, False)}
FILES = tuple(ARRAYS)


def _shape(name: str, rows: int, seq_len: int, k: int) -> tuple:
    return (rows, seq_len, k) if ARRAYS[name][1] else (rows, seq_len)


class Rows:
    """A training set as fixed rows: `n` of them, `of(idx)` their batch arrays (inputs, targets, weights and, for
    packed rows, positions and segment_ids)."""

    def __init__(self, train):
        if not hasattr(train, "fixed_rows"):
            raise ConfigError(f"distill.top_k caches the teacher's logits of fixed training rows; this task's data "
                              f"({type(train).__name__}) has none (set distill.top_k=0)")
        (self.n, self.of), self.seq_len = train.fixed_rows(), train.seq_len

    def digest(self, chunk: int = 256) -> str:
        """sha256 of every row's arrays, in order: what the teacher would read."""
        h = hashlib.sha256()
        for start in range(0, self.n, chunk):
            b = self.of(np.arange(start, min(start + chunk, self.n)))
            for k in sorted(b):
                h.update(k.encode())
                h.update(np.ascontiguousarray(b[k]).tobytes())
        return h.hexdigest()


class CachedBatches:
    """step -> this process's rows of the global batch with the teacher's cached top-k of each (teacher_ids,
    teacher_logits: [B, T, k]); the rows drawn one permutation per epoch from (seed, epoch). Made with the task's
    data (`deferred`), its cache attached before the first step (`attach`, from the task's prepare)."""

    def __init__(self, rows: Rows, k: int, global_batch: int, seed: int, process_index: int = 0,
                 process_count: int = 1):
        self.source, self.k, self.cache = rows, k, None
        self.order = EpochOrder(rows.n, global_batch, seed)
        self.rows = process_rows(global_batch, process_index, process_count)

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        if self.cache is None:
            raise TrainError("distill.top_k: the teacher's cache was not attached before the first step "
                             "(the task's prepare attaches it)")
        idx = self.order(step)[self.rows]
        return {**self.source.of(idx), **{f"teacher_{n}": np.asarray(self.cache[n][idx]) for n in FILES}}

    def shaped(self, step: int = 0) -> dict[str, np.ndarray]:
        """The batch of `step` with the teacher's arrays zeros: their shapes and dtypes alone, for a program compiled
        before any cache is built (--compile-for)."""
        rows = self.source.of(self.order(step)[self.rows])
        B, T = rows["inputs"].shape
        zeros = {f"teacher_{n}": np.zeros(_shape(n, B, T, self.k), dtype) for n, (dtype, _) in ARRAYS.items()}
        return {**rows, **zeros}


def deferred(cfg, data, process_index: int, process_count: int):
    """`data` with its training rows read with the teacher's cached top-k when distill.top_k is set (the cache
    attached later, by `attach`); `data` as it is otherwise."""
    if not (cfg.distill.teacher and cfg.distill.top_k):
        return data
    train = CachedBatches(Rows(data.train), cfg.distill.top_k, cfg.train.batch_size, cfg.train.seed, process_index,
                          process_count)
    return dataclasses.replace(data, train=train)


def fingerprint(source: str) -> list:
    """What identifies a teacher without reading it: its source, and for a path each file's (name, size, mtime)."""
    if not os.path.exists(source):
        return [source]
    if os.path.isfile(source):
        st = os.stat(source)
        return [os.path.abspath(source), st.st_size, st.st_mtime_ns]
    out = [os.path.abspath(source)]
    for root, dirs, files in os.walk(source):
        dirs.sort()
        for f in sorted(files):
            st = os.stat(os.path.join(root, f))
            out.append([os.path.relpath(os.path.join(root, f), source), st.st_size, st.st_mtime_ns])
    return out


def cache_key(source: str, k: int, temperature: float, rows: Rows) -> str:
    key = {"format": FORMAT_VERSION, "teacher": fingerprint(source), "k": k, "temperature": temperature,
           "rows": rows.n, "seq_len": rows.seq_len, "digest": rows.digest()}
    return "teacher-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def open_cache(path: str, vocab_size: int) -> dict:
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    if meta["vocab_size"] != vocab_size:
        raise ConfigError(f"the teacher's cache {path} holds logits over {meta['vocab_size']} tokens but the "
                          f"student's model.vocab_size={vocab_size}; a teacher must share the student's vocabulary")
    return {**{n: np.load(os.path.join(path, f"{n}.npy"), mmap_mode="r") for n in FILES}, "meta": meta, "path": path}


def build(path: str, teacher, params, rows: Rows, k: int, temperature: float, batch: int, say=print) -> None:
    """The teacher's top-k and its logsumexp at `temperature` at every position of every row, `batch` rows a forward,
    written to `path` (built aside, renamed into place)."""
    root = os.path.dirname(path)
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.partial-", dir=root)
    try:
        os.chmod(tmp, 0o755)

        @jax.jit
        def top(p, b):
            packing = {"positions_BT": b["positions"], "segment_ids_BT": b["segment_ids"]} if "positions" in b else {}
            u_BTV = teacher.logits(p, b["inputs"], **packing)
            vals_BTK, ids_BTK = jax.lax.top_k(u_BTV, k)
            return vals_BTK, ids_BTK, jax.nn.logsumexp(u_BTV / temperature, -1)

        ids, logits, lse = (np.lib.format.open_memmap(os.path.join(tmp, f"{n}.npy"), "w+", dtype,
                                                      _shape(n, rows.n, rows.seq_len, k))
                            for n, (dtype, _) in ARRAYS.items())
        t0, told = time.perf_counter(), 0
        for start in range(0, rows.n, batch):
            idx = np.arange(start, min(start + batch, rows.n))
            b = rows.of(np.concatenate([idx, np.full(batch - len(idx), idx[-1])]))  # one shape: one program
            vals, which, norm = jax.device_get(top(params, {n: v for n, v in b.items() if n != "weights"}))
            logits[idx], ids[idx], lse[idx] = vals[:len(idx)], which[:len(idx)], norm[:len(idx)]
            done = idx[-1] + 1
            if done == rows.n or done - told >= max(rows.n // 10, 1):
                told, s = done, time.perf_counter() - t0
                say(f"distill.top_k={k}: the teacher read {done}/{rows.n} rows ({done * rows.seq_len / s:,.0f} "
                    f"tokens/s)")
        ids.flush(), logits.flush(), lse.flush()
        del ids, logits, lse
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({"format": FORMAT_VERSION, "source": teacher.source, "k": k, "temperature": temperature,
                       "rows": rows.n,
                       "seq_len": rows.seq_len, "vocab_size": teacher.cfg.model.vocab_size}, f, indent=1)
        publish(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def attach(task, data, mesh, say=print) -> None:
    """The teacher's cached top-k (distill.top_k) attached to data.train (`deferred`'s), the cache built first when
    it is not there: the teacher read by the loader distill.attach handed its Teacher, then dropped."""
    cfg, teacher, batches = task.cfg, task.teacher, data.train
    k, rows = cfg.distill.top_k, batches.source
    T = cfg.distill.temperature
    path = os.path.join(os.path.expanduser(cfg.data.cache_dir), cache_key(teacher.source, k, T, rows))
    where = f"distill.top_k={k}"
    if os.path.exists(os.path.join(path, "meta.json")):
        say(f"{where}: the teacher's top-{k} logits of {rows.n} rows read from {path}")
    else:
        if jax.process_count() > 1:
            raise ConfigError(f"{where}: the teacher's cache is built by one process; run the same config once with "
                              f"one process (it builds {path}), then the multi-process run reads it")
        params = teacher.loader(mesh)
        if k > teacher.cfg.model.vocab_size:
            raise ConfigError(f"{where} is more than the teacher's {teacher.cfg.model.vocab_size} tokens; choose "
                              f"1..{teacher.cfg.model.vocab_size}")
        say(f"{where}: caching the teacher's top-{k} logits of {rows.n} rows x {rows.seq_len} positions in {path}")
        build(path, teacher, params, rows, k, T, cfg.train.batch_size, say)
        del params
    batches.cache = open_cache(path, cfg.model.vocab_size)
