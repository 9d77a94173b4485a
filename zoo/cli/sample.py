"""Sample from a causal LM run (trained, or converted from Hugging Face): prompt in, continuations out.

The context is cropped to the longest sequence the weights were trained on (the run's context_len: its
base's training included, all positions of a converted checkpoint; else data.seq_len), as nanoGPT crops
to its block size, so no position the model never trained is used.

    zoo-sample runs/x --prompt "The" --max-new-tokens 200 --temperature 0.8 --top-k 40 --seed 0
    zoo-sample runs/smollm2 --chat --prompt "What is the capital of France?" --temperature 0
    zoo-sample runs/smollm2 --conversation chat.json --temperature 0
    zoo-sample runs/x --prompt "The" --prompt "Once upon a time" --temperature 0

Several --prompt flags are sampled in one batch (left-padded; each row as if sampled alone when greedy) and
printed in order, each after a "--- prompt i" line; a batch is not cropped to the window (see below), so a
prompt plus --max-new-tokens longer than it is refused.

--chat wraps the prompt as one user message; --conversation FILE.json gives a whole conversation, a JSON
list of {"role": "system" | "user" | "assistant", "content": "..."} messages, and the model answers
after the last one. Either is rendered with the run's chat template (zoo.infer.chat: a chat fine-tuning
run's own, else the one that came with a converted instruct model's tokenizer, else zoo's default
Zephyr-style template) and only the answer is printed, up to the end-of-turn token.
"""

from __future__ import annotations

import argparse
import json
import sys

from zoo.cli import BAD_INPUT, error


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="zoo-sample", description=__doc__.split("\n")[0])
    ap.add_argument("workdir", help="a run directory with checkpoints (train.py --workdir)")
    ap.add_argument("--prompt", action="append",
                    help="text to continue, or with --chat the user's message (default: 'The'); repeat it to sample "
                         "several prompts in one batch")
    ap.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate (default: %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.8, help="0 is greedy (default: %(default)s)")
    ap.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens; 0: all (default)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass; 1: off (default)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    ap.add_argument("--num-samples", type=int, default=1, help="independent samples (default: %(default)s)")
    ap.add_argument("--chat", action="store_true",
                    help="the prompt is a user message, rendered with the run's chat template; prints the answer only")
    ap.add_argument("--conversation", metavar="FILE.json",
                    help="a JSON list of {role, content} messages (system, user, assistant) to answer; implies --chat")
    a = ap.parse_args(argv)
    texts = ["The"] if a.prompt is None else a.prompt
    try:  # the conversation is checked before jax is imported
        messages = _messages(a.conversation, a.prompt) if a.conversation else None
    except BAD_INPUT as e:
        return error(e)
    chat = bool(messages) or a.chat
    conversations = [messages] if messages else [[{"role": "user", "content": t}] for t in texts] if chat else None
    from zoo.infer.sample import check_settings, crops, generate, generate_batch
    from zoo.train.runs import load_run
    try:
        check_settings(a.max_new_tokens, a.num_samples, a.temperature, a.top_k, a.top_p)  # before the run loads
        model, params, tok, cfg = load_run(a.workdir)
        if chat:
            from zoo.infer.chat import prompt_ids
            prompts = [prompt_ids(tok, cfg.data.tokenizer, m, a.workdir) for m in conversations]
        else:
            prompts = [tok.encode(t) for t in texts]
        window = cfg.window  # the longest the weights were trained on, their base's training included
        kw = dict(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed, eos_id=tok.eot_token,
                  vocab_limit=tok.n_vocab, window=window)
        if len(prompts) == 1:
            outs = generate(model, params, prompts[0], a.max_new_tokens, num_samples=a.num_samples, **kw)
        else:  # each prompt num_samples times, in one batch (num_samples >= 1: checked above)
            outs = generate_batch(model, params, [p for p in prompts for _ in range(a.num_samples)],
                                  a.max_new_tokens, **kw)
    except BAD_INPUT as e:
        return error(e)
    if len(prompts) == 1 and crops(len(prompts[0]), a.max_new_tokens, window):  # said once the arguments passed
        print(f"note: the model was trained on {window}-token windows; the context is cropped to the last "
              f"{window} tokens", file=sys.stderr)
    for i, ids in enumerate(outs):
        p, s = divmod(i, a.num_samples)
        if len(prompts) > 1:
            print(f"--- prompt {p}" + (f" sample {s}" if a.num_samples > 1 else ""))
        elif a.num_samples > 1:
            print(f"--- sample {i}")
        print(tok.decode(ids) if chat else texts[p] + tok.decode(ids))  # ids stop before the eot token
    return 0


def _messages(path: str, prompt: list[str] | None) -> list[dict]:
    """The conversation in the JSON file `path`, checked."""
    from zoo.data.chat import check_messages
    from zoo.errors import ZooDataError
    if prompt is not None:  # prompt: the list of --prompt flags
        raise ZooDataError("give --prompt or --conversation, not both")
    try:
        with open(path, encoding="utf-8") as f:
            messages = json.load(f)
    except OSError as e:
        raise ZooDataError(f"--conversation {path!r}: {e.strerror or e}") from None
    except ValueError as e:  # not JSON, or not UTF-8
        raise ZooDataError(f"--conversation {path!r} is not a JSON file ({e})") from None
    check_messages(messages, f"--conversation {path!r}")
    return messages


if __name__ == "__main__":
    sys.exit(main())
