"""zoo's C++ decoding attention on a CPU (zoo.nn.cpu_kernels) against XLA's, side by side in one process, timed
alternately so that the host's load falls on each alike:

- `generate`: zoo.infer.sample's decode loop (a dense cache) of 128 new tokens after 32-token prompts, greedy,
  random weights, B rows decoded together;
- `engine`: zoo-serve's engine (a paged cache), B rows of 100-token prompts each, a chunk of 8 decode steps timed
  once every row is in (`--paged-kernel off` against `cpu`).

    python -m zoo.bench.cpu_kernel [--rows 1,8,32] [--rounds 5] [--shape smollm2_135m|gpt2_cpu|tiny]
                                   [--what generate,engine]

Prints one line per path and row count: each side's tokens/s (the median of the rounds, and their range), the ratio
kernel / XLA, and the share of tokens both decoded alike (greedy; float rounding aside, all).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

from zoo.bench.decode_layouts import SHAPES, line, model, rates

SIDES = ("xla", "kernel")


@contextlib.contextmanager
def side(name: str):
    """Programs traced within it decode by XLA's attention ("xla") or by the kernel ("kernel")."""
    was = os.environ.get("ZOO_CPU_KERNEL")
    os.environ["ZOO_CPU_KERNEL"] = "off" if name == "xla" else "on"
    try:
        yield
    finally:
        if was is None:
            os.environ.pop("ZOO_CPU_KERNEL", None)
        else:
            os.environ["ZOO_CPU_KERNEL"] = was


def _row(path: str, B: int, new: int, times: dict, tokens: dict, calls: dict) -> dict:
    """A line's figures; `calls`: whether each side's program calls the kernel (the kernel's alone, or no A/B)."""
    r = {"path": path, "rows": B, "agree": float((tokens["kernel"] == tokens["xla"]).mean()), "calls": calls,
         **rates(B, new, times)}
    return {**r, "kernel_over_xla": r["kernel_tokens_per_s"] / r["xla_tokens_per_s"]}


def generate(shape: str, rows: list[int], rounds: int, prompt: int = 32, new: int = 128) -> list[dict]:
    """zoo.infer.sample's decode loop by each side (see the module's docstring)."""
    import jax
    import numpy as np

    from zoo.infer.sample import _generate
    from zoo.nn import decode_layout
    cfg, task, params = model(shape)
    params = decode_layout.transposed(task.model, params, platform="cpu")
    V, out = cfg.model.vocab_size, []
    for B in rows:
        ids = jax.random.randint(jax.random.PRNGKey(1), (B, prompt), 0, V)
        kw = dict(model=task.model, temperature=0.0, top_k=0, top_p=1.0, vocab_limit=V, eos_id=None, max_new_tokens=new)
        gens, tokens, calls = {}, {}, {}
        for name in SIDES:  # each its own program: traced (and compiled) under its side
            gens[name] = jax.jit(lambda p, x: _generate.__wrapped__(p, x, jax.random.PRNGKey(0), **kw))
            with side(name):
                calls[name] = "zoo_dense_decode_f32" in gens[name].lower(params, ids).as_text()
                tokens[name] = np.asarray(gens[name](params, ids))
        times = {name: [] for name in SIDES}
        for _ in range(rounds):
            for name in SIDES:
                t = time.perf_counter()
                gens[name](params, ids).block_until_ready()
                times[name].append(time.perf_counter() - t)
        out.append(_row("generate", B, new, times, tokens, calls))
    return out


def engine(shape: str, rows: list[int], rounds: int, prompt: int = 100, chunk: int = 8) -> list[dict]:
    """zoo-serve's engine by each side (see the module's docstring): rows prefilled, two chunks run, then `rounds`
    chunks timed, alternated."""
    import numpy as np

    from zoo.api.pretrained import Pretrained
    from zoo.data.tokenizers import get_tokenizer
    from zoo.engine.batching import Engine
    from zoo.engine.sequence import Sequence
    cfg, task, params = model(shape)
    lm = Pretrained(task.model, params, get_tokenizer(cfg.data.tokenizer), cfg, source=shape, kind="preset")
    slots = max(rows)
    max_len = 1 << (prompt + chunk * (rounds + 3) - 1).bit_length()
    engines = {"xla": Engine(lm, slots=slots, max_len=max_len, chunk=chunk, paged_kernel="off"),
               "kernel": Engine(lm, slots=slots, max_len=max_len, chunk=chunk, paged_kernel="cpu")}
    rng, out = np.random.default_rng(0), []
    for B in rows:
        prompts = [rng.integers(1, cfg.model.vocab_size, prompt).tolist() for _ in range(B)]
        tokens, times = {}, {name: [] for name in SIDES}
        for name, e in engines.items():
            e.submit([Sequence(prompt=p, max_tokens=chunk * (rounds + 3), temperature=0.0) for p in prompts])
            e._admit()
            e._first()
            tokens[name] = [e._run_chunk(K=chunk) for _ in range(2)]  # compiled, and the first tokens
        for _ in range(rounds):
            for name, e in engines.items():
                t = time.perf_counter()
                tokens[name].append(e._run_chunk(K=chunk))
                times[name].append(time.perf_counter() - t)
        for e in engines.values():
            for r in range(e.slots):
                if e.rows[r] is not None:
                    e._free(r)
        out.append(_row("engine", B, chunk, times, {k: np.concatenate(v, 1) for k, v in tokens.items()},
                        {name: e.kernel == "cpu" for name, e in engines.items()}))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.bench.cpu_kernel", description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,8,32", help="row counts decoded together, a comma list (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per side, alternated (default: %(default)s)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2_135m", help="default: %(default)s")
    ap.add_argument("--what", default="generate,engine", help="generate, engine or both (default: %(default)s)")
    a = ap.parse_args(argv)
    what = [w.strip() for w in a.what.split(",") if w.strip()]
    bad = [w for w in what if w not in ("generate", "engine")]
    if bad or not what:
        ap.error(f"--what {a.what!r}: choose generate, engine or generate,engine")
    from zoo.nn import cpu_kernels
    why = cpu_kernels.unavailable()
    if why:
        ap.exit(2, f"error: the kernel cannot run here: {why}\n")
    rows = [int(x) for x in a.rows.split(",")]
    for fn in [{"generate": generate, "engine": engine}[w] for w in what]:
        for r in fn(a.shape, rows, a.rounds):
            print(f"{r['path']} rows {r['rows']}: {line(r, 'xla', 'kernel')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
