"""Text -> token store on disk -> deterministic batches per step.

`load_documents` reads a corpus (Python's own docs, a Hugging Face hub dataset, or local files) into a
`datasets.Dataset` with one `text` column. `build_token_store` tokenizes it once, splits it into
train and validation by document and writes two flat token files that later runs memory-map.
`Batches` turns a token file into the global batch of any step as a pure function of (seed, step),
so resuming, changing the process count or replaying a step gives the same data; each process reads
only its own rows. `eval_batches` gives fixed validation batches.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass

import datasets
import numpy as np

from zoo.config import DataConfig
from zoo.tokenizers import ZooDataError, get_tokenizer  # noqa: F401  (re-exported: the trainer imports both here)

FORMAT_VERSION = 1  # bump when the store layout or the train/val split changes: old stores are then ignored
BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
DOCS_PER_PROC = 1000  # below this many documents per process, forking costs more than it saves


# ---- documents ----------------------------------------------------------------------------------
def _ext(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def local_files(source: str) -> list[str]:
    """The files a local source names: a file, every supported file under a directory, or a glob."""
    path = os.path.expanduser(source)
    supported = ", ".join(BUILDERS)
    if os.path.isdir(path):
        files = [f for f in glob.glob(os.path.join(path, "**", "*"), recursive=True) if _ext(f) in BUILDERS]
        if not files:
            raise ZooDataError(f"data.source={source!r} is a directory with no {supported} files")
    elif os.path.isfile(path):
        files = [path]
    else:
        files = glob.glob(path, recursive=True)
        if not files:
            raise ZooDataError(f"data.source={source!r}: no such file, directory or glob match; "
                               f"use builtin, hub:NAME[/CONFIG] or a local path")
    files = sorted(os.path.abspath(f) for f in files if os.path.isfile(f))
    unknown = sorted({_ext(f) or "(no extension)" for f in files} - BUILDERS.keys())
    if unknown:
        raise ZooDataError(f"data.source={source!r} has files of unsupported type {', '.join(unknown)}; "
                           f"supported: {supported}")
    if len({BUILDERS[_ext(f)] for f in files}) > 1:
        raise ZooDataError(f"data.source={source!r} mixes file types "
                           f"{', '.join(sorted({_ext(f) for f in files}))}; point it at one type")
    return files


def _short(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:160]}" if lines else type(e).__name__


def parse_hub(source: str) -> tuple[str, str | None]:
    """hub:NAME, hub:NAME/CONFIG (wikitext/wikitext-103-raw-v1, glue/sst2), hub:OWNER/NAME/CONFIG,
    and hub:OWNER/NAME/ (a trailing slash: an owner/name repo without a config)."""
    body = source[len("hub:"):]
    if body.endswith("/"):
        return body.rstrip("/"), None
    parts = body.split("/")
    if len(parts) == 1:
        return parts[0], None
    return "/".join(parts[:-1]), parts[-1]


def _load_hub(cfg: DataConfig) -> datasets.Dataset:
    name, config = parse_hub(cfg.source)
    try:
        return datasets.load_dataset(name, config, split=cfg.split)
    except Exception as e:
        raise ZooDataError(f"dataset {name!r} could not be loaded ({_short(e)})") from None


def _load_local(cfg: DataConfig) -> datasets.Dataset:
    files = local_files(cfg.source)
    builder = BUILDERS[_ext(files[0])]
    # Each text file is one document; line-per-row would cut documents at every newline.
    kwargs = {"sample_by": "document"} if builder == "text" else {}
    # Local files are read once per store, so their Arrow copy stays beside the stores, not in the HF cache.
    cache = os.path.join(os.path.expanduser(cfg.cache_dir), "hf")
    try:
        return datasets.load_dataset(builder, data_files=files, split="train", cache_dir=cache, **kwargs)
    except Exception as e:
        raise ZooDataError(f"data.source={cfg.source!r} could not be read as {builder} ({_short(e)})") from None


def load_documents(cfg: DataConfig) -> datasets.Dataset:
    """The corpus as a Dataset with one `text` column, one non-empty document per row."""
    if cfg.source == "builtin":
        from pydoc_data.topics import topics  # ships with CPython: a real English corpus, always offline

        ds = datasets.Dataset.from_dict({"text": [topics[k] for k in sorted(topics)]})
    elif cfg.source.startswith("hub:"):
        ds = _load_hub(cfg)
    else:
        ds = _load_local(cfg)
    col = cfg.text_column if cfg.source != "builtin" else "text"
    if col not in ds.column_names:
        raise ZooDataError(f"data.text_column={col!r} is not a column of {cfg.source}; "
                           f"columns: {', '.join(ds.column_names)}")
    dtype = getattr(ds.features[col], "dtype", None)
    if dtype not in ("string", "large_string"):
        raise ZooDataError(f"data.text_column={col!r} of {cfg.source} holds {ds.features[col]}, not text")
    ds = ds.select_columns([col])
    if col != "text":
        ds = ds.rename_column(col, "text")
    ds = ds.filter(lambda b: [bool(t and t.strip()) for t in b["text"]], batched=True)
    if len(ds) == 0:
        raise ZooDataError(f"data.source={cfg.source!r} has no non-empty text in column {col!r}")
    return ds


# ---- token store --------------------------------------------------------------------------------
@dataclass
class TokenStore:
    """Train and validation token streams (documents joined by eot) memory-mapped from `path`."""

    train: np.ndarray  # 1-D memmap of token ids
    val: np.ndarray  # 1-D memmap of token ids
    path: str  # the store directory


def store_dtype(n_vocab: int) -> np.dtype:
    return np.dtype(np.uint16 if n_vocab <= 65535 else np.uint32)


def _fingerprint(source: str):
    """What changes a source's content without changing its name."""
    if source == "builtin":
        return f"python{sys.version_info[0]}.{sys.version_info[1]}"
    if source.startswith("hub:"):
        return None
    return [(f, os.path.getsize(f), os.stat(f).st_mtime_ns) for f in local_files(source)]


