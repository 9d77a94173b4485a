"""The CPU peak behind MFU is measured once per machine and cached (keyed by CPU, cores, jax), so
identical runs divide by the same number; a corrupt or unwritable cache never stops training; the
environment can fix it; the accelerator table is unchanged."""

import json
import os

import jax
import pytest

from zoo.training import flops


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty cache directory, no in-process memo, and a counting stand-in for the benchmark."""
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(flops.ENV_PEAK, raising=False)
    monkeypatch.setattr(flops, "_measured", {})
    calls = []

    def bench(*a, **kw):
        calls.append(1)
        return 1e11 + len(calls)  # a different number each time: a re-measurement would show
    monkeypatch.setattr(flops, "measure_cpu_matmul_peak", bench)
    monkeypatch.setattr(flops, "hardware_peak", lambda: None)  # the matmul's cache alone (the max: tested below)
    return calls


def forget(monkeypatch):
    monkeypatch.setattr(flops, "_measured", {})  # as a new process would start


def test_measured_once_then_read_from_the_cache(fresh, monkeypatch):
    first = flops.cpu_matmul_rate()
    forget(monkeypatch)
    assert flops.cpu_matmul_rate() == first and len(fresh) == 1
    table = json.load(open(flops.cache_path()))
    assert table[flops.host_key()]["flops"] == first
    assert flops.device_peak(jax.devices("cpu")[0])[1].startswith("cpu float32 matmul, measured once")


def test_another_host_key_is_measured_separately(fresh, monkeypatch):
    flops.cpu_matmul_rate()
    forget(monkeypatch)
    monkeypatch.setattr(flops, "host_key", lambda: "another cpu | 64 cores | jax 0")
    flops.cpu_matmul_rate()
    assert len(fresh) == 2 and len(json.load(open(flops.cache_path()))) == 2


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"KEY": {"flops": "NaN"}}', '{"KEY": 3}', ""])
def test_a_corrupt_cache_is_measured_again_and_rewritten(fresh, monkeypatch, content):
    path = flops.cache_path()
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write(content.replace("KEY", flops.host_key()))
    value = flops.cpu_matmul_rate()
    assert len(fresh) == 1 and json.load(open(path))[flops.host_key()]["flops"] == value


def test_an_unwritable_cache_costs_only_a_measurement(fresh, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ZOO_CACHE_DIR", str(blocker / "sub"))  # a directory under a file: cannot exist
    assert flops.cpu_matmul_rate() > 0 and len(fresh) == 1


def test_the_environment_fixes_the_peak(fresh, monkeypatch):
    monkeypatch.setenv(flops.ENV_PEAK, "2.5e11")
    assert flops.device_peak(jax.devices("cpu")[0]) == (2.5e11, f"cpu float32 matmul, fixed by ${flops.ENV_PEAK}")
    assert fresh == [] and not os.path.exists(flops.cache_path())


def test_the_benchmark_is_an_upper_bound_of_a_single_matmul():
    rate = flops.measure_cpu_matmul_peak(sizes=(256,), seconds=0.05)
    assert 1e8 < rate < 1e14  # FLOP/s of a CPU


def test_accelerators_use_the_table():
    class Dev:
        platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"
    assert flops.device_peak(Dev()) == (989e12, "H100 bf16 dense (table)")
    assert flops.total_peak([Dev(), Dev()]) == 2 * 989e12


def test_the_peak_is_the_larger_of_the_hardware_and_the_matmul_so_no_mfu_exceeds_a_matmul(fresh, monkeypatch):
    """A matmul measured on a busy host (1e11 here) no longer sets the peak when the hardware's is higher, and a
    hardware table that underestimates a CPU leaves the matmul's."""
    monkeypatch.setattr(flops, "hardware_peak", lambda: 3.3e11)
    peak, how = flops.cpu_peak()
    assert peak == 3.3e11 and "cores x FMA lanes x clock" in how and flops.cpu_matmul_rate() < peak
    forget(monkeypatch)
    monkeypatch.setattr(flops, "hardware_peak", lambda: 5e10)
    assert flops.cpu_peak()[0] == flops.cpu_matmul_rate()


@pytest.mark.parametrize("flags, mhz, cores, want", [
    ("fpu sse2 avx avx2 fma avx512f", "2596.132", 2, 2 * 64 * 2596.132e6),  # this project's EPYC: 332 GFLOP/s
    ("fpu sse2 avx avx2 fma", "3000.0", 4, 4 * 32 * 3000e6),
    ("fp asimd", "2000", 8, 8 * 16 * 2000e6),
    ("fpu", "2000", 2, None),  # no vector unit zoo knows: no hardware peak, the matmul's stands
])
def test_the_hardware_peak_is_cores_times_fma_lanes_times_the_clock(flags, mhz, cores, want):
    got = flops.hardware_peak({"flags": flags, "cpu mhz": mhz}, cores=cores, max_mhz=0)
    assert got == (pytest.approx(want) if want else None)
