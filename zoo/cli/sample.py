"""Sample from a causal LM run (trained, or converted from Hugging Face): prompt in, continuations out.

    zoo-sample runs/x --prompt "The" --max-new-tokens 200 --temperature 0.8 --top-k 40 --seed 0
"""

from __future__ import annotations

import argparse
import sys

from zoo.cli import BAD_INPUT, error


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="zoo-sample", description=__doc__.split("\n")[0])
    ap.add_argument("workdir", help="a run directory with checkpoints (train.py --workdir)")
    ap.add_argument("--prompt", default="The")
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-samples", type=int, default=1)
    a = ap.parse_args(argv)
    from zoo.infer.sample import generate
    from zoo.train.checkpoint import load_run
    try:
        model, params, tok, _ = load_run(a.workdir)
        outs = generate(model, params, tok.encode(a.prompt), a.max_new_tokens, temperature=a.temperature,
                        top_k=a.top_k, top_p=a.top_p, seed=a.seed, eos_id=tok.eot_token,
                        vocab_limit=tok.n_vocab, num_samples=a.num_samples)
    except BAD_INPUT as e:
        return error(e)
    for i, ids in enumerate(outs):
        if a.num_samples > 1:
            print(f"--- sample {i}")
        print(a.prompt + tok.decode(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
