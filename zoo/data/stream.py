"""Streaming input (`data.streaming=true`): a `hub:` or local source read as a stream, never written to
disk whole, for corpora larger than the disk (or than the wait for a token store).

- Each process reads only its own shard of the documents (`datasets.distributed.split_dataset_by_node`:
  whole files when their count divides by the processes, else every n-th document) and tokenizes only
  those. Train and validation are split by the documents' hashes, as the token store splits them
  (zoo.data.store.doc_hash), so the same document lands on the same side either way.
- Training rows are cut back to back (seq_len + 1 tokens) from the process's documents joined by eot, and
  shuffled in pools of `data.shuffle_rows` rows, each pool permuted by (seed, process, pool number).
- Exact resume: a step's data is a function of where the stream stood, which fits in a few numbers: the
  stream's own `state_dict()` before the current document (shard and offset), the offset in that
  document's tokens, the pool number and the index in the pool. zoo.training.data_state keeps it beside
  every checkpoint; a resumed run seeks there (re-reading at most one pool) and continues bit for bit.
- The limits, stated: the rows a step sees depend on the process count, so a streamed run resumes on the
  same count of processes (the global batch may change, with --new-batch); validation is the first
  held-out documents of the whole stream, read by every process at start; the stream restarts from its
  beginning, in the same order, at each epoch.
"""

from __future__ import annotations

import contextlib

import datasets
import numpy as np
from datasets.distributed import split_dataset_by_node

from zoo.data import batches, corpus
from zoo.data.store import doc_hash
from zoo.errors import ZooDataError
from zoo.runtime import quiet_datasets

STATE_FORMAT = 1  # bump when the saved stream state changes meaning


def open_stream(cfg) -> datasets.IterableDataset:
    """The source as an IterableDataset of rows holding cfg.text_column (every process's documents)."""
    if cfg.source in corpus.NAMED:  # small, in memory: a stream of it serves tests and trials
        return datasets.Dataset.from_dict({"text": corpus.NAMED[cfg.source][0]()}).to_iterable_dataset()
    if cfg.source.startswith("hub:"):
        name, config = corpus.parse_hub(cfg.source)
        online = corpus.hub_reachable()
        try:
            with contextlib.nullcontext() if online else corpus._offline(), quiet_datasets():
                return datasets.load_dataset(name, config, split=cfg.split, streaming=True)
        except Exception as e:
            why = "" if online else f"; {corpus.hub_host()[0]} is unreachable and it is not in the local cache"
            raise ZooDataError(f"data.source={cfg.source!r}: dataset {name!r} could not be streamed "
                               f"({corpus._short(e)}){why}") from None
    files = corpus.local_files(cfg.source)
    builder, kwargs = corpus.READERS[corpus.BUILDERS[corpus._ext(files[0])]]
    try:
        with quiet_datasets():  # its "Resolving data files" bar
            return datasets.load_dataset(builder, data_files=files, split="train", streaming=True, **kwargs)
    except Exception as e:
        raise ZooDataError(f"data.source={cfg.source!r} could not be streamed ({corpus._short(e)})") from None


def text_column(cfg) -> str:
    return "text" if cfg.source in corpus.NAMED else cfg.text_column


def check_stream(cfg) -> None:
    """The source opens and its first row holds text in data.text_column: in seconds, reading one row."""
    col = text_column(cfg)
    try:
        first = next(iter(open_stream(cfg)))
    except StopIteration:
        raise ZooDataError(f"data.source={cfg.source!r} has no rows") from None
    except ZooDataError:
        raise
    except Exception as e:
        raise ZooDataError(f"data.source={cfg.source!r} could not be streamed ({corpus._short(e)})") from None
    if col not in first:
        raise ZooDataError(f"data.text_column={col!r} is not a column of {cfg.source}; columns: {', '.join(first)}")
    if not isinstance(first[col], str):
        raise ZooDataError(f"data.text_column={col!r} of {cfg.source} holds {type(first[col]).__name__}, not text")


def _shard(cfg, process_index: int, process_count: int) -> datasets.IterableDataset:
    ds = open_stream(cfg)
    if process_count > 1:
        ds = split_dataset_by_node(ds, rank=process_index, world_size=process_count)
    return ds


class Cursor:
    """This process's training tokens: its documents one after another, each followed by eot. Its position
    (`position()`, `seek()`) is (epoch, the stream's state before the current document, offset in it)."""

    def __init__(self, cfg, tokenizer, process_index: int = 0, process_count: int = 1):
        self.cfg, self.tokenizer, self.col = cfg, tokenizer, text_column(cfg)
        self.shard = (process_index, process_count)
        self.epoch, self.doc, self.off, self._before, self._found = 0, np.zeros(0, np.int32), 0, None, 0
        self._restart(None)

    def _restart(self, state: dict | None) -> None:
        self.ds = _shard(self.cfg, *self.shard)
        if state is not None:
            self.ds.load_state_dict(state)
        self._it = iter(self.ds)

    def _next_doc(self) -> None:
        while True:
            before = self.ds.state_dict()
            try:
                row = next(self._it)
            except StopIteration:
                if not self._found:
                    raise ZooDataError(f"data.source={self.cfg.source!r} holds no training document for process "
                                       f"{self.shard[0]} of {self.shard[1]} (each process streams its own shard; "
                                       f"held out: data.val_fraction={self.cfg.val_fraction})") from None
                self.epoch, self._found = self.epoch + 1, 0
                self._restart(None)
                continue
            text = row.get(self.col)
            if isinstance(text, str) and text.strip() and doc_hash(text) >= self.cfg.val_fraction:
                self.doc = np.asarray(self.tokenizer.encode(text) + [self.tokenizer.eot_token], np.int32)
                self.off, self._before, self._found = 0, before, self._found + 1
                return

    def take(self, n: int) -> np.ndarray:
        out, need = [], n
        while need:
            if self.off == len(self.doc):
                self._next_doc()
            part = self.doc[self.off:self.off + need]
            out.append(part)
            self.off += len(part)
            need -= len(part)
        return np.concatenate(out)

    def position(self) -> dict:
        return {"epoch": self.epoch, "stream": self._before, "offset": self.off}

    def seek(self, pos: dict) -> None:
        self.epoch = pos["epoch"]
        if pos["stream"] is None:  # before the first document of the epoch
            self._restart(None)
            self.doc, self.off, self._before, self._found = np.zeros(0, np.int32), 0, None, 0
            return
        self._restart(pos["stream"])
        self._found = 0
        self._next_doc()  # the document the position is in
        self.off = pos["offset"]


