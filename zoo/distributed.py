"""Starting JAX's multi-controller runtime (`jax.distributed`) for a command that computes, before any other jax
call, the way Levanter and MaxText do: the same command runs on every host and they find each other.

What asks for it (flags, the JAX_* environment, jax's own cluster detection), the dry-run `plan`,
train.distributed_timeout read without jax (`timeout_of`) and the coordinator's port check (`port_free`) are
zoo.launch; their names are imported here too, so callers keep reading them from this module. `start` starts the
runtime when they ask for it (with no flags and no environment, `jax.distributed.initialize()` with no arguments,
jax's own detection); otherwise a single process runs as it always did. On CPU the collectives between processes
go through gloo.

`train.distributed_timeout` (seconds, default 300) bounds the wait for every peer to arrive at the start, and
the wait for a lost peer to be noticed (the coordination service's heartbeat timeout): past it the command
ends with one `error:` line naming the coordinator or the lost process, never hanging in a collective.
What else ends a start or a run of several processes in one line, on every process that is left:
- a coordinator's port that another program holds: process 0 checks it before it starts the coordination
  service (whose gRPC server would fail there with a segfault or a C++ error);
- processes given different settings (`--set`, config files, --workdir): `agree` compares them right after the
  start, before anything is built (another optim.lr would train two different runs silently, another
  model.d_model abort in gloo);
- process 0 (the coordinator) lost: jax's coordination client notices within a second (its polling RPC fails)
  and by default aborts with a C++ stack trace; zoo's `_fatal` says the one line instead (how, on jaxlib 0.10:
  above `_fatal`). A lost process other than 0 is named by zoo's own watchdog (`_watch`), within half the timeout;
  should jax's heartbeat verdict come first (a busy host holding the watchdog up), `_fatal` names the process the
  watchdog last saw go quiet, in the same line;
- a collective cut short by a lost peer (gloo's C++ exception, uncaught in XLA's thread): `_broken` names the
  peer the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import socket
import sys
import threading
import time

from zoo.errors import ConfigError
from zoo.launch import (  # noqa: F401 (ENV ... wanted: read from here by others)
    DEFAULT_TIMEOUT, ENV, DistributedError, _clusters_found, _detected, _explicit, add_arguments, plan, port_free,
    timeout_of, wanted)


def start(a, timeout: int = DEFAULT_TIMEOUT) -> bool:
    """Start jax.distributed if flags, the environment or a detected cluster ask for it; whether it started.
    Call before any other jax call."""
    args = _explicit(a)
    if args is None and not _detected():
        return False
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes reach each other over TCP
    where = args["coordinator_address"] if args else "the coordinator jax detected"
    who = f"process {args['process_id']} of {args['num_processes']}" if args else "this process"
    said = (f"{who} could not start with its peers at {where} within {timeout} s (train.distributed_timeout)")
    hint_ = "run the same command on every host, --process-id 0 on the coordinator's host"

    def late():  # jax's own verdict, a few seconds later, is a fatal abort with a C++ stack trace
        why = ("not every process came" if not args or args["process_id"] == 0 else
               "the coordinator did not answer, or not every process came")
        print(f"error: {said}: {why}; {hint_}", file=sys.stderr, flush=True)
        os._exit(2)

    if args and args["process_id"] == 0:
        port_free(args["coordinator_address"])
    timer = threading.Timer(timeout, late)
    timer.daemon = True
    timer.start()
    try:
        with _fatal_errors_said():
            jax.distributed.initialize(**(args or {}), initialization_timeout=int(timeout) + 10,
                                       heartbeat_timeout_seconds=int(timeout))
    except Exception as e:
        _forget()  # nothing for jax's exit hook to shut down (it would print a second error)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DistributedError(f"{said}: {first[:300]}; {hint_}") from None
    finally:
        timer.cancel()
    global _limit
    _limit = max(2.0, timeout / 2)  # under jax's own heartbeat timeout (whose verdict names no one: `_fatal`)
    threading.Thread(target=_watch, name="zoo-peers", daemon=True).start()
    atexit.register(finished)
    return True


# ---- processes given different settings: refused at the start, in one line on every process ----
AGREE = "zoo/agree"


def agree(settings: dict, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Every process runs the same settings (`settings`: flat, JSON-able, e.g. the resolved config's
    "section.field" keys and the workdir): process 0 publishes its own in the coordination service's key-value
    store, each other process compares its own with them and publishes its verdict, and process 0 reads every
    verdict. A difference raises ConfigError naming the keys and the values on each side, on process 0 (every
    difference) and on each process that differs (its own); the others go on to the run's own end. With one
    process, nothing."""
    from jax._src import distributed
    client, me, n = distributed.global_state.client, distributed.global_state.process_id, \
        distributed.global_state.num_processes
    if client is None or n < 2:
        return
    wait_ms = int(timeout * 1000)
    try:
        if me == 0:
            client.key_value_set(f"{AGREE}/0", json.dumps(settings, sort_keys=True, default=str))
            verdicts = [client.blocking_key_value_get(f"{AGREE}/verdict/{p}", wait_ms) for p in range(1, n)]
        else:
            theirs = json.loads(client.blocking_key_value_get(f"{AGREE}/0", wait_ms))
            mine = json.loads(json.dumps(settings, sort_keys=True, default=str))  # as process 0's went through JSON
            verdicts = [_differences(theirs, mine, me)]
            client.key_value_set(f"{AGREE}/verdict/{me}", verdicts[0])
    except Exception as e:  # a peer that never answers: lost (the watchdog names it) or stuck
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise DistributedError(f"process {me} of {n} could not compare its settings with the other processes' "
                               f"within {timeout:.0f} s (train.distributed_timeout): {first}") from None
    said = [v for v in verdicts if v]
    if said:
        raise ConfigError(f"the processes were given different settings: {'; '.join(said)}; run the same command "
                          f"on every process (the same config, --set and --workdir; only --process-id differs)")


