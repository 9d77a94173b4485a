"""The README's GPU table, written from `zoo-bench --out` rows (never typed by hand):

    python -m zoo.bench.readme_table docs/bench/h200-2026-11-27.jsonl            # print it
    python -m zoo.bench.readme_table docs/bench/h200-2026-11-27.jsonl --write README.md
    python -m zoo.bench.readme_table OLD.jsonl NEW.jsonl --write README.md   # NEW's rows replace OLD's

Several files merge: a later file's row replaces an earlier one's of the same workload, shape and flags, and a
date column says which lease each row came from. Decode rows add the fraction of the memory-bandwidth bound.

One line per row: zoo's tokens/s, MFU, step time and peak memory, each peer's tokens/s and zoo / peer, and
the attention zoo ran; above it, the card, the date and the versions the rows name. `--write` replaces what
stands between the README's `<!-- gpu-table -->` and `<!-- /gpu-table -->` lines.
"""

from __future__ import annotations

import argparse
import json
import sys

START, END = "<!-- gpu-table -->", "<!-- /gpu-table -->"
PEERS = (("hf-torch", "transformers eager"), ("hf-torch-compile", "torch.compile"))


def _num(x, digits=0) -> str:
    return "" if x is None else f"{x:,.{digits}f}"


def _attention(row: dict) -> str:
    if row.get("attention_fallbacks"):
        return "XLA (cuDNN refused: the row's attention_fallbacks say why)"
    return row.get("settings", {}).get("attention", "")


def table(rows: list[dict]) -> str:
    """The markdown: a sentence naming card, date and versions, then the table."""
    if not rows:
        raise ValueError("no rows")
    cards = sorted({r.get("card") or "?" for r in rows})
    dates = sorted({r.get("date") or "undated" for r in rows})
    zoo = sorted({r.get("zoo", "?") for r in rows})
    peer_versions = sorted({p.get("versions", "?") for r in rows for p in r.get("peers", {}).values()})
    head = (f"{', '.join(cards)}, {', '.join(dates)}, {', '.join(dict.fromkeys(r.get('dtype') or '?' for r in rows))}; "
            f"zoo on {', '.join(zoo)}; peers: {', '.join(peer_versions) or 'none'} (bf16 autocast, SDPA, fused "
            f"AdamW). Ratios are zoo / peer over alternating rounds of the same run.")
    cols = ["workload", "shape", "XLA GPU flags", "zoo tokens/s", "MFU", "step ms", "peak GB"]
    for _, label in PEERS:
        cols += [f"{label} tokens/s", f"zoo / {label}"]
    cols.append("attention")
    bound = any(r.get("decode_bound_frac") is not None for r in rows)
    if bound:
        cols.append("decode / HBM bound")
    if len(dates) > 1:
        cols.append("date")
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for r in rows:
        cells = [r["workload"], r["shape"], _flags(r), _num(r.get("tokens_per_s")), _num(r.get("mfu"), 3),
                 _num(1e3 * r["step_s_median"], 1) if r.get("step_s_median") else "",
                 _num(r["peak_memory_mb"] / 1024, 1) if r.get("peak_memory_mb") else ""]
        for name, _ in PEERS:
            p = r.get("peers", {}).get(name, {})
            cells += [_num(p.get("tokens_per_s")), _num(p.get("ratio_tokens_per_s"), 2)]
        cells.append(_attention(r))
        if bound:
            cells.append(_num(r.get("decode_bound_frac"), 3))
        if len(dates) > 1:
            cells.append(r.get("date") or "undated")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _flags(row: dict) -> str:
    return "off" if "xla_flags" in row and "xla_gpu_enable" not in row["xla_flags"] else "on"


def merged(files: list[list[dict]]) -> list[dict]:
    """Rows of several runs, in first-seen order; a later run's row replaces an earlier one's of the same
    workload, shape and XLA flags."""
    out: dict = {}
    for rows in files:
        for r in rows:
            out[(r.get("workload"), r.get("shape"), _flags(r))] = r
    return list(out.values())


def rewrite(readme: str, text: str) -> None:
    with open(readme) as f:
        old = f.read()
    if START not in old or END not in old:
        raise ValueError(f"{readme} has no {START} ... {END} block to replace")
    before, rest = old.split(START, 1)
    after = rest.split(END, 1)[1]
    with open(readme, "w") as f:
        f.write(f"{before}{START}\n{text}\n{END}{after}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.bench.readme_table", description=__doc__.split("\n")[0])
    ap.add_argument("jsonl", nargs="+", help="rows of zoo-bench --out; a later file's row replaces an earlier one's")
    ap.add_argument("--write", metavar="README", help="replace the table block of this README (default: print)")
    a = ap.parse_args(argv)
    try:
        runs = []
        for path in a.jsonl:
            with open(path) as f:
                runs.append([json.loads(line) for line in f if line.strip()])
        text = table(merged(runs))
        if a.write:
            rewrite(a.write, text)
        else:
            print(text)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
