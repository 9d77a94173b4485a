"""zoo-serve's graceful shutdown. At SIGTERM or Ctrl-C the server stops admitting (a new request to /v1/ is answered
503 in OpenAI's shape, zoo.serve.operations) but goes on listening, decoding and streaming until the requests it is
answering have finished or `timeout` seconds (--shutdown-timeout) have passed; then it cuts those left (one line
says how many; each is answered 503, or its stream ends without [DONE]) and uvicorn shuts down as it always does. A
second signal cuts them at once.
The command then exits 0: `run` keeps uvicorn from raising the signal again once it has stopped (a SIGTERM raised
again would kill the process, exit status -15)."""

from __future__ import annotations

import signal
import time
from typing import Callable

import uvicorn

from zoo.serve.operations import Drain, say, tag_uvicorn_logs


class Server(uvicorn.Server):
    """uvicorn's server, stopping as the module's docstring says: the first signal begins draining `drain`, each tick
    (0.1 s) checks whether it is done or late; a second signal cuts what runs, a third Ctrl-C uvicorn's forced exit."""

    def __init__(self, config: uvicorn.Config, drain: Drain, timeout: float, log: Callable = say):
        super().__init__(config)
        tag_uvicorn_logs()  # uvicorn.Config configured its loggers: a request's lines carry its id from now on
        self.drain, self.timeout, self.log = drain, timeout, log
        self._told = self._done = False

    def handle_exit(self, sig, frame) -> None:  # in the signal handler: flags only, the lines come at the next tick
        if self.drain.since is None:
            self.drain.since = time.monotonic()
            self._captured_signals.append(sig)
        else:
            super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        d = self.drain
        if d.since is not None and not self._done:
            if not self._told:
                self._told = True
                self.log("stopping: new requests are answered 503" + (
                    f"; {d.running} running may take up to {self.timeout:g} s to finish (--shutdown-timeout; a "
                    f"second signal cuts them)" if d.running else ""))
            late = time.monotonic() - d.since >= self.timeout
            if d.running == 0 or late or self.should_exit:
                if d.running:
                    why = "at a second signal" if self.should_exit else f"at the {self.timeout:g} s deadline"
                    n = d.cut_all()
                    self.log(f"cut {n} running request{'s' * (n != 1)} {why} (--shutdown-timeout)")
                self._done = self.should_exit = True
        return await super().on_tick(counter)


def run(server: Server, sock) -> None:
    """server.run on `sock`, the signal that stopped it swallowed (uvicorn raises it again once stopped)."""
    quiet = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for s, handler in quiet.items():
            signal.signal(s, handler)
