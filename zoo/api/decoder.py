"""Text in, text or scores out, for a decoder (the GPT family): what Pretrained.generate, .chat, .logprobs and
.loss do, and what zoo-sample and zoo-eval call (an answer's log-probability given a prompt: zoo.api.answers).

Generation: each prompt is tokenized as transformers tokenizes it (the checkpoint's BOS first where its tokenizer
adds one), then all of them decode together in one KV-cached batch
(zoo.infer.sample.generate_batch: left-padded to a power-of-two length bucket, rows to a power of two, so
prompts of nearby lengths share one compiled program); a prompt that does not fit the model's window with
max_new_tokens is decoded alone with its context cropped (zoo.infer.sample.generate), as zoo-sample does. A row
stops at the tokenizer's end-of-text or end-of-turn id (zoo.infer.sample.stop_ids) or after max_new_tokens;
`stop` strings cut the text after decoding. With a `json_schema` the rows decode on zoo-serve's engine instead,
each with the schema's token mask (`guided_ids`).

Scoring follows zoo-eval's conventions (zoo.eval.perplexity): a text's first token is conditioned on the
tokenizer's BOS (else its end-of-text token), every token is scored once, and a text longer than the window is
scored in windows every half window, each token with at least half a window of context.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from zoo.errors import ArgumentError, FamilyError

INT32 = 2 ** 31


def require_decoder(lm, method: str) -> None:
    if lm.config.model.family != "gpt":
        raise FamilyError(f".{method} needs a decoder (GPT family); {lm.source!r} is a {lm.config.model.family} model "
                          f"(task {lm.config.task}), which offers {', '.join(lm.offers())}")


def texts_of(value, what: str) -> tuple[list[str], bool]:
    """(the texts, whether one string was given): a str or a non-empty list of str."""
    if isinstance(value, str):
        return [utf8(value, what)], True
    if isinstance(value, (list, tuple)) and value and all(isinstance(t, str) for t in value):
        return [utf8(t, f"{what}[{i}]") for i, t in enumerate(value)], False
    raise ArgumentError(f"{what}={_short(value)}: give a string or a non-empty list of strings")


def utf8(text: str, what: str) -> str:
    """`text`, refused in one line where UTF-8 cannot encode it (a lone surrogate, e.g. from a bad decode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ArgumentError(f"{what} holds {text[e.start]!r} at character {e.start}, a lone surrogate UTF-8 cannot "
                            f"encode; fix the text (decode its bytes with errors='replace')") from None
    return text


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_settings(lm, max_new_tokens, temperature, top_k, top_p, seed, n, stop) -> list[str]:
    """The sampling arguments checked (each refusal names the argument and the value); returns the stop strings."""
    def whole(name, value, low):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value < INT32:
            raise ArgumentError(f"{name}={value!r} must be a whole number >= {low}")
    whole("max_new_tokens", max_new_tokens, 1)
    whole("n", n, 1)
    whole("seed", seed, 0)
    whole("top_k", top_k, 0)
    if not isinstance(temperature, (int, float)) or not (math.isfinite(temperature) and temperature >= 0):
        raise ArgumentError(f"temperature={temperature!r} must be a finite number >= 0 (0: greedy)")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ArgumentError(f"top_p={top_p!r} must be in (0, 1] (1: off)")
    vocab = lm.tokenizer.n_vocab
    if top_k > vocab:
        raise ArgumentError(f"top_k={top_k} is above the vocabulary's {vocab} tokens (0: off)")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else list(stop) if isinstance(stop, (list, tuple)) \
        else [stop]
    if not all(isinstance(s, str) and s for s in stops):
        raise ArgumentError(f"stop={_short(stop)}: give a non-empty string or a list of them")
    return stops


def generate_ids(lm, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, n: int = 1) -> list[list[int]]:
    """New ids for each prompt (n rows per prompt, in order), cut at the stop ids: the prompts that fit the window
    decode in one batch, the others alone, cropped."""
    from zoo.infer.sample import generate, generate_batch, stop_ids
    window = lm.config.window
    if any(not p for p in prompts):
        raise ArgumentError("a prompt is empty (no tokens); give at least one character")
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, eos_id=stop_ids(lm.tokenizer),
              vocab_limit=lm.tokenizer.n_vocab, window=window)
    rows = [p for p in prompts for _ in range(n)]
    fits = [i for i, p in enumerate(rows) if len(p) + max_new_tokens <= window]
    out: list = [None] * len(rows)
    model, params = lm.decoding()
    if fits:
        for i, ids in zip(fits, generate_batch(model, params, [rows[i] for i in fits], max_new_tokens, **kw)):
            out[i] = ids
    for j, p in enumerate(prompts):  # too long for the window with max_new_tokens: alone, its context cropped
        if len(p) + max_new_tokens > window:
            for s, ids in enumerate(generate(model, params, p, max_new_tokens, num_samples=n, **kw)):
                out[j * n + s] = ids
    return out


