"""One run per workdir: `claim(workdir)` creates the directory if needed, proves it writable and takes an
exclusive lock (`fcntl.flock` on WORKDIR/.lock) held until the run ends. A second run on the same workdir
is refused at once, naming the holder's pid; the kernel drops the lock when its holder dies, so a run
killed with kill -9 leaves nothing that blocks the next one. Checked before any expensive work; a workdir the
run may not use (another run's checkpoints, through a link or not) is refused before its .lock is written.
`own_tokenizer` copies the tokenizer files a run reads into it."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil

from zoo.errors import TrainError

LOCK = ".lock"


@contextlib.contextmanager
def claim(workdir: str, enabled: bool = True, check=None):
    """Hold `workdir` for one run; yields whether it was created here (the caller may remove it if the run
    fails before it made anything worth keeping). `check()`, given, refuses a workdir (one that holds another
    run's checkpoints, through a link or not) once the lock is held and before anything is written in it: the
    other run's .lock keeps its holder's pid. `enabled=False` (processes other than 0) only checks."""
    if not enabled:
        if check is not None:
            check()
        yield False
        return
    created = not os.path.exists(workdir)
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise TrainError(f"workdir {workdir!r} is a file, not a directory; pick another --workdir")
    path = os.path.join(workdir, LOCK)
    fd = _open(workdir, path, create=False)  # a lock there already: taken before the check, its content kept
    try:
        if fd is not None:
            _lock(workdir, fd)
        if check is not None:
            check()
        if fd is None:
            fd = _open(workdir, path, create=True)
            _lock(workdir, fd)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        ckpts = os.path.join(workdir, "checkpoints")
        for d in (workdir, ckpts):
            if os.path.isdir(d) and not os.access(d, os.W_OK):
                raise TrainError(f"{d!r} is read-only; checkpoints could not be saved (pick another --workdir)")
        yield created
    finally:
        os.close(fd)  # releases the lock


def _open(workdir: str, path: str, create: bool) -> int | None:
    """The lock file's descriptor (None: there is none and `create` is False)."""
    try:
        if create:
            os.makedirs(workdir, exist_ok=True)
        return os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    except OSError as e:
        if not create and isinstance(e, FileNotFoundError):
            return None
        raise TrainError(f"workdir {workdir!r} is not writable ({e.strerror}); pick another --workdir") from None


def _lock(workdir: str, fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(workdir, fd) from None


def _in_use(workdir: str, fd: int) -> TrainError:
    """The refusal of a workdir whose lock is held, naming the holder's pid (written into the lock file)."""
    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    return TrainError(f"workdir {workdir!r} is in use by another training run (pid {holder}); wait for it "
                      f"to end or pick another --workdir")


def check_free(workdir: str) -> None:
    """Refuse at once a workdir whose lock another run holds (before jax is imported or the config read):
    what `claim` would say, without taking the lock."""
    path = os.path.join(workdir, LOCK)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file (a new workdir) or unreadable: claim decides
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(workdir, fd) from None
    finally:
        os.close(fd)


def remove_new(workdir: str) -> None:
    """Remove a workdir this run created, after a failure before any result (config or data error)."""
    shutil.rmtree(workdir, ignore_errors=True)


def own_tokenizer(cfg, workdir: str, write: bool = True):
    """cfg with its tokenizer files in the run: a tokenizer directory (its tokenizer files alone) or a .tiktoken
    file outside `workdir` is copied into WORKDIR/tokenizer, so the run reads the same ids after its base or
    the file moves. Names (bytes, gpt2) and files already in the run stay as they are."""
    from zoo.data.hf_tokenizers import SEQ2SEQ_FILE, save_dir
    tok = os.path.expanduser(cfg.data.tokenizer)
    root = os.path.abspath(workdir)
    if not os.path.exists(tok) or os.path.commonpath([os.path.abspath(tok), root]) == root:
        return cfg
    dst = os.path.join(root, "tokenizer")
    if os.path.isfile(tok):
        dst = os.path.join(dst, os.path.basename(tok))
    if write:
        if os.path.isdir(tok):
            save_dir(tok, dst)
            if os.path.isfile(os.path.join(tok, SEQ2SEQ_FILE)):  # a converted encoder-decoder's framing
                shutil.copyfile(os.path.join(tok, SEQ2SEQ_FILE), os.path.join(dst, SEQ2SEQ_FILE))
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(tok, dst)
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=dst))
