"""Starting JAX's multi-controller runtime (`jax.distributed`) for a command that computes, before any other jax
call, the way Levanter and MaxText do: the same command runs on every host and they find each other.

It starts when
- flags say so: `--coordinator HOST:PORT --num-processes N --process-id I`;
- or the environment does: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID (all three);
- or jax detects a cluster of more than one process by itself (SLURM, Open MPI, a TPU pod slice, Kubernetes):
  `jax.distributed.initialize()` with no arguments, jax's own detection.
Otherwise a single process runs as it always did. On CPU the collectives between processes go through gloo.

`train.distributed_timeout` (seconds, default 300) bounds the wait for every peer to arrive at the start, and
the wait for a lost peer to be noticed (the coordination service's heartbeat timeout): past it the command
ends with one `error:` line naming the coordinator or the lost process, never hanging in a collective.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time

from zoo.errors import ConfigError

ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
DEFAULT_TIMEOUT = 300


class DistributedError(RuntimeError):
    """The processes of a multi-process run could not start together, or one of them was lost."""


def add_arguments(ap) -> None:
    g = ap.add_argument_group("several processes (jax.distributed; started by itself on SLURM, Open MPI and TPU pods)")
    g.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address, the same on every process "
                                                               "(default: JAX_COORDINATOR_ADDRESS, or one process)")
    g.add_argument("--num-processes", type=int, metavar="N", help="how many processes run the command (default: "
                                                                  "JAX_NUM_PROCESSES, or one)")
    g.add_argument("--process-id", type=int, metavar="I", help="this process's index, 0 .. N-1, 0 on HOST (default: "
                                                               "JAX_PROCESS_ID)")


def _explicit(a) -> dict | None:
    """coordinator_address / num_processes / process_id from flags, else the JAX_* environment, or None."""
    flags = {"coordinator_address": getattr(a, "coordinator", None), "num_processes": getattr(a, "num_processes", None),
             "process_id": getattr(a, "process_id", None)}
    if all(v is None for v in flags.values()) and any(os.environ.get(k) for k in ENV):
        flags = dict(zip(flags, (os.environ.get(k) for k in ENV)))
    if all(v is None for v in flags.values()):
        return None
    names = {"coordinator_address": "--coordinator / JAX_COORDINATOR_ADDRESS",
             "num_processes": "--num-processes / JAX_NUM_PROCESSES", "process_id": "--process-id / JAX_PROCESS_ID"}
    missing = [names[k] for k, v in flags.items() if v is None]
    if missing:
        raise ConfigError(f"several processes need all three of --coordinator, --num-processes and --process-id (or "
                          f"the JAX_* variables); missing: {', '.join(missing)}")
    try:
        n, i = int(flags["num_processes"]), int(flags["process_id"])
    except ValueError:
        raise ConfigError(f"--num-processes={flags['num_processes']!r} and --process-id={flags['process_id']!r} must "
                          f"be whole numbers") from None
    if n < 1 or not 0 <= i < n:
        raise ConfigError(f"--process-id {i} must be in 0..{n - 1} for --num-processes {n}")
    host, _, port = str(flags["coordinator_address"]).rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--coordinator={flags['coordinator_address']!r} must be HOST:PORT (process 0's address)")
    return {"coordinator_address": str(flags["coordinator_address"]), "num_processes": n, "process_id": i}


def _detected() -> bool:
    """Whether jax's own cluster detection finds a cluster of more than one process (SLURM, Open MPI, TPU, K8s)."""
    try:
        from jax._src import clusters
        found = [c for c in clusters.ClusterEnv._cluster_types if c.is_env_present()]
    except Exception:  # jax moved its detection: only flags and the environment start the runtime
        return False
    if not found:
        return False
    for name in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):  # a cluster of one process stays single
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name]) > 1
    return True