def guided_ids(lm, prompts: list[list[int]], schema: dict, *, max_new_tokens: int, temperature: float, top_k: int,
               top_p: float, seed: int, n: int) -> list[list[int]]:
    """New ids for each prompt (n rows per prompt) whose text follows a JSON schema: zoo-serve's engine (built once
    per model, kept on it) decodes them with the schema's token mask (zoo.infer.grammar), 8 rows at a time; row i
    samples with key (seed, i), as the server's choice i does. A row ends when its JSON is complete, or at
    max_new_tokens or the window's end, cut."""
    from zoo.infer.grammar import compile_schema
    from zoo.infer.sample import stop_ids
    from zoo.engine.batching import Engine, Sequence
    from zoo.engine.programs import key_data
    window = lm.config.window
    for p in prompts:
        if not p or len(p) >= window:
            raise ArgumentError(f"a prompt of {len(p)} tokens: with json_schema it must hold 1 to {window - 1} (the "
                                f"model's window less one)")
    guide = compile_schema(lm.tokenizer, stop_ids(lm.tokenizer), schema)
    engine = lm.__dict__.get("_guided_engine")
    if engine is None:
        engine = lm._guided_engine = Engine(lm, slots=8, max_len=window, chunk=1)
    rows = [p for p in prompts for _ in range(n)]
    out: list[list[int]] = [[] for _ in rows]
    engine.run([Sequence(prompt=p, max_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                         key=key_data(seed, i), emit=lambda ids, end, i=i: out[i].extend(ids),
                         grammar=guide.matcher()) for i, p in enumerate(rows)])
    return out


def cut(text: str, stops: list[str]) -> str:
    """`text` up to (without) the earliest stop string."""
    ends = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[:min(ends)] if ends else text


def shaped(texts: list[str], single: bool, n: int):
    """One string, a list (one per prompt), or with n > 1 a list of n per prompt (a list of lists for several)."""
    per = [texts[i:i + n] for i in range(0, len(texts), n)] if n > 1 else texts
    return per[0] if single else per


def prompt_tokens(lm, texts: list[str] | None = None, conversations: list[list[dict]] | None = None,
                  tools: list | None = None):
    """The token ids of plain prompts as transformers' `tokenizer(text)` gives them (with the checkpoint's BOS where
    its tokenizer adds one: zoo.data.tokenizers.encode_text), or of conversations rendered for the assistant's turn
    (the run's chat template, zoo.infer.chat, with `tools` where given; the template writes any BOS itself)."""
    if conversations is None:
        from zoo.data.tokenizers import encode_text
        return [encode_text(lm.tokenizer, t) for t in texts]
    from zoo.infer.chat import prompt_ids
    return [prompt_ids(lm.tokenizer, lm.config.data.tokenizer, c, lm.run_dir, tools) for c in conversations]


def generate(lm, prompts, *, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: int = 0, stop=None, n: int = 1, json_schema: dict | None = None):
    """Continuations of the prompts (the new text only): see Pretrained.generate."""
    require_decoder(lm, "generate")
    texts, single = texts_of(prompts, "prompts")
    stops = check_settings(lm, max_new_tokens, temperature, top_k, top_p, seed, n, stop)
    decode = generate_ids if json_schema is None else functools.partial(guided_ids, schema=json_schema)
    ids = decode(lm, prompt_tokens(lm, texts), max_new_tokens=max_new_tokens,
                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, n=n)
    return shaped([cut(lm.tokenizer.decode(i), stops) for i in ids], single, n)


