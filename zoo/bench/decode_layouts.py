"""The decoding params' layouts on a CPU (zoo.nn.decode_layout) side by side in one process, timed alternately so
that the host's load falls on each alike: kernels [out, in] with query, key and value apart, and with them fused
(the default). `zoo.infer.sample._generate` of 128 new tokens after 32-token prompts, greedy, random weights.

    python -m zoo.bench.decode_layouts [--rows 1,8,32] [--rounds 5] [--shape smollm2_135m|gpt2_cpu|tiny]

Prints one line per row count: each layout's tokens/s (the median of the rounds, and their range) and the ratio of
fused to apart; the two decode the same tokens (checked, float rounding aside).
"""

from __future__ import annotations

import argparse
import time

SHAPES = {  # name: (shipped config, overrides)
    "smollm2_135m": ("llama_tiny", ["model.num_layers=30", "model.d_model=576", "model.num_heads=9",
                                    "model.num_kv_heads=3", "model.d_ff=1536", "model.vocab_size=49152",
                                    "model.max_len=2048", "model.rope_theta=100000.0", "model.tie_embeddings=True"]),
    # zoo-bench's `generate` CPU shape: GPT-2's architecture (biases, no GQA) at 6 layers of 384
    "gpt2_cpu": ("gpt_tiny", ["model.num_layers=6", "model.d_model=384", "model.num_heads=6", "model.d_ff=1536",
                              "model.vocab_size=50257", "model.max_len=1024", "model.dropout=0.0"]),
    "tiny": ("llama_tiny", []),
}


def model(shape: str):
    """(config, task, params) of a SHAPES entry, its params random (seed 0)."""
    import flax.linen as nn
    import jax

    from zoo import tasks
    from zoo.api.configs import find
    from zoo.overrides import apply_overrides, load_config_file
    config, overrides = SHAPES[shape]
    cfg = apply_overrides(load_config_file(find(config)), overrides)
    task = tasks.build(cfg)
    return cfg, task, jax.jit(lambda r: nn.unbox(task.init(r)))(jax.random.PRNGKey(0))


def rates(B: int, new: int, times: dict) -> dict:
    """Each side's tokens/s (the median of its rounds) and range, from {side: [seconds a round]}."""
    import numpy as np
    return {**{f"{name}_tokens_per_s": B * new / float(np.median(ts)) for name, ts in times.items()},
            **{f"{name}_range": (B * new / max(ts), B * new / min(ts)) for name, ts in times.items()}}


def line(r: dict, a: str, b: str) -> str:
    """Two sides' rates, ranges and ratio (b over a), and the share of tokens both decoded alike."""
    (lo_a, hi_a), (lo_b, hi_b) = r[f"{a}_range"], r[f"{b}_range"]
    return (f"{a} {r[f'{a}_tokens_per_s']:.1f} tok/s ({lo_a:.1f}-{hi_a:.1f}), {b} {r[f'{b}_tokens_per_s']:.1f} "
            f"({lo_b:.1f}-{hi_b:.1f}): {r[f'{b}_over_{a}']:.2f}x; {100 * r['agree']:.0f}% of tokens the same")


def measure(shape: str, rows: list[int], rounds: int, prompt: int = 32, new: int = 128) -> list[dict]:
    import jax
    import numpy as np

    from zoo.infer.sample import _generate
    from zoo.nn import decode_layout
    cfg, task, params = model(shape)
    layouts = {name: decode_layout.transposed(task.model, params, platform="cpu", fuse=fuse)
               for name, fuse in (("apart", False), ("fused", True))}
    V, out = cfg.model.vocab_size, []
    for B in rows:
        ids = jax.random.randint(jax.random.PRNGKey(1), (B, prompt), 0, V)
        kw = dict(model=task.model, temperature=0.0, top_k=0, top_p=1.0, vocab_limit=V, eos_id=None, max_new_tokens=new)
        gen = jax.jit(lambda p, x: _generate(p, x, jax.random.PRNGKey(0), **kw))
        tokens = {name: np.asarray(gen(p, ids)) for name, p in layouts.items()}
        times = {name: [] for name in layouts}
        for _ in range(rounds):
            for name, p in layouts.items():
                t = time.perf_counter()
                gen(p, ids).block_until_ready()
                times[name].append(time.perf_counter() - t)
        r = {"rows": B, "agree": float((tokens["fused"] == tokens["apart"]).mean()), **rates(B, new, times)}
        out.append({**r, "fused_over_apart": r["fused_tokens_per_s"] / r["apart_tokens_per_s"]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.bench.decode_layouts", description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,8,32", help="row counts decoded together, a comma list (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per layout, alternated (default: %(default)s)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2_135m", help="default: %(default)s")
    a = ap.parse_args(argv)
    for r in measure(a.shape, [int(x) for x in a.rows.split(",")], a.rounds):
        print(f"rows {r['rows']}: {line(r, 'apart', 'fused')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
