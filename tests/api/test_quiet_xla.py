"""A Python script that imports only zoo sees none of XLA's C++ log lines (zoo.runtime.quiet_xla: the commands'
TF_CPP_MIN_LOG_LEVEL=3, set at the first use of a zoo name that imports jax, where jax is not imported yet and the
user chose no level); a script that imported jax first, or chose a level, keeps them. XLA_FLAGS' dump directory
under /proc (which cannot hold one) makes each compile log an error line, as a slow compile's alarm would."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JIT = "import jax, jax.numpy as jnp; jax.jit(lambda x: x * 2 + 1)(jnp.ones(3)).block_until_ready()"


def stderr_of(script: str, **env) -> str:
    base = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    base.update(XLA_FLAGS="--xla_dump_to=/proc/zoo-no-such-dir", JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **env)
    out = subprocess.run([sys.executable, "-c", script], env=base, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_a_script_importing_only_zoo_shows_no_xla_log_line():
    assert "dump.cc" not in stderr_of(f"import zoo; zoo.load; {JIT}")


def test_xla_lines_stay_where_jax_came_first_or_the_user_chose_a_level():
    assert "Could not create directory: /proc/zoo-no-such-dir" in stderr_of(f"import jax, zoo; zoo.load; {JIT}")
    assert "dump.cc" in stderr_of(f"import zoo; zoo.load; {JIT}", TF_CPP_MIN_LOG_LEVEL="0")
