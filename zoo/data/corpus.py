"""Documents: a corpus read into a `datasets.Dataset` with one `text` column.

Sources (data.source): `builtin` (Python's own pydoc topics: real English, always offline),
`shakespeare` (the works, one document each, from the `shakespeare` package: zoo.data.shakespeare), a
Hugging Face hub dataset (`hub:NAME[/CONFIG]`), or local files (a txt/json/jsonl/parquet/csv/tsv file, a
directory of them, or a glob, all of one type). `load_hub` and `load_local` are shared with the labelled
tasks. A CSV/TSV file has a header row naming its columns; a column of whole numbers reads as int64
(labels), other columns as strings, and only an empty cell is missing (None). datasets' progress bars stay off
while it reads (zoo.runtime.quiet_datasets).
"""

from __future__ import annotations

import contextlib
import glob
import os
import socket
import sys

import datasets

from zoo.data import shakespeare
from zoo.errors import ZooDataError
from zoo.runtime import quiet_datasets


def _builtin_texts() -> list[str]:
    from pydoc_data.topics import topics  # ships with CPython: a real English corpus, always offline

    return [topics[k] for k in sorted(topics)]


def _builtin_fingerprint() -> str:
    return f"python{sys.version_info[0]}.{sys.version_info[1]}"


# Sources named by a word, not a path or hub:: name -> (their documents, what changes them without
# changing the name: part of the token store's key, zoo.data.store).
NAMED = {"builtin": (_builtin_texts, _builtin_fingerprint),
         shakespeare.NAME: (lambda: list(shakespeare.works().values()), shakespeare.fingerprint)}
# Extension -> the kind of file; a source holds files of one kind.
BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".tsv": "tsv"}
# In CSV/TSV only an empty cell is missing: pandas' default would also read a cell NA, None, null, nan or
# n/a as missing, and so lose a text "NA" or a label "None".
_CELLS = {"keep_default_na": False, "na_values": [""]}
# Kind -> the `datasets` packaged builder that reads it, and its options. Each text file is one document
# (line-per-row would cut documents at every newline); TSV is the csv builder on tabs.
READERS = {"text": ("text", {"sample_by": "document"}), "json": ("json", {}), "parquet": ("parquet", {}),
           "csv": ("csv", _CELLS), "tsv": ("csv", {"delimiter": "\t", **_CELLS})}


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
                               f"use builtin, shakespeare, hub:NAME[/CONFIG] or a local path")
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
    # `datasets` wraps a reader's error (pandas' "Expected 2 fields in line 3, saw 3") in one that names nothing.
    while isinstance(e, datasets.exceptions.DatasetGenerationError) and e.__cause__ is not None:
        e = e.__cause__
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


def hub_host() -> tuple[str, int]:
    from urllib.parse import urlparse

    from huggingface_hub import constants
    url = urlparse(constants.ENDPOINT)
    return url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection within `timeout` seconds."""
    try:
        socket.create_connection(hub_host(), timeout=timeout).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _offline():
    """datasets and huggingface_hub in offline mode (the local cache only) for the body: without the hub,
    their retries would take a minute or more to fail."""
    import datasets.config as dc
    import huggingface_hub.constants as hc
    old = dc.HF_HUB_OFFLINE, hc.HF_HUB_OFFLINE
    dc.HF_HUB_OFFLINE = hc.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        dc.HF_HUB_OFFLINE, hc.HF_HUB_OFFLINE = old


def load_hub(cfg) -> datasets.Dataset:
    """A hub dataset; with the hub unreachable, from the local cache alone (an error in seconds if it is not
    there, never a wait on retries)."""
    name, config = parse_hub(cfg.source)
    online = hub_reachable()
    try:
        with contextlib.nullcontext() if online else _offline(), quiet_datasets():
            return datasets.load_dataset(name, config, split=cfg.split)
    except Exception as e:
        why = "" if online else f"; {hub_host()[0]} is unreachable and it is not in the local cache"
        raise ZooDataError(f"data.source={cfg.source!r}: dataset {name!r} could not be loaded ({_short(e)}){why}") \
            from None


def load_local(cfg) -> datasets.Dataset:
    files = local_files(cfg.source)
    kind = BUILDERS[_ext(files[0])]
    builder, kwargs = READERS[kind]
    # Local files are read once per store, so their Arrow copy stays beside the stores, not in the HF cache.
    cache = os.path.join(os.path.expanduser(cfg.cache_dir), "hf")
    try:
        with quiet_datasets():
            ds = datasets.load_dataset(builder, data_files=files, split="train", cache_dir=cache, **kwargs)
    except Exception as e:
        raise ZooDataError(f"data.source={cfg.source!r} could not be read as {kind} ({_short(e)})") from None
    if kind in ("csv", "tsv"):
        _no_open_quote(ds, cfg.source, "\t" if kind == "tsv" else ",")
    return ds


def _no_open_quote(ds: datasets.Dataset, source: str, delimiter: str) -> None:
    """A quote left open in a CSV swallows the rows after it into one cell (texts merged, labels shifted, and
    fewer rows read than the file has). A cell spanning lines of which one holds a whole row's worth of delimiters
    (as many as the file has columns, less one, the last field a value of the last column) is that: refused,
    naming the row and the cell."""
    n = len(ds.column_names)
    if n < 2 or not len(ds):
        return
    last = {str(v).strip() for v in ds[ds.column_names[-1]]}  # a swallowed row ends in a value of the last column
    for col in ds.column_names:
        if getattr(ds.features[col], "dtype", None) not in ("string", "large_string"):
            continue
        for i, cell in enumerate(ds[col]):
            if isinstance(cell, str) and "\n" in cell:
                lines = cell.split("\n")
                rowlike = [line for line in lines[1:] if line.count(delimiter) == n - 1 and
                           line.rsplit(delimiter, 1)[-1].strip().strip('"') in last]
                if rowlike:
                    raise ZooDataError(f"data.source={source!r}: row {i}'s {col!r} cell spans {len(lines)} lines, and "
                                       f"{len(rowlike)} of them read as whole rows ({rowlike[0][:60]!r}): a quote left "
                                       f"open swallows the rows after it; close it, or quote the text's own quotes "
                                       f"as \"\"")


def load_documents(cfg) -> datasets.Dataset:
    """The corpus as a Dataset with one `text` column, one non-empty document per row."""
    if cfg.source in NAMED:
        ds = datasets.Dataset.from_dict({"text": NAMED[cfg.source][0]()})
    elif cfg.source.startswith("hub:"):
        ds = load_hub(cfg)
    else:
        ds = load_local(cfg)
    col = "text" if cfg.source in NAMED else cfg.text_column
    if col not in ds.column_names:
        raise ZooDataError(f"data.text_column={col!r} is not a column of {cfg.source}; "
                           f"columns: {', '.join(ds.column_names)}")
    dtype = getattr(ds.features[col], "dtype", None)
    if dtype not in ("string", "large_string"):
        raise ZooDataError(f"data.text_column={col!r} of {cfg.source} holds {ds.features[col]}, not text")
    ds = ds.select_columns([col])
    if col != "text":
        ds = ds.rename_column(col, "text")
    with quiet_datasets():
        ds = ds.filter(lambda b: [bool(t and t.strip()) for t in b["text"]], batched=True)
    if len(ds) == 0:
        raise ZooDataError(f"data.source={cfg.source!r} has no non-empty text in column {col!r}")
    return ds