def timeout_of(a, set_args=(), config_path: str | None = None, workdir: str | None = None) -> int:
    """train.distributed_timeout without jax: from --set, the config file, or the resumed run's config.json."""
    for item in reversed(list(set_args)):
        key, _, value = item.partition("=")
        if key.strip() == "train.distributed_timeout":
            try:
                return int(float(value))
            except ValueError:
                raise ConfigError(f"train.distributed_timeout={value!r} must be a number of seconds") from None
    try:
        if workdir and os.path.isfile(os.path.join(workdir, "config.json")):
            with open(os.path.join(workdir, "config.json")) as f:
                return int(json.load(f).get("train", {}).get("distributed_timeout", DEFAULT_TIMEOUT))
        if config_path:
            from zoo.config import load_config_file
            return int(load_config_file(config_path).train.distributed_timeout)
    except Exception:  # a bad config is reported by the command itself, once the processes are up
        pass
    return DEFAULT_TIMEOUT


def plan(a) -> str | None:
    """What `start` would do, in one line, without starting anything (train.py --print-config prints it, so a
    launch script is checked dry): None for a single process."""
    args = _explicit(a)
    if args:
        return (f"jax.distributed: process {args['process_id']} of {args['num_processes']}, coordinator "
                f"{args['coordinator_address']} (flags or JAX_* variables)")
    if not _detected():
        return None
    try:
        from jax._src import clusters
        env = next(c for c in clusters.ClusterEnv._cluster_types if c.is_env_present())
        where = env.get_coordinator_address(None, None) if env.name != "gketpu" else "the first TPU worker"
        return (f"jax.distributed: process {env.get_process_id()} of {env.get_process_count()}, coordinator {where} "
                f"(detected by jax: {env.name})")
    except Exception as e:  # a cluster whose details need its metadata server (a TPU VM): jax finds them there
        return f"jax.distributed: a cluster detected by jax, its details read at start ({type(e).__name__})"


def wanted(a) -> bool:
    """Whether this command runs as one of several processes (flags, environment or a detected cluster); bad
    flags -> ConfigError."""
    return _explicit(a) is not None or _detected()


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
        print(f"error: {said}: {'not every process came' if not args or args['process_id'] == 0 else 'the coordinator did not answer, or not every process came'}; "
              f"{hint_}", file=sys.stderr, flush=True)
        os._exit(2)

    timer = threading.Timer(timeout, late)
    timer.daemon = True
    timer.start()
    try:
        jax.distributed.initialize(**(args or {}), initialization_timeout=int(timeout) + 10,
                                   heartbeat_timeout_seconds=int(timeout))
    except Exception as e:
        _forget()  # nothing for jax's exit hook to shut down (it would print a second error)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DistributedError(f"{said}: {first[:300]}; {hint_}") from None
    finally:
        timer.cancel()
    global _limit
    _limit = max(2.0, timeout / 2)  # under jax's own heartbeat timeout (its verdict is a fatal abort)
    threading.Thread(target=_watch, name="zoo-peers", daemon=True).start()
    atexit.register(finished)
    return True


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


def _lost(peers: list[int], why: str) -> None:
    import jax
    print(f"error: lost process {', '.join(map(str, peers))} of {jax.process_count()} ({why}); every process "
          f"stops{'. ' + hint if hint else ''}", file=sys.stderr, flush=True)
    os._exit(2)


def _watch() -> None:
    import jax
    from jax._src import distributed
    me, n = jax.process_index(), jax.process_count()
    seen: dict[int, tuple] = {}
    while True:
        client = distributed.global_state.client
        if client is None:
            return
        try:
            client.key_value_increment(f"zoo/beat/{me}", 1)
            beats = dict(client.key_value_dir_get("zoo/beat/"))
            done = {k for k, _ in client.key_value_dir_get("zoo/done/")}
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
    """Process 0, ending early (a refused run): wait until every other process has ended too (its `finished`
    mark), at most `timeout` seconds. Process 0 holds the coordination service; leaving first, a peer still
    on its way out (its own one error line said) would be aborted by jax with a C++ stack trace."""
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
