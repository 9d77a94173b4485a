"""Test setup: 8 emulated CPU devices (set before jax is imported), shared tiny configs."""

import os

# 8 emulated CPU devices; LLVM's optimisation at level 1 instead of XLA:CPU's 2 (the processes the tests start
# inherit both). The suite's programs are tiny models' initialisations and steps, compiled once and run a few
# times: level 1 compiles them 10-25% faster (tests/train/test_invariants.py: 130 -> 101 s of compiling), runs
# them as fast (zoo-bench gpt_train --shapes cpu: 3201 vs 3174 tokens/s) and computes the same operations, with
# float results that may differ from level 2's in the last bits. Every comparison in the suite is between runs of
# the same session or within a tolerance; a user's runs keep XLA's defaults.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
                           " --xla_backend_optimization_level=1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402
import gc  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

from tests.helpers import shared, time_profile, tiny_configs  # noqa: E402
from tests.helpers.runs import run  # noqa: E402
from zoo.train import checkpoint  # noqa: E402


# Python's cyclic garbage collector at its defaults spent 4.6% of a worker's time (test_lora + test_trainer: 8.3 of
# 181 s, 6.7 s of it in full collections that walk every object jax, flax and torch made at import). The objects
# alive now are left out of every collection (freeze) and collections run less often: 1.5 s, and the same peak
# memory (1.27 vs 1.29 GB). Garbage without cycles is freed at once either way.
gc.freeze()
gc.set_threshold(10_000, 20, 20)

_PROFILE = time_profile.install()  # ZOO_TEST_PROFILE=FILE: where each test's time goes


def pytest_runtest_logreport(report):
    if _PROFILE and getattr(report, "node", None) is None:  # the worker's report, not its copy on xdist's controller
        time_profile.record(_PROFILE, report)


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
    """JAX's persistent compilation cache, one per test session, shared by the xdist workers and every process
    a test starts (through the environment): a program two tests compile (the same tiny model in another
    test, a CLI subprocess after an in-process run) is compiled once. Under the session's temporary
    directory, so each session starts cold and nothing outlives pytest's own cleanup."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # .../pytest-N/popen-gw0: the workers share .../pytest-N
        root = root.parent
    path = root / "jax-compile-cache"
    path.mkdir(exist_ok=True)
    settings = {"jax_compilation_cache_dir": str(path), "jax_persistent_cache_min_compile_time_secs": 0,
                "jax_persistent_cache_min_entry_size_bytes": -1}
    for name, value in settings.items():
        jax.config.update(name, value)
        os.environ[name.upper()] = str(value)
    yield path


@pytest.fixture
def one_device(monkeypatch):
    """Processes started in this test (zoo-bench's workers) see one CPU device, as a user's run does: the
    session's device-count flag is left out of the XLA_FLAGS they inherit. (Eight emulated devices on two
    loaded cores make a benchmark step an all-reduce among eight threads that can outwait XLA's 40 s
    rendezvous and abort.)"""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    monkeypatch.setenv("XLA_FLAGS", " ".join(flags))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One token-store cache for the whole session: the built-in corpus is tokenized once."""
    return str(tmp_path_factory.mktemp("zoo_cache"))


@pytest.fixture
def tiny_cfg(cache_dir):
    """A GPT small enough to train a few steps in about a second, with dropout on."""
    return tiny_configs.gpt_lm(cache_dir)


@pytest.fixture
def s2s_cfg(cache_dir):
    """A 1+1-layer encoder-decoder on the offline task, dropout and label smoothing on."""
    return tiny_configs.seq2seq(cache_dir)


@pytest.fixture(scope="session")
def learned_seq2seq(tmp_path_factory):
    """(cfg, params, workdir) of a 2+2-layer, width-64 model trained on the short phrases of the offline
    task: trained once a session (by whichever worker asks first), for the task's learning test, the
    translate CLI's tests and zoo-eval's."""
    cfg = tiny_configs.seq2seq_learnable(str(shared.session_root(tmp_path_factory) / "learned-cache"))
    path = shared.once(tmp_path_factory, "learned", lambda p: run(cfg, p / "run", devices=jax.devices()[:1]))
    _, params, _, _ = checkpoint.load_run(str(path / "run"), "seq2seq")
    return cfg, params, str(path / "run")


def replace(cfg, **sections):
    """cfg with some fields of some sections replaced: replace(cfg, train=dict(steps=3))."""
    return dataclasses.replace(cfg, **{k: dataclasses.replace(getattr(cfg, k), **v) for k, v in sections.items()})