_MISSING = object()


def _differences(theirs: dict, mine: dict, me: int, most: int = 4) -> str:
    """'' if equal, else 'model.d_model is 64 on process 0 and 32 on process 1, ...' (at most `most` keys)."""
    def show(v) -> str:
        text = "(none)" if v is _MISSING else json.dumps(v)
        return text if len(text) <= 60 else text[:57] + "..."
    keys = [k for k in sorted(set(theirs) | set(mine)) if theirs.get(k, _MISSING) != mine.get(k, _MISSING)]
    parts = [f"{k} is {show(theirs.get(k, _MISSING))} on process 0 and {show(mine.get(k, _MISSING))} on process {me}"
             for k in keys[:most]]
    return ", ".join(parts) + (f" (and {len(keys) - most} more keys)" if len(keys) > most else "")


# ---- a lost peer: one line, every process stops ----
# Each process bumps its counter in the coordination service's key-value store every BEAT_S seconds and watches
# the others'. A counter still for half of train.distributed_timeout means a process is gone (kill -9, a host
# down): this process prints one error line naming it and exits, before jax's own heartbeat (the full timeout)
# would abort it with a C++ stack trace. A process that ended normally says so first and is not missed.
BEAT_S = 1.0
_limit = DEFAULT_TIMEOUT / 2
hint = ""  # what to do next, set by the command (e.g. the --resume line)


def _forget() -> None:
    try:
        from jax._src import distributed
        distributed.global_state.client = distributed.global_state.service = None
    except Exception:
        pass


_leaving = threading.Lock()  # the watchdog and jax's fatal-error path may both see a loss: the first one says it


def _lost(peers: list[int], why: str) -> None:
    from jax._src import distributed
    n = distributed.global_state.num_processes  # not jax.process_count(): callable before the backend starts
    _leave(f"error: lost process {', '.join(map(str, peers))} of {n} ({why}); every process stops"
           f"{'. ' + hint if hint else ''}")


def _leave(line: str) -> None:
    if _leaving.acquire(blocking=False):
        os.write(2, (line + "\n").encode())  # not sys.stderr: its lock may be held by the thread this one ends
        os._exit(2)
    time.sleep(3600)  # another thread is saying it and exiting


# ---- jax's own fatal errors: one line instead of an abort with a C++ stack trace ----
# jax's coordination client, on a fatal error (process 0's service gone: its polling RPC fails within a second of
# a kill -9; or the service reporting a lost peer), calls its missed_heartbeat_callback, by default a fatal abort
# with a C++ stack trace. jax.distributed.initialize passes none of its own; zoo passes `_fatal`. jaxlib 0.10
# cannot hand it the status (absl::Status has no Python type: std::bad_cast, thrown in the client's thread
# before Python runs, so std::terminate), so zoo's terminate handler takes a bad_cast as that call. A jaxlib that
# does call `_fatal` lands in the same place; any other uncaught C++ exception keeps the C++ runtime's report.


