"""Sampling from a causal LM: greedy (temperature 0), temperature, top-k, top-p (the command is
zoo.cli.sample).

The prompt is processed in one call (prefill); then one token per step against the KV cache, all
inside one jitted while-loop, so a (prompt length, max tokens) shape compiles once. `generate_batch` runs
prompts of different lengths in one batch, left-padded to a bucket of lengths that shares that compilation.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from zoo.errors import ConfigError
from zoo.nn.layers import first_argmax


def sample_logits(logits_BV, rng, temperature: float, top_k: int, top_p: float):
    """One token per row. temperature 0 is greedy; top_k 0 and top_p 1 disable those filters."""
    if temperature == 0:
        return first_argmax(logits_BV)
    logits_BV = logits_BV / temperature
    if top_k:
        kth_B1 = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
        logits_BV = jnp.where(logits_BV < kth_B1, -jnp.inf, logits_BV)
    if top_p < 1.0:
        sorted_BV = jnp.sort(logits_BV, axis=-1)[:, ::-1]
        probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it < top_p.
        before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
        cutoff_B1 = jnp.min(jnp.where(before_BV < top_p, sorted_BV, jnp.inf), axis=-1, keepdims=True)
        logits_BV = jnp.where(logits_BV < cutoff_B1, -jnp.inf, logits_BV)
    return jax.random.categorical(rng, logits_BV, axis=-1)


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "temperature", "top_k", "top_p",
                                             "vocab_limit", "eos_id", "group"))
def _generate(params, prompt_BP, rng, pad_B=None, *, model, max_new_tokens, temperature, top_k, top_p, vocab_limit,
              eos_id, group=1):
    """New tokens out_BN. `pad_B`: how many padding ids each row's prompt starts with (left padding), then the
    positions go per row (the first real token at 0, the padding below 0: never cached nor attended). `eos_id`:
    an id or a tuple of ids a row ends at (filled with the first from then on). `group`: the rows come in runs of
    this many identical prompts (GRPO's completions of one prompt): each run's prompt is prefilled once and its
    keys, values and logits repeated to the run's rows."""
    B, P = prompt_BP.shape
    total = P + max_new_tokens

    def fresh(rows):
        cache = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((rows, total), jnp.int32),
                                                  decode=True))["cache"]
        return jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), nn.unbox(cache))

    def step(cache, ids_BT, positions_BT=None):
        logits_BTV, upd = model.apply({"params": params, "cache": cache}, ids_BT, decode=True,
                                      positions_BT=positions_BT, mutable=["cache"])
        logits_BV = logits_BTV[:, -1, :vocab_limit]
        return upd["cache"], logits_BV

    def positions(start):  # [B, T] per row, or None: the cache's own index
        return None if pad_B is None else start - pad_B[:, None]

    pos_BP = positions(jnp.arange(P)[None])
    if group == 1:
        cache, logits_BV = step(fresh(B), prompt_BP, pos_BP)
    else:  # a run's prompt prefilled once, its keys, values and logits repeated to its rows
        cache, logits_BV = step(fresh(B // group), prompt_BP[::group], None if pos_BP is None else pos_BP[::group])
        ax = 1 if model.cfg.scan_layers else 0  # a scanned stack's cache: [layers, rows, ...]
        cache = jax.tree.map(lambda c: jnp.repeat(c, group, axis=ax) if c.ndim > ax else c, cache)
        logits_BV = jnp.repeat(logits_BV, group, axis=0)
    eos = _eos(eos_id)
    out_BN = jnp.full((B, max_new_tokens), eos[0] if eos else 0, jnp.int32)

    def cond(c):
        i, _, _, _, done_B = c
        return (i < max_new_tokens) & ~jnp.all(done_B)

    def body(c):
        i, cache, logits_BV, out_BN, done_B = c
        tok_B = sample_logits(logits_BV, jax.random.fold_in(rng, i), temperature, top_k, top_p).astype(jnp.int32)
        if eos:
            tok_B = jnp.where(done_B, eos[0], tok_B)
            done_B = done_B | jnp.isin(tok_B, jnp.asarray(eos, jnp.int32))
        out_BN = out_BN.at[:, i].set(tok_B)
        cache, logits_BV = step(cache, tok_B[:, None], positions(P + i))
        return i + 1, cache, logits_BV, out_BN, done_B

    init = (jnp.int32(0), cache, logits_BV, out_BN, jnp.zeros((B,), bool))
    return jax.lax.while_loop(cond, body, init)[3]


def generate(model, params, prompt_ids, max_new_tokens: int, *, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, eos_id: int | tuple[int, ...] | None = None, vocab_limit: int | None = None,
             num_samples: int = 1, window: int | None = None) -> list[list[int]]:
    """Continuations (new tokens only, cut after end-of-text) of `prompt_ids` for each sample.

    The context never exceeds `window` tokens (default and at most model.cfg.max_len; a run passes the
    length it was trained on, so no position it never trained is used), as nanoGPT crops to its block
    size: a longer prompt keeps its last window - 1 tokens, and once the window is full generation goes
    on from the last window // 2 tokens, prefilled again, in segments of window - window // 2 tokens.
    """
    window = _check(model, [prompt_ids], max_new_tokens, num_samples, temperature, top_k, top_p, window)
    kw = dict(model=model, temperature=float(temperature), top_k=int(top_k), top_p=float(top_p),
              vocab_limit=vocab_limit or model.cfg.vocab_size, eos_id=_eos(eos_id) or None)
    context = np.asarray([list(prompt_ids)[-(window - 1):]] * num_samples, np.int32)
    out = np.zeros((num_samples, 0), np.int32)
    keep = window // 2  # context carried into each later segment
    for segment in itertools.count():
        n = min(max_new_tokens - out.shape[1], window - context.shape[1]) if segment == 0 else window - keep
        rng = jax.random.PRNGKey(seed) if segment == 0 else jax.random.fold_in(jax.random.PRNGKey(seed), segment)
        new = np.asarray(_generate(params, jnp.asarray(context), rng, max_new_tokens=n, **kw))
        out = np.concatenate([out, new], 1)[:, :max_new_tokens]
        done = bool(_eos(eos_id)) and bool(np.isin(out, _eos(eos_id)).any(1).all())
        if out.shape[1] >= max_new_tokens or done:
            break
        context = np.concatenate([context, new], 1)[:, -keep:]
    return _cut(out, eos_id)


def generate_batch(model, params, prompts: list[list[int]], max_new_tokens: int, *, temperature: float = 1.0,
                   top_k: int = 0, top_p: float = 1.0, seed: int = 0, eos_id: int | tuple[int, ...] | None = None,
                   vocab_limit: int | None = None, window: int | None = None, group: int = 1,
                   keep_end: bool = False) -> list[list[int]]:
    """One continuation per prompt, as `generate` (greedy: each row token for token its own `generate`), in one
    batch: the prompts left-padded to a length bucket (the next power of two, capped so the new tokens fit the
    window), so prompts of other lengths in one bucket reuse one compilation. A batch does not crop: a prompt
    plus max_new_tokens beyond `window` is refused (`generate` crops one prompt). `group`: the prompts come in
    runs of this many equal ones (GRPO's num_generations completions of each prompt): each run is prefilled once
    (its keys and values shared by its rows), the same tokens as without it; prompts that do not come so are
    prefilled row by row. `keep_end`: each continuation keeps the end id it stopped at (which of several: on-policy
    distillation trains it, zoo.tasks.gkd)."""
    window = _check(model, prompts, max_new_tokens, 1, temperature, top_k, top_p, window)
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > window:
        raise ValueError(f"a batch of prompts is not cropped to the {window}-token window: the longest prompt "
                         f"({longest} tokens) + max-new-tokens ({max_new_tokens}) exceed it; sample it alone "
                         f"(one prompt is cropped)")
    P = min(1 << (longest - 1).bit_length(), window - max_new_tokens)  # the bucket: >= longest
    # Rows too go to a power of two (repeats of the first prompt, dropped after), so batches of 5 to 8 share a program.
    n = len(prompts)
    prompts = list(prompts) + [prompts[0]] * ((1 << (n - 1).bit_length()) - n)
    if group > 1 and (len(prompts) % group or n % group
                      or any(prompts[i] != prompts[i - i % group] for i in range(len(prompts)))):
        group = 1
    pad_B = np.asarray([P - len(p) for p in prompts], np.int32)
    # Left padding: token 0 (any id will do, nothing attends it).
    prompt_BP = np.asarray([[0] * k + list(p) for k, p in zip(pad_B, prompts)], np.int32)
    eos = _eos(eos_id)
    out = _generate(params, jnp.asarray(prompt_BP), jax.random.PRNGKey(seed), jnp.asarray(pad_B),
                    model=model, max_new_tokens=max_new_tokens, temperature=float(temperature), top_k=int(top_k),
                    top_p=float(top_p), vocab_limit=vocab_limit or model.cfg.vocab_size, eos_id=eos or None,
                    group=group)
    return _cut(np.asarray(out)[:n], eos, keep_end)


def check_settings(max_new_tokens, num_samples, temperature, top_k, top_p) -> None:
    """The sampling settings, checked (zoo-sample checks them before it loads a run)."""
    if max_new_tokens < 1 or num_samples < 1:
        raise ValueError(f"max-new-tokens={max_new_tokens} and num-samples={num_samples} must be >= 1")
    if top_k < 0 or not 0 < top_p <= 1 or not 0 <= temperature < float("inf"):  # `not <=` also refuses NaN
        raise ValueError(f"need top_k >= 0, 0 < top_p <= 1, a finite temperature >= 0; got {top_k}, {top_p}, "
                         f"{temperature}")


def _check(model, prompts, max_new_tokens, num_samples, temperature, top_k, top_p, window) -> int:
    """The arguments of `generate` and `generate_batch`, checked; returns the window."""
    window = min(window or model.cfg.max_len, model.cfg.max_len)
    if not prompts:
        raise ValueError("no prompts given; give at least one")
    if not all(len(p) for p in prompts):
        raise ValueError("the prompt is empty; give at least one token (e.g. --prompt 'The')")
    check_settings(max_new_tokens, num_samples, temperature, top_k, top_p)
    if window < 2:
        raise ValueError(f"a context window of {window} token(s) leaves no room to generate")
    return window


def _eos(eos_id) -> tuple[int, ...]:
    """The ids generation stops at: none, one, or several (end-of-text and end-of-turn)."""
    if eos_id is None:
        return ()
    return tuple(int(i) for i in eos_id) if isinstance(eos_id, (tuple, list)) else (int(eos_id),)


def _cut(out_BN, eos_id, keep_end: bool = False) -> list[list[int]]:
    """Each row's new tokens up to (without; with `keep_end`, with) the first end-of-text (any of eos_id's)."""
    eos, result = set(_eos(eos_id)), []
    for row in out_BN.tolist():
        end = next((i + keep_end for i, t in enumerate(row) if t in eos), len(row))
        result.append(row[:end])
    return result


# Special tokens that end a turn or a text in the chat formats zoo converts (ChatML's <|im_end|>, Llama 3's
# <|eot_id|>, Gemma's <end_of_turn>, Phi-3's <|end|>, ...): generation stops at any the tokenizer holds as one id.
END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>", "</s>",
              "<eos>")


def stop_ids(tokenizer) -> tuple[int, ...]:
    """The ids a decoder's generation ends at: the tokenizer's end-of-text id first, then every END_TOKENS entry
    it reads as one special id (`encode_with_offsets`, which reads specials; plain text is never one id here)."""
    ids = [tokenizer.eot_token]
    for text in END_TOKENS:
        try:
            got = tokenizer.encode_with_offsets(text)[0]
        except Exception:  # a tokenizer without specials in text (WordPiece): none of these
            continue
        if len(got) == 1 and got[0] not in ids and got[0] < tokenizer.n_vocab and tokenizer.decode(got) in ("", text):
            ids.append(int(got[0]))
    return tuple(ids)


def crops(prompt_len: int, max_new_tokens: int, window: int) -> bool:
    """Whether generate() crops the context: the prompt and new tokens do not fit in `window`."""
    return prompt_len + max_new_tokens > window


def scanned(model, params):
    """(the same decoder with its layers as one nn.scan, its params with the layers stacked): what generation and
    scoring run. XLA then compiles one layer instead of L (SmolLM2-135M's 30: a decode program in 2.0 s instead
    of 7.5 s on a 2-core CPU, and 0.83 instead of 0.94 s for 32 tokens); the outputs are the same. The stacked
    params are a copy (as large as the layers' params); a model already scanned, or one that only loops (the
    speedrun's U-net skips and value embeddings: its config refuses scan_layers), comes back as it is."""
    cfg = model.cfg
    if cfg.scan_layers or cfg.num_layers < 2:
        return model, params
    try:
        twin = type(model)(dataclasses.replace(cfg, scan_layers=True))
    except ConfigError:  # a stack that only loops
        return model, params
    out = {k: v for k, v in params.items() if not (k.startswith("h_") and k[2:].isdigit())}
    out["h"] = jax.tree.map(lambda *xs: jnp.stack(xs), *[params[f"h_{i}"] for i in range(cfg.num_layers)])
    return twin, out


def unscanned(model, params):
    """The inverse of `scanned`: (the same decoder with its layers looped, its params one `h_i` per layer): what
    zoo-serve's engine decodes with. A scan slices each layer's weights out of the stack at every step, a copy as
    large as the weights that a decoding step, bound by reading them, pays twice over (SmolLM2-135M on the 2-core
    CPU: 50-72 ms a step for one row against 66-106 ms scanned, 375-383 against 545-553 ms for 32 rows); its
    programs compile in about 2-3x the time. A model already looped comes back as it is."""
    cfg = model.cfg
    if not cfg.scan_layers:
        return model, params
    twin = type(model)(dataclasses.replace(cfg, scan_layers=False))
    out = {k: v for k, v in params.items() if k != "h"}
    out.update({f"h_{i}": jax.tree.map(lambda x, i=i: x[i], params["h"]) for i in range(cfg.num_layers)})
    return twin, out
