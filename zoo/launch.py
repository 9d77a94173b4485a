"""How a command is asked to run as one of several processes, read before any jax call (split out of
zoo.distributed, which imports these names, so callers keep reading them there; it starts the runtime).

Several processes are asked for when
- flags say so: `--coordinator HOST:PORT --num-processes N --process-id I` (`add_arguments`);
- or the environment does: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID (all three);
- or jax detects a cluster of more than one process by itself (SLURM, Open MPI, a TPU pod slice, Kubernetes).
`wanted` says whether they are, `plan` what zoo.distributed.start would do (one line, nothing started),
`timeout_of` reads train.distributed_timeout without jax, and `port_free` checks, on process 0, that the
coordinator's port is free before the coordination service binds it. A start that cannot be made raises
`DistributedError`.
"""

from __future__ import annotations

import errno
import json
import os
import socket

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


def _clusters_found() -> list:
    """The clusters jax's own detection would pick from, in its order: opt-in-only ones (mpi4py, present wherever
    the package is installed, as on an NVIDIA image) are left out, as jax.distributed.initialize leaves them out."""
    from jax._src import clusters
    return [c for c in clusters.ClusterEnv._cluster_types
            if not getattr(c, "opt_in_only_method", False) and c.is_env_present()]


def _detected() -> bool:
    """Whether jax's own cluster detection finds a cluster of more than one process (SLURM, Open MPI, TPU, K8s)."""
    try:
        found = _clusters_found()
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
            from zoo.overrides import load_config_file
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
        env = _clusters_found()[0]
        where = env.get_coordinator_address(None, None) if env.name != "gketpu" else "the first TPU worker"
        return (f"jax.distributed: process {env.get_process_id()} of {env.get_process_count()}, coordinator {where} "
                f"(detected by jax: {env.name})")
    except Exception as e:  # a cluster whose details need its metadata server (a TPU VM): jax finds them there
        return f"jax.distributed: a cluster detected by jax, its details read at start ({type(e).__name__})"


def wanted(a) -> bool:
    """Whether this command runs as one of several processes (flags, environment or a detected cluster); bad
    flags -> ConfigError."""
    return _explicit(a) is not None or _detected()


def port_free(address: str) -> None:
    """Process 0, before it starts the coordination service: its port is free on this host (jax binds
    JAX_COORDINATOR_BIND_ADDRESS, default every address, [::]:PORT). Taken by another program, jax's gRPC server
    fails to start there, with a segfault or a C++ error; this says so in one line (DistributedError)."""
    port = int(address.rpartition(":")[2])
    bind = os.environ.get("JAX_COORDINATOR_BIND_ADDRESS", "")
    host = bind.rpartition(":")[0].strip("[]") if bind else ""
    tries = [(socket.AF_INET6, host or "::"), (socket.AF_INET, host or "0.0.0.0")]
    for family, where in tries if ":" in host or not host else tries[1:]:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                # as gRPC binds: a port left in TIME_WAIT by an earlier run is free; one a program listens on is not
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too, as [::] does
                s.bind((where, port))
            return
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                why = "is in use by another program" if e.errno == errno.EADDRINUSE else "needs root (below 1024)"
                raise DistributedError(f"the coordinator's address {address}: port {port} {why} on this host, so "
                                       f"process 0 cannot serve there; pick a free port with --coordinator "
                                       f"HOST:PORT (or JAX_COORDINATOR_ADDRESS), the same on every process") from None
            # no IPv6 on this host (EAFNOSUPPORT, EADDRNOTAVAIL): the IPv4 try decides; any other error jax meets
