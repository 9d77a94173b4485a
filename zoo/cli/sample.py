"""Sample from a decoder (a zoo run, a Hugging Face directory, a GGUF file or a PEFT adapter): prompt in,
continuations out. A shell over zoo.load(...) and zoo.api.decoder (Pretrained.generate and .chat).

The context is cropped to the longest sequence the weights were trained on (the run's context_len: its
base's training included, all positions of a converted checkpoint; else data.seq_len), as nanoGPT crops
to its block size, so no position the model never trained is used.

    zoo-sample runs/x --prompt "The" --max-new-tokens 200 --temperature 0.8 --top-k 40 --seed 0
    zoo-sample runs/smollm2 --chat --prompt "What is the capital of France?" --temperature 0
    zoo-sample runs/smollm2 --conversation chat.json --temperature 0
    zoo-sample runs/x --prompt "The" --prompt "Once upon a time" --temperature 0

Several --prompt flags are sampled in one batch (left-padded; each row as if sampled alone when greedy) and
printed in order, each after a "--- prompt i" line; a prompt that does not fit the window with
--max-new-tokens is sampled alone, its context cropped (said once).

--chat wraps the prompt as one user message; --conversation FILE.json gives a whole conversation, a JSON
list of {"role": "system" | "user" | "assistant", "content": "..."} messages, and the model answers
after the last one. Either is rendered with the run's chat template (zoo.infer.chat: a chat fine-tuning
run's own, else the one that came with a converted instruct model's tokenizer, else zoo's default
Zephyr-style template) and only the answer is printed, up to the end-of-turn token.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from zoo.api import decoder
from zoo import runtime
from zoo.cli import BAD_INPUT, error
from zoo.errors import ArgumentError


def main(argv=None) -> int:
    runtime.prepare_command()  # the compilation cache, XLA's log level: before jax starts
    ap = argparse.ArgumentParser(prog="zoo-sample", description=__doc__.split("\n")[0])
    ap.add_argument("workdir", help="a zoo run, a Hugging Face directory, a .gguf file or a PEFT adapter directory "
                                    "(whatever zoo.load reads)")
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
    ap.add_argument("--system", help="with --chat: a system message put before the user's (a --conversation's own "
                                     "system message stays)")
    ap.add_argument("--compile-for", metavar="TARGET", help="compile the generation program for a TPU topology "
                    "(v5e:2x2, v5e-8, ...) and print the report instead of sampling: rows = prompts x --num-samples, "
                    "--prompt-len + --max-new-tokens positions; WORKDIR: a preset name or a zoo run; nothing loaded "
                    "(needs libtpu: pip install -e '.[tpu]')")
    ap.add_argument("--prompt-len", type=int, default=128, help="with --compile-for: the prompts' length in tokens "
                                                                 "(default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="with --compile-for: the report as one JSON object")
    a = ap.parse_args(argv)
    if a.json and not a.compile_for:
        ap.error("--json goes with --compile-for TARGET")
    texts = ["The"] if a.prompt is None else a.prompt
    if a.compile_for:
        return _compile_for(a, len(texts) * a.num_samples)
    try:  # the arguments and the conversation are checked before jax is imported
        messages = _messages(a.conversation, a.prompt) if a.conversation else None
        chat = bool(messages) or a.chat
        if a.system is not None and not chat:
            raise ArgumentError("--system goes with --chat or --conversation")
        convs = None
        if chat:
            convs = decoder.conversations_of([messages] if messages else [[{"role": "user", "content": t}]
                                                                          for t in texts], a.system)[0]
        _check_flags(a)
        import zoo
        lm = zoo.load(a.workdir)
        decoder.require_decoder(lm, "generate")
        decoder.check_settings(lm, a.max_new_tokens, a.temperature, a.top_k, a.top_p, a.seed, a.num_samples, None)
        prompts = decoder.prompt_tokens(lm, texts, convs)
        outs = decoder.generate_ids(lm, prompts, max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                                    top_k=a.top_k, top_p=a.top_p, seed=a.seed, n=a.num_samples)
    except BAD_INPUT as e:
        return error(e)
    window = lm.config.window  # the longest the weights were trained on, their base's training included
    if any(len(p) + a.max_new_tokens > window for p in prompts):  # said once the arguments passed
        print(f"note: the model was trained on {window}-token windows; a longer context is cropped to the last "
              f"{window} tokens", file=sys.stderr)
    for i, ids in enumerate(outs):
        p, s = divmod(i, a.num_samples)
        if len(prompts) > 1:
            print(f"--- prompt {p}" + (f" sample {s}" if a.num_samples > 1 else ""))
        elif a.num_samples > 1:
            print(f"--- sample {i}")
        print(lm.detokenize(ids) if chat else texts[p] + lm.detokenize(ids))  # ids stop before the end-of-text
    return 0


def _compile_for(a, rows: int) -> int:
    """--compile-for TARGET: zoo.load(WORKDIR).generate's program compiled for TARGET (zoo.aot.decode)."""
    import json
    try:
        _check_flags(a)
        if a.prompt_len < 1:
            raise ArgumentError(f"--prompt-len={a.prompt_len} must be >= 1")
        from zoo.aot import decode, report
        out = decode.compile_generate(a.workdir, a.compile_for, rows=rows, prompt_len=a.prompt_len,
                                      max_new_tokens=a.max_new_tokens)
    except BAD_INPUT as e:
        return error(e)
    print(json.dumps(out) if a.json else report.text(out))
    return 0


def _check_flags(a) -> None:
    """The sampling flags, each refusal naming its flag (top-k against the vocabulary once the model is loaded)."""
    for flag, value in (("--max-new-tokens", a.max_new_tokens), ("--num-samples", a.num_samples)):
        if value < 1:
            raise ArgumentError(f"{flag}={value} must be >= 1")
    if not (math.isfinite(a.temperature) and a.temperature >= 0):  # inf would sample uniformly, nan anything
        raise ArgumentError(f"--temperature={a.temperature} must be a finite number >= 0 (0: greedy)")
    if a.top_k < 0:
        raise ArgumentError(f"--top-k={a.top_k} must be >= 0 (0: all tokens)")
    if not 0 < a.top_p <= 1:
        raise ArgumentError(f"--top-p={a.top_p} must be in (0, 1] (1: off)")


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
