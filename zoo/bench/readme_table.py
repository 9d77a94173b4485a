"""The README's GPU table, written from `zoo-bench --out` rows (never typed by hand):

    python -m zoo.bench.readme_table docs/bench/h200-2026-11-27.jsonl            # print it
    python -m zoo.bench.readme_table docs/bench/h200-2026-11-27.jsonl --write README.md

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
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for r in rows:
        flags = "off" if "xla_flags" in r and "xla_gpu_enable" not in r["xla_flags"] else "on"
        cells = [r["workload"], r["shape"], flags, _num(r.get("tokens_per_s")), _num(r.get("mfu"), 3),
                 _num(1e3 * r["step_s_median"], 1) if r.get("step_s_median") else "",
                 _num(r["peak_memory_mb"] / 1024, 1) if r.get("peak_memory_mb") else ""]
        for name, _ in PEERS:
            p = r.get("peers", {}).get(name, {})
            cells += [_num(p.get("tokens_per_s")), _num(p.get("ratio_tokens_per_s"), 2)]
        cells.append(_attention(r))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    ap.add_argument("jsonl", help="rows of zoo-bench --out")
    ap.add_argument("--write", metavar="README", help="replace the table block of this README (default: print)")
    a = ap.parse_args(argv)
    try:
        with open(a.jsonl) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        text = table(rows)
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
