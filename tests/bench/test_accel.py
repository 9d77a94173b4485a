"""zoo.accel: XLA's GPU flags appended to the user's XLA_FLAGS by the entry points, only for a GPU target."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zoo import accel

ROOT = Path(__file__).resolve().parents[2]
GPU = {"JAX_PLATFORMS": "cuda"}


@pytest.mark.parametrize("env,hint,gpu", [
    ({"JAX_PLATFORMS": "cpu"}, None, False), ({"JAX_PLATFORMS": "cuda"}, None, True),
    ({"JAX_PLATFORMS": "cuda,cpu"}, None, True), ({"JAX_PLATFORMS": "gpu"}, None, True),
    ({"JAX_PLATFORMS": "tpu"}, None, False), ({"JAX_PLATFORM_NAME": "gpu"}, None, True),
    ({"JAX_PLATFORMS": "cpu"}, "gpu", True), ({"JAX_PLATFORMS": "cuda"}, "cpu", False),
    ({"CUDA_VISIBLE_DEVICES": ""}, None, False), ({"CUDA_VISIBLE_DEVICES": "-1"}, None, False),
])
def test_the_gpu_target_is_judged_without_jax(env, hint, gpu, monkeypatch):
    monkeypatch.setattr(accel, "_nvidia_device_present", lambda: True)
    assert accel.gpu_target(hint, env) is gpu


def test_with_nothing_set_the_driver_decides(monkeypatch):
    monkeypatch.setattr(accel, "_nvidia_device_present", lambda: False)
    assert not accel.gpu_target(env={})
    monkeypatch.setattr(accel, "_nvidia_device_present", lambda: True)
    assert accel.gpu_target(env={"CUDA_VISIBLE_DEVICES": "0"})


def test_flags_are_added_on_a_gpu_only():
    env = dict(GPU)
    assert accel.configure(env=env) == list(accel.GPU_FLAGS)
    assert env["XLA_FLAGS"] == " ".join(accel.GPU_FLAGS)
    assert accel.configure(env=env) == [] and env["XLA_FLAGS"] == " ".join(accel.GPU_FLAGS)  # idempotent
    cpu = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    assert accel.configure(env=cpu) == [] and cpu["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"


def test_the_users_flags_stay_first_and_win():
    user = "--xla_dump_to=/tmp/x  --xla_gpu_enable_triton_gemm=true"
    env = {**GPU, "XLA_FLAGS": user}
    assert accel.configure(env=env) == ["--xla_gpu_enable_latency_hiding_scheduler=true"]
    assert env["XLA_FLAGS"] == user.strip() + " --xla_gpu_enable_latency_hiding_scheduler=true"
    negated = {**GPU, "XLA_FLAGS": "--noxla_gpu_enable_latency_hiding_scheduler"}
    assert accel.configure(env=negated) == ["--xla_gpu_enable_triton_gemm=false"]


def test_the_flags_can_be_turned_off():
    for off in ("0", "false", "off", "NO"):
        env = {**GPU, accel.OFF_ENV: off, "XLA_FLAGS": "--a=1"}
        assert accel.configure(env=env) == [] and env["XLA_FLAGS"] == "--a=1"


def test_configure_writes_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/y")
    monkeypatch.delenv(accel.OFF_ENV, raising=False)
    accel.configure()
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/y " + " ".join(accel.GPU_FLAGS)


def test_every_flag_is_known_to_the_installed_xla():
    """XLA aborts on an unknown flag in XLA_FLAGS; the GPU flags are parsed by every jaxlib, CPU builds too."""
    env = {**os.environ, "XLA_FLAGS": " ".join(accel.GPU_FLAGS), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", "import jax; print(jax.numpy.ones(2).sum())"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "2.0" in out.stdout, out.stderr[-2000:]


def test_train_py_sets_the_flags_before_jax_starts():
    code = ("import runpy, sys, os; runpy.run_path('train.py', run_name='imported');"
            "from jax._src import xla_bridge; print(os.environ['XLA_FLAGS']); print(bool(xla_bridge._backends))")
    env = {**os.environ, "JAX_PLATFORMS": "cuda", "XLA_FLAGS": "--xla_dump_to=/tmp/z"}
    env.pop(accel.OFF_ENV, None)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    flags, started = out.stdout.split("\n")[:2]
    assert flags == "--xla_dump_to=/tmp/z " + " ".join(accel.GPU_FLAGS) and started == "False", out.stderr[-2000:]
