"""python -m zoo.bench.cpu_kernel: XLA's attention and zoo's CPU kernel timed in one process, in zoo.infer.sample's
decode loop and in zoo-serve's engine: only the kernel's side calls the kernel, both decode the same tokens, and each
line gives both rates and their ratio."""

import re

from zoo.bench import cpu_kernel


def test_the_generate_loop_by_each_side_decodes_the_same_tokens_and_only_the_kernels_calls_it():
    rows = cpu_kernel.generate("tiny", [1, 3], rounds=1, prompt=4, new=6)
    assert [r["rows"] for r in rows] == [1, 3] and all(r["agree"] == 1.0 for r in rows)
    for r in rows:
        assert r["calls"] == {"xla": False, "kernel": True}
        assert r["kernel_over_xla"] == r["kernel_tokens_per_s"] / r["xla_tokens_per_s"] > 0


def test_the_engine_by_each_side_decodes_the_same_tokens_and_each_line_has_its_ratio(capsys):
    [row] = cpu_kernel.engine("tiny", [2], rounds=1, prompt=20, chunk=4)
    assert row["calls"] == {"xla": False, "kernel": True} and row["agree"] == 1.0
    assert cpu_kernel.main(["--shape", "tiny", "--rows", "2", "--rounds", "1", "--what", "engine"]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("engine")]
    assert re.fullmatch(r"engine rows 2: xla [\d.]+ tok/s \([\d.]+-[\d.]+\), kernel [\d.]+ \([\d.]+-[\d.]+\): "
                        r"[\d.]+x; 100% of tokens the same", line), line
