"""Several processes of one zoo command on a local coordinator (127.0.0.1), as hosts of a multi-host job would
run it: tests/train/test_multihost.py, tests/eval/test_eval_multihost.py; a test's config as a config file; and
a long training run in a process of its own (`train_alone`)."""

import os
import pathlib
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def config_file(cfg, tmp_path) -> str:
    """A config file (`get_config()`) that returns `cfg`, for commands that take one: written in tmp_path."""
    (tmp_path / "cfg.json").write_text(cfg.to_json())
    path = tmp_path / "cfg.py"
    path.write_text(f"from zoo.configuration import load_json\n\ndef get_config():\n    return load_json({str(tmp_path / 'cfg.json')!r})\n")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, n=2, port=None, only=None, devices=4, command=("train.py",)):
    """`python train.py ARGS` (or `python COMMAND ARGS`) as process i of n (all of them, or only those in `only`)
    on a local coordinator, each with `devices` CPU devices."""
    port = port or free_port()
    # As a user's shell has it: without TF_CPP_MIN_LOG_LEVEL the command sets 3 (XLA's C++ log lines off); the
    # suite's 1 is what `import jax` put here, and lets jax's error lines about a lost peer in beside zoo's own.
    env = {k: v for k, v in environment(devices).items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return [subprocess.Popen([sys.executable, *command, *args, "--coordinator", f"127.0.0.1:{port}",
                              "--num-processes", str(n), "--process-id", str(i)], cwd=ROOT, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for i in range(n) if only is None or i in only]


# The suite's flags that buy faster compiles with slower code (tests/conftest.py): left out of a child given a level.
FAST_COMPILE = ("--xla_backend_optimization_level", "--xla_cpu_use_fusion_emitters",
                "--xla_cpu_parallel_codegen_split_count")


def environment(devices: int, level: int | None = None) -> dict:
    """This process's environment for a child with `devices` CPU devices, compiling at XLA:CPU's LLVM
    optimisation level `level` with XLA's own emitters (a run long enough for its code's speed to count: the
    1600 steps of learned_seq2seq took 98 s with the suite's fusion emitters off, 64 s with them on); None: the
    suite's flags, which it inherits."""
    drop = ("--xla_force_host_platform",) + (FAST_COMPILE if level is not None else ())
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(drop)]
    flags += [f"--xla_force_host_platform_device_count={devices}"]
    flags += [f"--xla_backend_optimization_level={level}"] if level is not None else []
    return {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}


def train_alone(cfg, workdir, level: int | None = None) -> None:
    """`python train.py` on `cfg` into `workdir`, in a process of its own with one CPU device, compiling at
    XLA:CPU's level `level`; its stderr's end in the error if it fails."""
    path = config_file(cfg, pathlib.Path(workdir).parent)  # beside the workdir
    p = subprocess.run([sys.executable, "train.py", path, "--workdir", str(workdir)], cwd=ROOT,
                       env=environment(1, level), capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"train.py {path} exited with {p.returncode}: {p.stderr[-3000:]}")


def finish(procs, timeout=300):
    """(stdout, stderr) of each process, without the lines gloo itself prints ("[Gloo] Rank 1 is connected ...")."""
    # gloo's C++ writes can be cut mid-line ("...Rank " / "7 is connected to 7 peer ranks. ..."): both halves go.
    drop = lambda text: "".join(l for l in text.splitlines(keepends=True)  # noqa: E731
                                if "[Gloo]" not in l and "peer ranks" not in l)
    return [tuple(map(drop, p.communicate(timeout=timeout))) for p in procs]
