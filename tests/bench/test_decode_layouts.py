"""python -m zoo.bench.decode_layouts: the two decoding layouts timed in one process decode the same tokens, and
each row count's line gives both rates and their ratio."""

import re

from zoo.bench import decode_layouts


def test_both_layouts_decode_the_same_tokens_and_each_row_count_has_its_ratio(capsys):
    rows = decode_layouts.measure("tiny", [1, 3], rounds=1, prompt=4, new=6)
    assert [r["rows"] for r in rows] == [1, 3] and all(r["agree"] == 1.0 for r in rows)
    for r in rows:
        assert r["fused_over_apart"] == r["fused_tokens_per_s"] / r["apart_tokens_per_s"] > 0
    assert decode_layouts.main(["--shape", "tiny", "--rows", "2", "--rounds", "1"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"rows 2: apart [\d.]+ tok/s \([\d.]+-[\d.]+\), fused [\d.]+ \([\d.]+-[\d.]+\): [\d.]+x; "
                        r"100% of tokens the same", line), line
