"""Test setup: 8 emulated CPU devices (set before jax is imported), shared tiny configs."""

import os
import sys

# 8 emulated CPU devices; LLVM's optimisation at level 0 instead of XLA:CPU's 2 (the processes the tests start
# inherit both). The suite's programs are tiny models' initialisations and steps, compiled once and run a few
# times: level 0 compiles them faster than level 1, which compiled them 10-25% faster than 2. The whole suite on
# one 2-core machine: 1088 s at level 0, 1160 s at level 1. Their code runs slower (the 1600 steps of
# learned_seq2seq below: 126 vs 58 s), so the few runs long enough to lose more than they gain train in a
# process of their own at level 1 (tests/helpers/processes.train_alone). Level 0 computes the same operations,
# with float results that may differ from level 2's in the last bits: every comparison in the suite is between
# runs of the same session or within a tolerance. zoo.training.run_once's programs (initialisation, checksums) take
# level 0 too (their level 1 is a ceiling); a user's runs keep XLA's defaults.
# XLA:CPU's fusion emitters off (its older elemental emitters) and the LLVM module left in one piece: the suite's
# programs compile ~30% faster (a tiny GPT, BERT and encoder-decoder train step on 1 and 8 devices: 12 s against
# 18 s; test_gpt, test_lora, test_damage_readers, test_parity_decoders and test_config together: 375 s against 436 s),
# computing the same operations (float results may differ in the last bits, as level 0's do).
# A collective among the 8 emulated devices waits for all 8 threads; on two loaded cores one thread can go unscheduled
# for longer than XLA:CPU's 40 s before it aborts the process (a CI worker died so, mid-run, in an all-reduce of
# test_invariants): the suite's own programs wait up to 10 minutes (both flags: jaxlib 0.10 to 0.12 know them).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
                           " --xla_backend_optimization_level=0"
                           " --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
                           " --xla_cpu_collective_call_terminate_timeout_seconds=600"
                           " --xla_cpu_collective_timeout_seconds=600")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu (a test extra, for tests/aot's TPU compiles) quiet on this host without a TPU, before jax can load it.
from zoo import runtime  # noqa: E402 (jax-free)

runtime.quiet_libtpu()
# The commands tests start, and the scripts they start (configs/launch/'s recipes call `python train.py`), run
# this interpreter however the suite was started (`/path/to/venv/bin/python -m pytest` without the venv
# activated: `python` on PATH would be another, or none).
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

import dataclasses  # noqa: E402
import gc  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

from tests.helpers import shared, time_profile, tiny_configs  # noqa: E402
from tests.helpers.processes import train_alone  # noqa: E402
from zoo.training import programs, runs  # noqa: E402


# Python's cyclic garbage collector at its defaults spent 4.6% of a worker's time (test_lora + test_trainer: 8.3 of
# 181 s, 6.7 s of it in full collections that walk every object jax, flax and torch made at import). The objects
# alive now are left out of every collection (freeze) and collections run less often: 1.5 s, and the same peak
# memory (1.27 vs 1.29 GB). Garbage without cycles is freed at once either way.
gc.freeze()
gc.set_threshold(10_000, 20, 20)

_PROFILE = time_profile.install()  # ZOO_TEST_PROFILE=FILE: where each test's time goes


# A skip fails the run. Every package a test needs is in the test extras, so under the README's test command a
# skip can only mean a missing install step (a module that imports a package the extras no longer bring was once
# skipped whole, and CI stayed green with zoo-serve untested). Running the suite without the extras, on purpose:
# ZOO_ALLOW_SKIPS=1 lets the skips stand as skips.
ALLOW_SKIPS = os.environ.get("ZOO_ALLOW_SKIPS") == "1"


def _skip_as_failure(report, where: str) -> None:
    if ALLOW_SKIPS or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"{where} was skipped ({reason}); under the README's test command nothing skips: "
                       f"pip install -e '.[test]' (ZOO_ALLOW_SKIPS=1 lets skips pass)")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    _skip_as_failure(report, collector.nodeid or "a module")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    _skip_as_failure(report, item.nodeid)
    return report


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


@pytest.fixture(scope="module", autouse=True)
def programs_of_this_module():
    """The programs runs keep for the next run of their config (zoo.training.programs) are shared within a module
    only: each module starts with none kept."""
    programs.forget()
    yield


@pytest.fixture(autouse=True)
def programs_around_patches(request):
    """A test that patches (monkeypatch) may patch what a train step traces: it starts with no program kept, and
    what its runs kept goes with it."""
    if "monkeypatch" not in request.fixturenames:
        yield
        return
    programs.forget()
    yield
    programs.forget()


@pytest.fixture(scope="session", autouse=True)
def zoo_cache(tmp_path_factory):
    """zoo's cache (ZOO_CACHE_DIR: converted checkpoints, the CPU's measured peak), one per test session, shared by the workers and the
    processes tests start: a GGUF file zoo.load reads is converted once a session (tests/helpers/shared_runs.py
    puts the session's SmolLM2 conversion there), and no test writes into the user's ~/.cache/zoo."""
    path = shared.session_root(tmp_path_factory) / "zoo-cache"
    path.mkdir(exist_ok=True)
    os.environ["ZOO_CACHE_DIR"] = str(path)
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
    translate CLI's tests and zoo-eval's. Its 1600 steps run by train.py in a process of their own, at LLVM
    level 1: 58 s, where the suite's level 0 took 126."""
    cfg = tiny_configs.seq2seq_learnable(str(shared.session_root(tmp_path_factory) / "learned-cache"))
    path = shared.once(tmp_path_factory, "learned", lambda p: train_alone(cfg, p / "run", level=1))
    _, params, _, _ = runs.load_run(str(path / "run"), "seq2seq")
    return cfg, params, str(path / "run")


def replace(cfg, **sections):
    """cfg with some fields of some sections replaced: replace(cfg, train=dict(steps=3))."""
    return dataclasses.replace(cfg, **{k: dataclasses.replace(getattr(cfg, k), **v) for k, v in sections.items()})
