"""zoo.bench.profile_summary reads a CPU trace: the host's XLA threads stand in for the device planes, also
when the trace carries a device plane without events (libtpu, installed with the test extras, adds an empty
"/device:CUSTOM:Megascale Trace" plane to every trace on a CPU host)."""

import jax
import jax.numpy as jnp

from zoo.bench import profile_summary


def test_a_cpu_trace_lists_the_programs_ops(tmp_path):
    f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
    x = jnp.ones((256, 256))
    f(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        for _ in range(3):
            f(x).block_until_ready()
    summary = profile_summary.summarise(str(tmp_path))
    assert summary, "no line summarised"
    names = {op["name"] for line in summary for op in line["ops"]}
    assert any("dot" in n or "fusion" in n for n in names), sorted(names)[:20]
    assert all(line["plane"] == "/host:CPU" for line in summary)
    assert "ms" in profile_summary.render(summary)


class _Ev:
    def __init__(self, name, ns):
        self.name, self.duration_ns = name, ns


class _Line:
    def __init__(self, name, events):
        self.name, self.events = name, events


class _Plane:
    def __init__(self, name, lines):
        self.name, self.lines = name, lines


def test_an_empty_device_plane_does_not_hide_the_host_threads(tmp_path, monkeypatch):
    """A bench worker without JAX_PLATFORMS=cpu loads libtpu, whose empty Megascale plane made the summary
    empty: the host's XLA threads are read when no device plane has events."""
    trace = tmp_path / "vm.xplane.pb"
    trace.write_bytes(b"")
    planes = [_Plane("/device:CUSTOM:Megascale Trace", []),
              _Plane("/host:CPU", [_Line("python", [_Ev("py", 5)]),
                                   _Line("tf_XLAEigen/1", [_Ev("ynn_fusion.3", 3_000_000), _Ev("dot.1", 1_000_000)])])]

    class Data:
        def __init__(self):
            self.planes = planes

    monkeypatch.setattr(jax.profiler.ProfileData, "from_file", staticmethod(lambda f: Data()))
    (line,) = profile_summary.summarise(str(tmp_path))
    assert line["line"] == "tf_XLAEigen/1" and line["total_ms"] == 4.0
    assert [op["name"] for op in line["ops"]] == ["ynn_fusion.3", "dot.1"]
