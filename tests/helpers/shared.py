"""Build something once per test session, whichever pytest-xdist worker asks first.

A session-scoped fixture runs once per worker, so with `-n 2` a trained reference run is trained twice,
each worker slowing the other. `once(tmp_path_factory, name, build)` builds into a directory that every
worker of the session shares (pytest's base temp, which xdist workers have as their parent), under a
file lock: the first worker builds, the others wait and read. A build that fails leaves no directory, so
the next worker to ask builds again and sees the same error.
"""

import os
import shutil

from filelock import FileLock


def session_root(tmp_path_factory):
    """The directory every worker of this test session shares (the base temp itself without xdist)."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


def once(tmp_path_factory, name: str, build):
    """The directory `name`, filled by `build(path)` the first time any worker asks for it."""
    root = session_root(tmp_path_factory)
    path, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            try:
                build(path)
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            done.touch()
    return path