def store_key(cfg: DataConfig, tokenizer) -> str:
    ident = dict(source=cfg.source, split=cfg.split, text_column=cfg.text_column, val_fraction=cfg.val_fraction,
                 tokenizer=tokenizer.name, tokenizer_fingerprint=getattr(tokenizer, "fingerprint", None),
                 n_vocab=tokenizer.n_vocab, version=FORMAT_VERSION, fingerprint=_fingerprint(cfg.source))
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def doc_hash(text: str) -> float:
    """A document's place in [0, 1): from its text, so exact duplicates always land in the same split."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big") / 2.0**64


def val_documents(u: np.ndarray, val_fraction: float) -> np.ndarray:
    """bool[n] from the documents' hashes: validation iff below val_fraction, with at least one on each side."""
    is_val = u < val_fraction
    if not is_val.any():
        is_val[np.argmin(u)] = True
    if is_val.all():
        is_val[np.argmax(u)] = False
    return is_val


def _write_tokens(tokenized: datasets.Dataset, is_val: np.ndarray, dirname: str, dtype) -> dict:
    """Stream the tokenized documents into train.bin / val.bin in document order."""
    counts = dict(train_tokens=0, val_tokens=0)
    start = 0
    with open(os.path.join(dirname, "train.bin"), "wb") as ft, open(os.path.join(dirname, "val.bin"), "wb") as fv:
        for table in tokenized.with_format("arrow").iter(batch_size=10_000):
            ids = table.column("ids").combine_chunks()  # ListArray: one row of ids per document
            flat = ids.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)
            tok_val = np.repeat(is_val[start:start + len(ids)], ids.value_lengths().to_numpy())
            flat[~tok_val].tofile(ft)
            flat[tok_val].tofile(fv)
            counts["val_tokens"] += int(tok_val.sum())
            counts["train_tokens"] += int(len(flat) - tok_val.sum())
            start += len(ids)
    return counts