class StreamBatches:
    """Training batches from a stream: step -> this process's rows, in order. `state(step)` is where the
    stream stood before step's rows (kept for the steps asked lately); `restore(step, state)` seeks there."""

    def __init__(self, cursor: Cursor, seq_len: int, global_batch: int, seed: int, pool_rows: int,
                 process_index: int = 0, process_count: int = 1):
        if seed < 0:
            raise ZooDataError(f"seed={seed} must be >= 0 (train.seed)")
        rows = batches.process_rows(global_batch, process_index, process_count)
        self.cursor, self.seq_len, self.seed, self.pool_rows = cursor, seq_len, seed, max(1, pool_rows)
        self.local, self.process = rows.stop - rows.start, (process_index, process_count)
        self.pool, self.pool_no, self.index, self.pool_start = None, 0, 0, cursor.position()
        self.next_step, self.states = 0, {0: self._here()}

    def _fill(self) -> None:
        self.pool_start = self.cursor.position()
        rows = np.stack([self.cursor.take(self.seq_len + 1) for _ in range(self.pool_rows)])
        if self.pool_rows > 1:
            rows = rows[np.random.default_rng([self.seed, self.process[0], self.pool_no]).permutation(self.pool_rows)]
        self.pool, self.index = rows, 0

    def _row(self) -> np.ndarray:
        if self.pool is None:
            self._fill()
        elif self.index == self.pool_rows:
            self.pool_no += 1
            self._fill()
        self.index += 1
        return self.pool[self.index - 1]

    def _here(self) -> dict:
        if self.pool is not None and self.index == self.pool_rows:  # this pool is spent: the next one's start
            pool, start, index = self.pool_no + 1, self.cursor.position(), 0
        else:
            pool, start, index = self.pool_no, self.pool_start, self.index
        return {"format": STATE_FORMAT, "processes": self.process[1], "pool": pool, "pool_rows": self.pool_rows,
                "index": index, "start": start}

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        if step != self.next_step:
            raise ZooDataError(f"a streamed source is read in order: step {step} was asked for, the stream is at "
                               f"step {self.next_step}")
        rows_BT1 = np.stack([self._row() for _ in range(self.local)]).astype(np.int32)
        self.next_step += 1
        self.states = {k: v for k, v in self.states.items() if k > step - 16}
        self.states[step + 1] = self._here()  # known once step's rows are out: the trainer saves after the step
        return {"inputs": np.ascontiguousarray(rows_BT1[:, :-1]), "targets": np.ascontiguousarray(rows_BT1[:, 1:]),
                "weights": np.ones((self.local, self.seq_len), np.float32)}

    def state(self, step: int) -> dict:
        if step not in self.states:
            raise ZooDataError(f"the stream's position before step {step} is no longer known (kept: "
                               f"{sorted(self.states)})")
        return self.states[step]

    def restore(self, step: int, state: dict) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ZooDataError(f"the saved stream position of step {step} has format {state.get('format')}, this zoo "
                               f"reads {STATE_FORMAT}")
        if state["processes"] != self.process[1]:
            raise ZooDataError(f"data.streaming: the run's stream was split over {state['processes']} processes and "
                               f"this resume has {self.process[1]}; a streamed run resumes on the same number of "
                               f"processes (each read its own shard of the documents)")
        if state["pool_rows"] != self.pool_rows:
            raise ZooDataError(f"data.shuffle_rows={self.pool_rows}: the run streamed with {state['pool_rows']}; "
                               f"a streamed run resumes with the same pools")
        self.cursor.seek(state["start"])
        self.pool_no = state["pool"]
        self._fill()
        self.index, self.next_step = state["index"], step
        self.states = {step: state}


def eval_batches(cfg, tokenizer, global_batch: int, num_batches: int, process_index: int = 0,
                 process_count: int = 1) -> list[dict[str, np.ndarray]]:
    """Fixed validation batches from the first held-out documents of the whole stream (every process reads
    them, and keeps its own rows): as many tokens as the batches hold, or all the stream has."""
    need = num_batches * global_batch * cfg.seq_len + 1
    col, parts, got = text_column(cfg), [], 0
    for row in open_stream(cfg):
        text = row.get(col)
        if isinstance(text, str) and text.strip() and doc_hash(text) < cfg.val_fraction:
            parts.append(np.asarray(tokenizer.encode(text) + [tokenizer.eot_token], np.int32))
            got += len(parts[-1])
            if got >= need:
                break
    if got < cfg.seq_len + 1:
        raise ZooDataError(f"data.source={cfg.source!r} streams {got} validation tokens, fewer than data.seq_len + 1 "
                           f"= {cfg.seq_len + 1}; raise data.val_fraction or lower data.seq_len")
    return batches.eval_batches(np.concatenate(parts), cfg.seq_len, global_batch, num_batches, process_index,
                                process_count)