def _fatal(status=None) -> None:
    """The coordination client's fatal error (its status, or None through std::terminate): process 0 lost when
    its service no longer answers, else the service's own verdict (a peer lost); one line, exit 2."""
    from jax._src import distributed
    state = distributed.global_state
    text = "" if status is None else str(status)
    task = re.search(r"/task:(\d+)", text)  # a peer the service names ("/job:jax_worker/replica:0/task:1")
    if state.process_id != 0 and ("Failed to send RPC" in text or not _answers(state.coordinator_address)):
        _lost([0], "the coordinator no longer answers")
    if task:
        _lost([int(task.group(1))], "jax's coordination service lost it")
    quiet = _quiet()
    if quiet:  # the service's heartbeat timeout came before the watchdog's half of it (a busy host): the same line
        _lost(sorted(quiet), f"no heartbeat for {max(quiet.values()):.0f} s: killed, or its host is down")
    first = text.strip().splitlines()[0][:300] if text.strip() else "a process was lost or could not be reached"
    _leave(f"error: jax's coordination service stopped the run ({first}); every process stops"
           f"{'. ' + hint if hint else ''}")


def _answers(address: str | None, for_s: float = 2.0) -> bool:
    """Whether the coordinator's port takes connections for `for_s` seconds on end: a process 0 killed a moment
    ago may still hold its listening socket while the kernel tears it down."""
    host, _, port = (address or "").rpartition(":")
    end = time.monotonic() + for_s
    while time.monotonic() < end:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
        except (OSError, ValueError):
            return False
        time.sleep(0.2)
    return True


# ---- a collective cut short: gloo's exceptions, thrown in XLA's threads, uncaught (std::terminate) ----
# A peer killed mid-collective may close or cut short its TCP stream while this process reads it; gloo then throws
# (an IoException, or an EnforceNotMet when a message came cut: "Received data size doesn't match expected size")
# before the coordination client or the watchdog has seen the peer go. The loss is the likely cause: `_broken`
# asks who is gone as `_fatal` does (the coordinator first), then leaves the watchdog its time (`_limit`) to name a
# peer gone quiet, and only then names gloo's exception (processes running different programs: a collective of
# another size). Seen once in CI: process 0 killed, process 1 aborted in gloo (rc -6, a C++ stack trace).
GLOO = {b"N4gloo9ExceptionE": "gloo::Exception", b"N4gloo11IoExceptionE": "gloo::IoException",
        b"N4gloo13EnforceNotMetE": "gloo::EnforceNotMet",
        b"N4gloo25InvalidOperationExceptionE": "gloo::InvalidOperationException"}


def _broken(what: str) -> None:
    """gloo threw `what` (its exception's type) out of a collective: a lost peer named, else that, in one line."""
    from jax._src import distributed
    state = distributed.global_state
    if state.process_id != 0 and not _answers(state.coordinator_address):
        _lost([0], "the coordinator no longer answers")
    time.sleep(_limit + 2 * BEAT_S)  # the watchdog's thread runs on: past `_limit` of silence it names the peer
    _leave(f"error: a collective between the processes failed ({what}) and no process was seen lost; every "
           f"process stops (do they all run the same program? the same config and zoo){'. ' + hint if hint else ''}")


_handlers: list = []  # the ctypes callbacks std::terminate may call: alive as long as the process


def _on_terminate() -> None:
    """std::terminate's handler (libstdc++): an uncaught std::bad_cast is `_fatal`'s call that jaxlib could not
    make (see above); any other exception goes on to the handler that was there (its report, then abort)."""
    import ctypes
    try:
        cxx = ctypes.CDLL("libstdc++.so.6")
        set_terminate, current = cxx._ZSt13set_terminatePFvvE, cxx.__cxa_current_exception_type
    except (OSError, AttributeError):  # another C++ runtime (macOS's libc++): jax's own abort stays
        return
    set_terminate.restype, set_terminate.argtypes, current.restype = ctypes.c_void_p, [ctypes.c_void_p], ctypes.c_void_p
    previous: list = []

    def handler():
        info = current()  # the std::type_info of the exception in flight; its mangled name follows its vtable
        name = ctypes.c_char_p.from_address(info + ctypes.sizeof(ctypes.c_void_p)).value.lstrip(b"*") if info else b""
        if name == b"St8bad_cast":
            _fatal()
        if name in GLOO:
            _broken(GLOO[name])
        if previous:
            previous[0]()

    _handlers.append(ctypes.CFUNCTYPE(None)(handler))
    before = set_terminate(ctypes.cast(_handlers[-1], ctypes.c_void_p))
    if before:
        previous.append(ctypes.CFUNCTYPE(None)(before))