def conversations_of(value, system: str | None) -> tuple[list[list[dict]], bool]:
    """(conversations, whether one was given) of a chat() argument: a user message (str), one conversation (a
    list of {"role", "content"} dicts), a list of user messages or a list of conversations; `system` goes first in
    each that has none."""
    from zoo.data.chat import check_messages
    if isinstance(value, str):
        if not value:
            raise ArgumentError("messages='': give a non-empty user message (or a conversation)")
        convs, single = [[{"role": "user", "content": value}]], True
    elif isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) for m in value):
        convs, single = [list(value)], True
    elif isinstance(value, (list, tuple)) and value and all(isinstance(c, (list, tuple)) for c in value):
        convs, single = [list(c) for c in value], False
    elif isinstance(value, (list, tuple)) and value and all(isinstance(m, str) and m for m in value):
        convs, single = [[{"role": "user", "content": m}] for m in value], False  # user messages, one batch
    else:
        raise ArgumentError(f"messages={_short(value)}: give a user message (a string), a conversation (a list of "
                            f"{{'role', 'content'}} dicts), or a list of either user messages or conversations")
    if system is not None and not isinstance(system, str):
        raise ArgumentError(f"system={_short(system)} must be a string")
    if system is not None:
        utf8(system, "system")
    for i, c in enumerate(convs):
        where = f"conversation {i}" if not single else "messages"
        check_messages(c, where)
        for j, m in enumerate(c):
            utf8(m["content"], f"{where}: message {j}'s content")
    if system is not None:
        convs = [c if c[0].get("role") == "system" else [{"role": "system", "content": system}, *c] for c in convs]
    return convs, single


def chat(lm, messages, *, system: str | None = None, max_new_tokens: int = 256, temperature: float = 0.0,
         top_k: int = 0, top_p: float = 1.0, seed: int = 0, stop=None, n: int = 1, json_schema: dict | None = None,
         tools: list | None = None):
    """The assistant's answer to each conversation (with `tools`, an assistant message: zoo.api.tool_answers): see
    Pretrained.chat."""
    from zoo.api import tool_answers
    require_decoder(lm, "chat")
    convs, single = conversations_of(messages, system)
    stops = check_settings(lm, max_new_tokens, temperature, top_k, top_p, seed, n, stop)
    fmt = tool_answers.tool_format(lm, tools) if tools is not None else None
    decode = generate_ids if json_schema is None else functools.partial(guided_ids, schema=json_schema)
    ids = decode(lm, prompt_tokens(lm, conversations=convs, tools=tools), max_new_tokens=max_new_tokens,
                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, n=n)
    texts = [cut(lm.tokenizer.decode(i), stops) for i in ids]
    return shaped(texts if fmt is None else [tool_answers.message(t, fmt) for t in texts], single, n)


def token_logprobs(lm, texts: list[str], batch_size: int = 8) -> list[np.ndarray]:
    """float32[tokens] per text: each token's log-probability (zoo-eval's conventions, the module's docstring)."""
    from zoo.eval.loglik import prefix_token
    from zoo.eval.perplexity import check_window, document_token_logprobs
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ArgumentError(f"batch_size={batch_size!r} must be a whole number >= 1")
    context = lm.config.window
    stride = max(1, context // 2)
    check_window(context, stride)
    docs = lm.tokenizer.encode_batch(texts)
    prefix = prefix_token(lm.tokenizer)
    top = max([prefix, *(max(d) for d in docs if d)])
    if top >= lm.config.model.vocab_size:
        raise ArgumentError(f"the tokenizer gives id {top}, beyond the model's {lm.config.model.vocab_size} tokens")
    model, params = lm.decoding()
    return document_token_logprobs(model, params, docs, prefix=prefix, context=context, stride=stride,
                                   batch_size=batch_size)


def logprobs(lm, texts, *, batch_size: int = 8):
    """See Pretrained.logprobs (with `answers`, Pretrained calls zoo.api.answers instead)."""
    require_decoder(lm, "logprobs")
    items, single = texts_of(texts, "texts")
    out = token_logprobs(lm, items, batch_size)
    return out[0] if single else out


def loss(lm, texts, *, batch_size: int = 8) -> float:
    """See Pretrained.loss."""
    require_decoder(lm, "loss")
    items, _ = texts_of(texts, "texts")
    per = token_logprobs(lm, items, batch_size)
    n = sum(len(p) for p in per)
    if not n:
        raise ArgumentError("texts hold no tokens to score (every text is empty)")
    return -float(sum(np.sum(p, dtype=np.float64) for p in per)) / n
