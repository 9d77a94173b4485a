"""What the training loop reports: an interval's record for metrics.jsonl (`summarise`: mean loss from sums over
weights, the last lr and norms, tokens/s and MFU), the console line after each evaluation (`eval_line`) and a time
left as a person reads it (`duration`)."""

from __future__ import annotations

import math
import time


def summarise(host, step, t0, t0_step, flops_per_token, peak) -> dict:
    """Mean loss over the steps since the last record (sums / weights), last lr and norms, speed."""
    ms = [m for _, m in host]
    if not ms:
        return {"step": step}
    weight = sum(float(m["weight"]) for m in ms)
    record = {"step": step, "loss": sum(float(m["loss_sum"]) for m in ms) / max(weight, 1e-9),
              "lr": float(ms[-1]["lr"]), "grad_norm": float(ms[-1]["grad_norm"]),
              "param_norm": float(ms[-1]["param_norm"])}
    if "correct" in ms[-1]:  # a task scored by its predictions (not grpo: its rewards are its score)
        record = {"step": step, "loss": record["loss"],
                  "accuracy": sum(float(m["correct"]) for m in ms) / max(weight, 1e-9), **record}
    elapsed = time.perf_counter() - t0
    record["seconds"] = elapsed  # the interval's wall time (without the first step's compile)
    timed = [m for s_, m in host if s_ > t0_step]
    if "moe_aux_sum" in ms[-1]:  # a mixture of experts: its load-balancing loss (R when balanced; zoo.nn.moe)
        record["moe_aux_loss"] = sum(float(m["moe_aux_sum"]) for m in ms) / max(weight, 1e-9)
    if "real_tokens" in ms[-1]:  # packed rows (sft): the share of positions that hold an example's token
        record["real_token_frac"] = (sum(float(m["real_tokens"]) for m in ms)
                                     / max(sum(float(m["tokens"]) for m in ms), 1.0))
    if timed and elapsed > 0:
        tps = sum(float(m["tokens"]) for m in timed) / elapsed
        record["tokens_per_s"] = tps
        if "real_tokens" in ms[-1]:
            record["real_tokens_per_s"] = sum(float(m["real_tokens"]) for m in timed) / elapsed
        if math.isfinite(peak) and peak > 0:  # no MFU for a device of unknown peak
            record["mfu"] = tps * flops_per_token / peak
    return record


# The per-evaluation console line: these keys in this order (those present), then the task's own eval_*.
_LINE_KEYS = ("loss", "eval_loss", "eval_ppl", "eval_accuracy")


def eval_line(record: dict) -> str:
    """`step 250: loss 1.62, eval_loss 1.65, eval_ppl 5.2, eval_accuracy 0.52, tokens/s 13012, peak memory
    812 MB`: the train and eval losses, the task's eval metrics (macro-F1, BLEU, exact match, ...),
    throughput and peak memory (zoo.training.memory)."""
    keys = [k for k in _LINE_KEYS if k in record]
    keys += sorted(k for k in record if k.startswith("eval_") and k not in _LINE_KEYS)
    parts = [f"{k} {record[k]:.4g}" for k in keys if isinstance(record[k], (int, float))]
    if isinstance(record.get("tokens_per_s"), (int, float)) and math.isfinite(record["tokens_per_s"]):
        parts.append(f"tokens/s {record['tokens_per_s']:.0f}")
    if isinstance(record.get("peak_memory_mb"), (int, float)):
        parts.append(f"peak memory {record['peak_memory_mb']:.0f} MB")
    return f"step {record['step']}: " + ", ".join(parts)


def duration(seconds: float) -> str:
    """3h 4m, 4m 05s, 9 s: a time left as a person reads it."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 60}m {s % 60:02d}s" if s >= 60 else f"{s} s"