@contextlib.contextmanager
def _fatal_errors_said():
    """jax.distributed.initialize with `_fatal` as its client's missed_heartbeat_callback, and std::terminate's
    handler set: jax's native module, seen by jax's initialize alone, with the client's maker wrapped."""
    from jax._src import distributed
    real = distributed._jax

    class Native:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def get_distributed_runtime_client(*args, **kw):
            kw.setdefault("missed_heartbeat_callback", _fatal)
            return real.get_distributed_runtime_client(*args, **kw)

    _on_terminate()
    distributed._jax = Native()
    try:
        yield
    finally:
        distributed._jax = real


_seen: dict[int, tuple] = {}  # the watchdog's view: peer -> (its counter, when the watchdog saw it change)
_done: set = set()  # the peers that said they ended


def _quiet() -> dict[int, float]:
    """{peer: seconds} of the peers whose counter the watchdog has not seen move for over 2 beats, when that tells
    which are gone: jax's verdict (through `_fatal`) names no one on jaxlib 0.10. Every peer quiet (the watchdog
    itself held up) tells nothing, unless there is one peer."""
    now = time.monotonic()
    ages = {p: now - t for p, (_, t) in list(_seen.items()) if f"zoo/done/{p}" not in _done}
    quiet = {p: a for p, a in ages.items() if a > 2 * BEAT_S}
    return quiet if quiet and (len(quiet) < len(ages) or len(ages) == 1) else {}


def _watch() -> None:
    import jax
    from jax._src import distributed
    me, n = jax.process_index(), jax.process_count()
    seen = _seen
    while True:
        client = distributed.global_state.client
        if client is None:
            return
        try:
            client.key_value_increment(f"zoo/beat/{me}", 1)
            beats = dict(client.key_value_dir_get("zoo/beat/"))
            done = {k for k, _ in client.key_value_dir_get("zoo/done/")}
            _done.update(done)
        except Exception:
            if distributed.global_state.client is None:
                return
            _lost([0], "the coordinator no longer answers")
        now = time.monotonic()
        for p in range(n):
            if p == me or f"zoo/done/{p}" in done:
                continue
            v = beats.get(f"zoo/beat/{p}")
            if seen.get(p, (object(),))[0] != v:
                seen[p] = (v, now)
            elif now - seen[p][1] > _limit:
                _lost([p], f"no heartbeat for {_limit:.0f} s: killed, or its host is down")
        time.sleep(BEAT_S)


def finished() -> None:
    """This process ended (well or with its own error): its peers stop watching it."""
    try:
        import jax
        from jax._src import distributed
        if distributed.global_state.client is not None:
            distributed.global_state.client.key_value_set(f"zoo/done/{jax.process_index()}", "1", allow_overwrite=True)
    except Exception:
        pass


def linger(timeout: float = 60.0) -> None:
    """Process 0, ending (a finished, stopped or refused run): wait until every other process has ended too (its
    `finished` mark), at most `timeout` seconds. Process 0 holds the coordination service; leaving first, a peer
    still on its way out (shutting jax down, or its own one error line said) may be aborted by jax with a C++ stack
    trace, or crash."""
    try:
        import jax
        from jax._src import distributed
        client, n = distributed.global_state.client, jax.process_count()
        end = time.monotonic() + timeout
        while client is not None and time.monotonic() < end:
            done = {k for k, _ in client.key_value_dir_get("zoo/done/")}
            if all(f"zoo/done/{p}" in done for p in range(1, n)):
                return
            time.sleep(0.1)
    except Exception:  # the service is gone already: nothing to wait for
        pass


def settle() -> None:
    """After an unexpected error with several processes (a collective that failed because a peer is gone):
    give the watchdog time to name the lost process and exit; return if none is lost."""
    time.sleep(2 * _limit + 5 * BEAT_S)