def _write_meta(dirname: str, meta: dict) -> None:
    with open(os.path.join(dirname, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)


def _build(cfg: DataConfig, tokenizer, key: str, tmp: str) -> None:
    docs = load_documents(cfg)
    if len(docs) < 2:
        raise ZooDataError(f"data.source={cfg.source!r} has {len(docs)} document; a train/val split by "
                           f"document needs at least 2")
    dtype, eot = store_dtype(tokenizer.n_vocab), tokenizer.eot_token

    def tokenize(batch):
        return {"ids": [ids + [eot] for ids in tokenizer.encode_batch(batch["text"])],
                "u": [doc_hash(t) for t in batch["text"]]}

    num_proc = min(cfg.num_proc, max(1, len(docs) // DOCS_PER_PROC))
    tokenized = docs.map(
        tokenize, batched=True, batch_size=1000, num_proc=num_proc if num_proc > 1 else None,
        remove_columns=docs.column_names,
        features=datasets.Features({"ids": datasets.List(datasets.Value(dtype.name)),
                                    "u": datasets.Value("float64")}),
        # The Arrow intermediate lives in the temp dir, so it vanishes with it; a given fingerprint
        # spares datasets from hashing the tokenizer (a BPE table) to name the cache file.
        cache_file_name=os.path.join(tmp, "arrow", "ids.arrow"), new_fingerprint=key, desc="tokenizing")
    is_val = val_documents(tokenized.data.column("u").to_numpy(), cfg.val_fraction)
    counts = _write_tokens(tokenized, is_val, tmp, dtype)
    del tokenized
    shutil.rmtree(os.path.join(tmp, "arrow"), ignore_errors=True)
    _write_meta(tmp, dict(
        format=FORMAT_VERSION, source=cfg.source, split=cfg.split, text_column=cfg.text_column,
        tokenizer=tokenizer.name, n_vocab=tokenizer.n_vocab, eot_token=eot, dtype=dtype.name,
        val_fraction=cfg.val_fraction, train_documents=int((~is_val).sum()), val_documents=int(is_val.sum()),
        **counts))


def open_store(path: str) -> TokenStore:
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    train, val = (np.memmap(os.path.join(path, f"{split}.bin"), dtype=meta["dtype"], mode="r")
                  for split in ("train", "val"))
    return TokenStore(train=train, val=val, path=path)


def build_token_store(cfg: DataConfig, tokenizer) -> TokenStore:
    """Tokenize the corpus once into `cache_dir/<key>`; later calls reuse it without reading the source."""
    root = os.path.expanduser(cfg.cache_dir)
    key = store_key(cfg, tokenizer)
    path = os.path.join(root, key)
    if os.path.exists(os.path.join(path, "meta.json")):
        return open_store(path)
    os.makedirs(root, exist_ok=True)
    # Built in a sibling temp dir and renamed into place: a crash leaves no half store under `key`.
    tmp = tempfile.mkdtemp(prefix=f".{key}.partial-", dir=root)
    try:
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide a shared cache's stores from other users
        _build(cfg, tokenizer, key, tmp)
        if os.path.isdir(path) and not os.path.exists(os.path.join(path, "meta.json")):
            shutil.rmtree(path)  # not a store (no meta.json): debris from outside this module
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.exists(os.path.join(path, "meta.json")):
                raise  # else a concurrent build of the same key won; its store is identical
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return open_store(path)


def check_length(store: TokenStore, seq_len: int, source: str) -> None:
    """Both streams must hold one full training row (seq_len inputs + 1 target)."""
    for split, tokens in (("train", store.train), ("val", store.val)):
        if len(tokens) < seq_len + 1:
            raise ZooDataError(f"data.source={source!r} has {len(tokens)} {split} tokens, fewer than "
                               f"data.seq_len + 1 = {seq_len + 1}; lower data.seq_len or use a larger corpus")


def prepare(cfg: DataConfig, tokenizer=None):
    """(tokenizer, store) for a run, with the store checked to be long enough for `cfg.seq_len`."""
    tokenizer = tokenizer if tokenizer is not None else get_tokenizer(cfg.tokenizer)
    store = build_token_store(cfg, tokenizer)
    check_length(store, cfg.seq_len, cfg.source)
    return tokenizer, store


# ---- batches ------------------------------------------------------------------------------------
def process_rows(global_batch: int, process_index: int, process_count: int) -> slice:
    if not 0 <= process_index < process_count:
        raise ZooDataError(f"process_index={process_index} is outside [0, process_count={process_count})")
    if global_batch % process_count:
        raise ZooDataError(f"global batch {global_batch} is not divisible by process_count={process_count}; "
                           f"make train.batch_size a multiple of {process_count}")
    per = global_batch // process_count
    return slice(process_index * per, (process_index + 1) * per)


class EpochOrder:
    """Example indices of a step's global batch: one permutation per epoch, drawn from (seed, epoch),
    so every example is seen once per epoch and the batch of step s is a pure function of (seed, s)."""

    def __init__(self, n: int, global_batch: int, seed: int):
        if seed < 0:
            raise ZooDataError(f"seed={seed} must be >= 0 (train.seed)")
        self.n, self.global_batch, self.seed = n, global_batch, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 4:  # a step spans at most two epochs: keep the cache small
                self._perms.clear()
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._perms[epoch]

    def __call__(self, step: int) -> np.ndarray:
        pos = step * self.global_batch + np.arange(self.global_batch)
        return np.asarray([self._perm(int(p // self.n))[p % self.n] for p in pos])


def _check_tokens(tokens: np.ndarray, seq_len: int) -> None:
    if len(tokens) < seq_len + 1:
        raise ZooDataError(f"{len(tokens)} tokens are fewer than seq_len + 1 = {seq_len + 1}; "
                           f"lower data.seq_len or use a larger corpus")


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
    # One fancy index reads just these rows' pages from the memmap.
    rows_BT1 = np.asarray(tokens[starts[:, None] + np.arange(seq_len + 1)], dtype=np.int32)
    return {"inputs": np.ascontiguousarray(rows_BT1[:, :-1]),
            "targets": np.ascontiguousarray(rows_BT1[:, 1:]),
            "weights": np.ones((len(starts), seq_len), np.float32)}


class Batches:
    """Training batches: step -> this process's rows of the global batch, a pure function of (seed, step)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, global_batch: int, seed: int,
                 process_index: int = 0, process_count: int = 1):
        _check_tokens(tokens, seq_len)
        if seed < 0:
            raise ZooDataError(f"seed={seed} must be >= 0 (train.seed)")
        self.tokens, self.seq_len, self.global_batch, self.seed = tokens, seq_len, global_batch, seed
        self.rows = process_rows(global_batch, process_index, process_count)

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, step])
        # Every process draws the whole global batch so all agree on it, then keeps its own rows.
        starts = rng.integers(0, len(self.tokens) - self.seq_len, size=self.global_batch)
        return _windows(self.tokens, starts[self.rows], self.seq_len)


def eval_batches(tokens: np.ndarray, seq_len: int, global_batch: int, num_batches: int,
                 process_index: int = 0, process_count: int = 1) -> list[dict[str, np.ndarray]]:
    """Fixed validation batches: consecutive windows from the start, wrapping around a short stream."""
    _check_tokens(tokens, seq_len)
    rows = process_rows(global_batch, process_index, process_count)
    n_windows = (len(tokens) - 1) // seq_len
    out = []
    for b in range(num_batches):
        window = np.arange(b * global_batch, (b + 1) * global_batch)[rows] % n_windows
        out.append(_windows(tokens, window * seq_len, seq_len))
    return out
