"""Orbax save failures, reported once: a failed asynchronous save (disk full, read-only) is raised as
`SaveError` with a one-line message naming the OS reason, and the echoes of the same failure from
Orbax's threads and tensorstore's callbacks are held back while training (`held`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings


class SaveError(Exception):
    """Orbax could not write a checkpoint (disk full, read-only, ...); the message is one line."""


def reason(e: BaseException) -> str:
    """The OS reason of an Orbax/tensorstore write failure (e.g. "No space left on device"), else its first line.
    tensorstore tags the OS error's code (`[os_error_code='27']`, sometimes after a long
    `[tensorstore_spec=...]`): the reason is that code's description; Python's OSError says `[Errno N] ...`."""
    msg = str(e)
    if code := re.search(r"\[os_error_code='?(\d+)", msg):
        return os.strerror(int(code.group(1)))
    m = re.search(r"(\[Errno \d+\] [^\n]*)", msg)
    return m.group(1) if m else f"{type(e).__name__}: {msg.splitlines()[0][:200] if msg else ''}"


@contextlib.contextmanager
def as_save_error(directory, at: str = ""):
    """Any exception Orbax raises inside -> SaveError naming `directory`, the OS reason and `at`."""
    try:
        yield
    except Exception as e:
        raise SaveError(f"saving checkpoints in {directory} failed{at}: {reason(e)}") from None


class _HeldOrbaxErrors(logging.Filter):
    """Holds back the error records Orbax's background threads log about a failed save."""

    def __init__(self):
        super().__init__()
        self.held: list[logging.LogRecord] = []
        self.reported = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        text = f"{record.pathname} {record.getMessage()}"
        if "orbax" in text or "OCDBT" in text or "tensorstore" in text:
            if not self.reported:
                self.held.append(record)
            return False
        return True


def _event_loop_closed(exc_type, exc, tb) -> bool:
    return exc_type is RuntimeError and "Event loop is closed" in str(exc)


@contextlib.contextmanager
def held():
    """While training: a failed asynchronous save makes Orbax's threads log the same error dozens of times
    with tracebacks, and tensorstore's callbacks print 'Event loop is closed' into a closed loop. The run
    reports such a failure itself in one line (SaveError), so those are held back; if the run ends without
    having reported one, the held records are logged as usual."""
    held = _HeldOrbaxErrors()
    loggers = [logging.getLogger(n) for n in ("absl", "asyncio")]
    for lg in loggers:
        lg.addFilter(held)
    old_hook = sys.unraisablehook

    def hook(u):  # tensorstore's callbacks into a closed loop: reported as unraisable, with no object
        if not _event_loop_closed(u.exc_type, u.exc_value, u.exc_traceback):
            old_hook(u)
    sys.unraisablehook = hook
    try:
        yield held
    except SaveError:
        held.reported = True  # stays installed: the process ends with the one line, not the echoes after it
        raise
    finally:
        if not held.reported:
            sys.unraisablehook = old_hook
            for lg in loggers:
                lg.removeFilter(held)
            for record in held.held:
                logging.getLogger(record.name).handle(record)


_READ_ECHO = "Encountered error while reading array index"
_READ_COROUTINE = "_read_array_index_and_device_put"  # Orbax's read of one array's index (its serialization)


def hold_read_echoes() -> None:
    """A step whose array file is damaged fails its restore once (reported by zoo in one line, and the next step
    tried), but Orbax's other reads of it still running then fail in their coroutines and tensorstore's callbacks
    into the closed event loop: Python prints each as "Exception ignored in: <coroutine ...>" or an "Event loop is
    closed" traceback, dozens a step, after the one line, and a read never started is collected with a
    RuntimeWarning that its coroutine was never awaited. Those echoes are held back, for the life of the process
    (they come after the read returned); any other unraisable exception or warning is printed as usual."""
    previous = sys.unraisablehook
    if getattr(previous, "zoo_read_echoes", False):
        return

    def hook(u):
        if _event_loop_closed(u.exc_type, u.exc_value, u.exc_traceback) or _READ_ECHO in str(u.exc_value)[:200]:
            return
        previous(u)
    hook.zoo_read_echoes = True
    sys.unraisablehook = hook
    warnings.filterwarnings("ignore", message=f"coroutine '{_READ_COROUTINE}' was never awaited",
                            category=RuntimeWarning)
    logging.getLogger("asyncio").addFilter(_ReadEchoes())  # "Task exception was never retrieved" of the same


class _ReadEchoes(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        text = f"{record.getMessage()[:400]} {str(exc)[:200] if exc is not None else ''}"
        return _READ_ECHO not in text and "Event loop is closed" not in text
