"""How a run stops on SIGTERM or Ctrl-C. Inside the loop, `Stopper` turns the signal into a flag: the loop saves
a checkpoint and exits cleanly, every process after the same step. Outside it (`stops_at_once`: converting a base,
building the data, compiling the state's init) the signal raises `Stopped` where the program is, so every cleanup
on the way out runs."""

from __future__ import annotations

import contextlib
import signal

from zoo.training import peers


class Stopper:
    """SIGTERM / Ctrl-C set a flag; the loop saves a checkpoint and exits cleanly."""

    def __init__(self):
        self.signal = None
        self._old = {}

    def __enter__(self):
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: no handlers
            pass
        return self

    def _handle(self, signum, frame):
        self.signal = signum

    def interrupted(self, e: KeyboardInterrupt) -> None:
        """A KeyboardInterrupt raised in the task's host code (a reward function: zoo.tasks.rl) stops the run as
        Ctrl-C does, the line naming it."""
        self.signal, self.why = signal.SIGINT, str(e) or "a KeyboardInterrupt"

    why = None  # what stopped the run when no signal did (interrupted)

    at = None  # with several processes: the step they all stop after

    def stop(self, step: int) -> bool:
        """Whether to stop after `step`: at once with one process. With several, a signal reaches one host, and
        they must all stop after the same step (the save is collective): the first process signalled names a step
        a few ahead in the coordination service (zoo.training.peers), and each stops there."""
        if not peers.several():
            return self.signal is not None
        if self.at is None:
            self.at = peers.stop_step(step + 3 if self.signal is not None else None)
        return self.at is not None and step >= self.at

    @property
    def stopped(self) -> bool:
        return self.signal is not None or self.at is not None

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


class Stopped(KeyboardInterrupt):
    """SIGTERM or Ctrl-C outside the loop (`stops_at_once`: converting a base, building the data, compiling the
    state's init): raised where the program is, so every cleanup on the way out runs. A KeyboardInterrupt, so
    code that lets Ctrl-C through lets it through; `signum` is the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stops_at_once():
    """While this holds, SIGTERM and SIGINT raise Stopped (at once, where the program is) instead of ending the
    process with no word (SIGTERM's default); inside it the loop's Stopper saves first instead."""
    def handle(signum, frame):
        raise Stopped(signum)
    old = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, handle)
    except ValueError:  # not the main thread: no handlers
        pass
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
