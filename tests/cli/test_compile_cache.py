"""A command's compiled programs are kept in zoo's cache (zoo.runtime) and read back by the next command:
zoo-sample twice on one run compiles its generation loop once; ZOO_COMPILE_CACHE=0 keeps nothing; a cache the
user chose (JAX_COMPILATION_CACHE_DIR) is the one used."""

import os
import subprocess
import sys

from tests.helpers import processes
from tests.helpers.shared_runs import finished_gpt_fixture  # noqa: F401

SAMPLE = ["-m", "zoo.cli.sample", "--prompt", "The", "--max-new-tokens", "8", "--temperature", "0"]


def sample(run, cache, **env):
    base = {k: v for k, v in processes.environment(1).items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env = {**base, "ZOO_CACHE_DIR": str(cache), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_LOG_COMPILES": "1", **env}
    p = subprocess.run([sys.executable, SAMPLE[0], SAMPLE[1], run, *SAMPLE[2:]], cwd=processes.ROOT, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    return p


def hits(p) -> list[str]:
    """The programs read from the persistent cache (jax's log: `Persistent compilation cache hit for 'NAME'`)."""
    return [line.split("'")[1] for line in p.stderr.splitlines() if "Persistent compilation cache hit for" in line]


def test_the_second_command_reads_the_first_ones_programs(finished_gpt, tmp_path):
    first = sample(finished_gpt, tmp_path / "c")
    assert os.listdir(tmp_path / "c" / "jax") and not hits(first)
    second = sample(finished_gpt, tmp_path / "c")
    assert second.stdout == first.stdout and "jit__generate" in hits(second)


def test_it_can_be_turned_off_and_a_users_cache_wins(finished_gpt, tmp_path):
    sample(finished_gpt, tmp_path / "off", ZOO_COMPILE_CACHE="0")
    assert not os.path.exists(tmp_path / "off" / "jax")
    sample(finished_gpt, tmp_path / "z", JAX_COMPILATION_CACHE_DIR=str(tmp_path / "mine"))
    assert os.listdir(tmp_path / "mine") and not os.path.exists(tmp_path / "z" / "jax")
