"""Sample from a causal LM run (trained, or converted from Hugging Face): prompt in, continuations out.

The context is cropped to the length the run was trained on (data.seq_len), as nanoGPT crops to its
block size, so no position the model never trained is used.

    zoo-sample runs/x --prompt "The" --max-new-tokens 200 --temperature 0.8 --top-k 40 --seed 0
    zoo-sample runs/smollm2 --chat --prompt "What is the capital of France?" --temperature 0

--chat wraps the prompt as a user message in the chat template that came with a converted instruct
model's tokenizer and prints only the answer.
"""

from __future__ import annotations

import argparse
import sys

from zoo.cli import BAD_INPUT, error


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="zoo-sample", description=__doc__.split("\n")[0])
    ap.add_argument("workdir", help="a run directory with checkpoints (train.py --workdir)")
    ap.add_argument("--prompt", default="The", help="text to continue (default: %(default)r)")
    ap.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate (default: %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.8, help="0 is greedy (default: %(default)s)")
    ap.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens; 0: all (default)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass; 1: off (default)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    ap.add_argument("--num-samples", type=int, default=1, help="independent samples (default: %(default)s)")
    ap.add_argument("--chat", action="store_true",
                    help="the prompt is a user message, rendered with the run's chat template (converted instruct "
                         "models); prints the answer only")
    a = ap.parse_args(argv)
    from zoo.infer.sample import crops, generate
    from zoo.train.checkpoint import load_run
    try:
        model, params, tok, cfg = load_run(a.workdir)
        text = a.prompt
        if a.chat:
            from zoo.infer.chat import render
            text = render(cfg.data.tokenizer, [{"role": "user", "content": a.prompt}])
        prompt, window = tok.encode(text), cfg.data.seq_len  # the length the run trained on
        outs = generate(model, params, prompt, a.max_new_tokens, temperature=a.temperature, top_k=a.top_k,
                        top_p=a.top_p, seed=a.seed, eos_id=tok.eot_token, vocab_limit=tok.n_vocab,
                        num_samples=a.num_samples, window=window)
    except BAD_INPUT as e:
        return error(e)
    if crops(len(prompt), a.max_new_tokens, window):  # said after the arguments were accepted
        print(f"note: the model was trained on {window}-token windows; the context is cropped to the last "
              f"{window} tokens", file=sys.stderr)
    for i, ids in enumerate(outs):
        if a.num_samples > 1:
            print(f"--- sample {i}")
        print(tok.decode(ids) if a.chat else a.prompt + tok.decode(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
