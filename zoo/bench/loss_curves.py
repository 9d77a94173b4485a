"""What the tokens-to-loss bench reads off its validation-loss curves: the tokens (and seconds) at which a curve first
reaches a target loss, interpolated between evaluations; each row's mean and spread over seeds; the markdown table
and the PNG of loss against tokens (zoo.bench.tokens_to_loss runs the curves).

A curve is a list of {tokens, eval_loss, seconds} points in training order.
"""

from __future__ import annotations

import statistics


def crossing(curve: list[dict], target: float) -> dict | None:
    """{tokens, seconds} where the curve first reaches `target` (eval_loss <= target), linear between the two
    evaluations around it; the first point itself if it is already there; None if the curve never gets there."""
    before = None
    for point in curve:
        if point["eval_loss"] <= target:
            if before is None:
                return {"tokens": float(point["tokens"]), "seconds": float(point["seconds"])}
            f = (before["eval_loss"] - target) / (before["eval_loss"] - point["eval_loss"])
            return {k: before[k] + f * (point[k] - before[k]) for k in ("tokens", "seconds")}
        before = point
    return None


def spread(values: list[float]) -> dict:
    """mean, min, max and the sample standard deviation (0 for a single value)."""
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def summarise(rows: dict[str, list[list[dict]]], target: float, budget_tokens: int) -> dict[str, dict]:
    """Per row (name -> one curve per seed): the final loss, and the tokens, seconds and tokens / budget at which
    each seed reached `target`, as spreads over the seeds that reached it; `reached` counts those seeds."""
    out = {}
    for name, curves in rows.items():
        hits = [c for c in (crossing(curve, target) for curve in curves) if c is not None]
        row = {"seeds": len(curves), "reached": len(hits),
               "final_loss": spread([curve[-1]["eval_loss"] for curve in curves])}
        if hits:
            row["tokens_to_target"] = spread([h["tokens"] for h in hits])
            row["seconds_to_target"] = spread([h["seconds"] for h in hits])
            row["tokens_to_target_vs_budget"] = row["tokens_to_target"]["mean"] / budget_tokens
        out[name] = row
    return out


def table(summary: dict[str, dict], target: float, budget_tokens: int) -> str:
    """The markdown table: one line per row, means +- the sample standard deviation over seeds."""
    pm = lambda s, f: f"{s['mean']:{f}} ± {s['std']:{f}}"
    lines = [f"target: validation loss {target:.4f}; budget {budget_tokens:,} tokens",
             "",
             "row | seeds reaching target | tokens to target | x budget | seconds to target | loss at budget",
             "--- | --- | --- | --- | --- | ---"]
    for name, r in summary.items():
        if r["reached"]:
            tok, ratio, sec = pm(r["tokens_to_target"], ",.0f"), f"{r['tokens_to_target_vs_budget']:.2f}", \
                pm(r["seconds_to_target"], ".0f")
        else:
            tok, ratio, sec = "not reached", "-", "-"
        lines.append(f"{name} | {r['reached']}/{r['seeds']} | {tok} | {ratio} | {sec} | {pm(r['final_loss'], '.4f')}")
    return "\n".join(lines)


def plot(rows: dict[str, list[list[dict]]], target: float, path: str) -> None:
    """Validation loss against tokens, one colour per row and one line per seed, the target dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, curves) in enumerate(rows.items()):
        for j, curve in enumerate(curves):
            ax.plot([p["tokens"] for p in curve], [p["eval_loss"] for p in curve], color=f"C{i}", alpha=0.85,
                    label=name if j == 0 else None)
    ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:.3f}")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation loss (nats / token)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
