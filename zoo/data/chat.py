"""Conversations as tokens: a checkpoint's own chat template rendered as transformers renders it, and the
per-token mask of the tokens a chat fine-tuning loss falls on (the assistant's). Used by chat fine-tuning
(zoo.tasks.sft) and chat sampling (zoo.infer.chat), so both see the same text.

A conversation is a list of messages `{"role": one of ROLES, "content": str}`. The template is Jinja, run
in the sandbox transformers uses (`raise_exception`, `strftime_now`, its `tojson`, trim_blocks,
lstrip_blocks, loop controls). Which template a run uses (`template_for`): the one a chat fine-tuning
run wrote beside its checkpoints (RUN_DIR/chat_template.jinja), else its tokenizer directory's
(chat_template.jinja, or tokenizer_config.json's `chat_template`), else DEFAULT_TEMPLATE.

DEFAULT_TEMPLATE, for a model without a template of its own (bytes, tiktoken, GPT-2), is Zephyr's shape:
each turn is `<|ROLE|>` + newline + content + eos_token, and the generation prompt is `<|assistant|>` +
newline. eos_token is the tokenizer's end-of-text text (`eot_text`), which `encode_with_offsets` turns
into the one `eot_token` id, so a turn ends with the id that sampling stops at:

    <|system|>\\nBe brief.<|endoftext|><|user|>\\nHi<|endoftext|><|assistant|>\\nHello!<|endoftext|>

Which tokens are the assistant's: a template with `{% generation %}...{% endgeneration %}` tags marks
them itself (transformers' `return_assistant_tokens_mask` rule: a token counts when its characters
overlap a tagged span). A template without tags (most, SmolLM2's included) is split by rendering
prefixes: assistant message i spans from the end of messages[:i] rendered with the generation prompt to
the end of messages[:i+1]; of its tokens, those after its last end-of-turn token (the "\\n" after
<|im_end|>) are dropped. The whole text is tokenized once (BPE merges differ across piece boundaries); a
token's characters run from its start offset to the next token's.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import datetime
import functools
import json
import os
import re
import signal
import threading

from zoo.errors import ZooDataError

ROLES = ("system", "user", "assistant")
TEMPLATE_FILE = "chat_template.jinja"  # in a run directory: the template a chat fine-tuning run trained with
DEFAULT_TEMPLATE = (r"{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + "
                    r"eos_token }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")
_TAGS = re.compile(r"\{%-?\s*generation\s*-?%\}")  # the test transformers uses for a tagged template
# A template is code from a checkpoint. Its rendering is bounded: at most RENDER_SECONDS of wall time (in the
# main thread, where a timer can interrupt it) and MAX_CHARS of text, its own or one `*` product's.
RENDER_SECONDS = 10.0
MAX_CHARS = 10_000_000
_SPANS = contextvars.ContextVar("zoo_chat_generation_spans", default=None)  # (rendered blocks, spans) of a render


class ChatTemplate(str):
    """A template's text that remembers where it came from, for error messages."""

    def __new__(cls, text: str, source: str | None = None):
        self = super().__new__(cls, text)
        self.source = source
        return self


def read_template(path: str, what: str | None = None) -> ChatTemplate:
    """The Jinja chat template in the file `path`. A file that is not text is refused in one line naming `what` (the
    config key that gave it, with its value; default: the file), not as a codec's error."""
    what = what or f"the chat template {path!r}"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ZooDataError(f"{what} is not a text file (byte {e.start} is not UTF-8); give a Jinja chat template "
                           f"(.jinja)") from None
    except OSError as e:
        raise ZooDataError(f"{what} could not be read ({e.strerror or e})") from None
    if "\x00" in text:
        raise ZooDataError(f"{what} is a binary file (a NUL byte at character {text.index(chr(0))}); give a Jinja "
                           f"chat template (.jinja)")
    return ChatTemplate(text, path)


def _tokenizer_config(directory: str) -> dict:
    path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:  # not JSON, or not UTF-8
        raise ZooDataError(f"{path!r} is not a JSON file ({e}); it holds the tokenizer's chat template and special "
                           f"tokens") from None


def template_of(tokenizer_dir: str) -> ChatTemplate | None:
    """The chat template in a Hugging Face tokenizer directory, or None."""
    path = os.path.join(tokenizer_dir, TEMPLATE_FILE)
    if os.path.isfile(path):
        return read_template(path)
    template = _tokenizer_config(tokenizer_dir).get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return ChatTemplate(template, os.path.join(tokenizer_dir, "tokenizer_config.json")) if template else None


def template_for(tokenizer_name: str, run_dir: str | None = None) -> ChatTemplate:
    """The template a run uses: RUN_DIR/chat_template.jinja, else its tokenizer directory's (`tokenizer_name`
    is cfg.data.tokenizer), else DEFAULT_TEMPLATE."""
    if run_dir is not None and os.path.isfile(os.path.join(run_dir, TEMPLATE_FILE)):
        return read_template(os.path.join(run_dir, TEMPLATE_FILE))
    directory = os.path.expanduser(tokenizer_name)
    own = template_of(directory) if os.path.isdir(directory) else None
    return own or ChatTemplate(DEFAULT_TEMPLATE, "zoo.data.chat.DEFAULT_TEMPLATE")


def specials(tokenizer, tokenizer_name: str) -> dict:
    """The special tokens a template may name, as transformers' apply_chat_template passes them (its
    special_tokens_map): a Hugging Face directory's every `*_token` of tokenizer_config.json (bos, eos, unk, pad,
    ...) and `additional_special_tokens` (eos falling back to the tokenizer's end-of-text); otherwise bos ""
    and eos the tokenizer's end-of-text text."""
    directory = os.path.expanduser(tokenizer_name)
    conf = _tokenizer_config(directory) if os.path.isdir(directory) else {}
    text = lambda v: v.get("content", "") if isinstance(v, dict) else (v or "")  # noqa: E731 (AddedToken or str)
    out = {k: text(v) for k, v in conf.items() if k.endswith("_token") and isinstance(v, (str, dict)) and text(v)}
    extra = conf.get("additional_special_tokens")
    if isinstance(extra, list) and extra:
        out["additional_special_tokens"] = [text(v) for v in extra]
    return {**out, "bos_token": out.get("bos_token", ""), "eos_token": out.get("eos_token") or tokenizer.eot_text}


def _show(value) -> str:
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


def check_messages(messages, where: str) -> None:
    """ZooDataError naming `where` unless `messages` is a non-empty list of {role in ROLES, content: str}."""
    shape = f"a non-empty list of {{'role': {' | '.join(ROLES)}, 'content': str}} messages"
    if not isinstance(messages, list) or not messages:
        raise ZooDataError(f"{where}: expected {shape}, got {_show(messages)}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ZooDataError(f"{where}: message {i} is {_show(m)}; expected {shape}")
        if m.get("role") not in ROLES:
            raise ZooDataError(f"{where}: message {i} has role {_show(m.get('role'))}; "
                               f"choose one of {', '.join(ROLES)}")
        if not isinstance(m.get("content"), str):
            got = "no 'content'" if m.get("content") is None else f"content {_show(m['content'])}"
            raise ZooDataError(f"{where}: message {i} has {got}; 'content' must be a string")


def _raise_exception(message):
    import jinja2
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' override: Jinja's own escapes HTML characters, which no chat template wants.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=None)
def _environment():
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """{% generation %}...{% endgeneration %}: records the character span its body renders to, as
        transformers' AssistantTracker does (the body's start is the length rendered so far)."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_track"), [], [], body).set_lineno(lineno)

        def _track(self, caller):
            text = caller()
            if (tracking := _SPANS.get()) is not None:
                blocks, spans = tracking
                start = sum(map(len, blocks))
                spans.append((start, start + len(text)))
            return text

    class Bounded(ImmutableSandboxedEnvironment):
        """The sandbox, with `*` and `**` refused where their result would be too large ('a' * 10**9)."""
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                sized = [x for x in (left, right) if isinstance(x, (str, list, tuple))]
                count = [x for x in (left, right) if isinstance(x, int)]
                if sized and count and len(sized[0]) * max(count[0], 0) > MAX_CHARS:
                    raise jinja2.exceptions.SecurityError(f"a product of more than {MAX_CHARS:,} items")
            if operator == "**" and isinstance(right, int) and abs(right) > 1000:
                raise jinja2.exceptions.SecurityError(f"a power of {right}")
            return super().call_binop(context, operator, left, right)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception,
                       strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
    return env


@functools.lru_cache(maxsize=32)
def _compile(template: str):
    return _environment().from_string(template)


def _render(template, messages, add_generation_prompt: bool, variables: dict, spans: list | None) -> str:
    """The rendered text; with `spans` (a list), the generation tags' character spans are appended to it."""
    context = {"tools": None, "documents": None, **variables, "messages": messages,
               "add_generation_prompt": add_generation_prompt}
    source = getattr(template, "source", None) or "given"
    try:
        compiled = _compile(str(template))
        blocks, size = [], 0
        token = _SPANS.set((blocks, spans if spans is not None else []))
        try:
            with _deadline(RENDER_SECONDS):
                for block in compiled.generate(**context):  # a tag's start is the length of the blocks before it
                    blocks.append(block)
                    size += len(block)
                    if size > MAX_CHARS:
                        raise ZooDataError(f"the chat template ({source}) writes more than {MAX_CHARS:,} characters")
        finally:
            _SPANS.reset(token)
        return "".join(blocks)
    except ZooDataError:
        raise
    except Exception as e:  # a template is code from a checkpoint: any failure is bad input
        reason = " ".join(str(e).split()) or type(e).__name__
        if "no loader for this environment" in reason:
            reason = "{% include %}, {% extends %} and {% import %} are not available: a chat template is one file"
        raise ZooDataError(f"the chat template ({source}) failed: {type(e).__name__}: {reason}") from None


class RenderTimeout(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise RenderTimeout in the body after `seconds` (main thread only: elsewhere no timer can interrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise RenderTimeout(f"rendering took more than {seconds:g} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def render(template: str, messages: list[dict], *, add_generation_prompt: bool, variables: dict) -> str:
    """`messages` as `template` writes them (with the assistant's header after them when add_generation_prompt);
    `variables` (bos_token, eos_token, ...) are the template's other inputs (see `specials`)."""
    return _render(template, messages, add_generation_prompt, variables, None)


def _ends(starts: list[int], n_chars: int) -> list[int]:
    """Each token's end: the next larger start (tokens sharing a cut character share its span), or the end."""
    ends, end, later = [], n_chars, None
    for s in reversed(starts):
        if later is not None and later > s:
            end = later
        ends.append(end)
        later = s
    return ends[::-1]


def _overlapping(starts: list[int], ends: list[int], a: int, b: int) -> range:
    """The tokens whose characters overlap [a, b) (transformers' rule: start < b and end > a)."""
    lo = bisect.bisect_right(ends, a)
    return range(lo, max(lo, bisect.bisect_left(starts, b)))


def _assistant_spans(template, messages: list[dict], variables: dict, whole: str) -> list[tuple[int, int]]:
    """Character spans of the assistant messages in `whole` (the rendering of all of `messages`), found by
    rendering prefixes; ZooDataError if the template renders a prefix differently from the whole."""
    spans = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        before = render(template, messages[:i], add_generation_prompt=True, variables=variables)
        through = render(template, messages[:i + 1], add_generation_prompt=False, variables=variables)
        if not (whole.startswith(through) and through.startswith(before)):
            source = getattr(template, "source", None) or "given"
            raise ZooDataError(f"the chat template ({source}) renders a conversation's prefix differently from the "
                               f"whole (at message {i}), so the assistant's tokens cannot be found; add "
                               f"{{% generation %}}...{{% endgeneration %}} tags around the assistant's text")
        spans.append((len(before), len(through)))
    return spans


def encode_conversation(tokenizer, template: str, messages: list[dict], variables: dict, *,
                        train_on_prompt: bool = False) -> tuple[list[int], list[bool]]:
    """(ids, mask) of the whole rendered conversation; mask is True on the tokens the loss falls on: the
    assistant's (module docstring), or every token with train_on_prompt. No assistant message: all False."""
    tagged = _TAGS.search(template) is not None
    spans = [] if tagged else None
    text = _render(template, messages, False, variables, spans)
    ids, starts = tokenizer.encode_with_offsets(text)
    mask = [train_on_prompt] * len(ids)
    if train_on_prompt:
        return ids, mask
    ends = _ends(starts, len(text))
    for a, b in spans if tagged else _assistant_spans(template, messages, variables, text):
        keep = _overlapping(starts, ends, a, b)
        if not tagged:  # up to the turn's last end-of-turn token: not the newline a template writes after it
            eots = [k for k in keep if ids[k] == tokenizer.eot_token]
            keep = range(keep.start, eots[-1] + 1) if eots else keep
        for k in keep:
            mask[k] = True
    return ids, mask


def encode_prompt_completion(tokenizer, template: str, prompt, completion, variables: dict, *,
                             train_on_prompt: bool = False) -> tuple[list[int], list[bool]]:
    """(ids, mask) of a prompt/completion row in TRL's two formats. Strings: prompt + completion as plain
    text, as TRL tokenizes it (`tokenizer(prompt + completion)`: the checkpoint's BOS first where its tokenizer adds
    one, zoo.data.tokenizers.encode_text), then the eot id; mask on the completion's tokens and the eot. Lists of
    messages (conversational): encode_conversation(prompt + completion)."""
    if isinstance(prompt, str) and isinstance(completion, str):
        text = prompt + completion
        ids, starts = tokenizer.encode_with_offsets(text)
        mask = [train_on_prompt] * len(ids)
        for k in _overlapping(starts, _ends(starts, len(text)), len(prompt), len(text)):
            mask[k] = True
        bos = list(getattr(tokenizer, "special_prefix", ()))
        return bos + ids + [tokenizer.eot_token], [train_on_prompt] * len(bos) + mask + [True]
    if isinstance(prompt, list) and isinstance(completion, list):
        return encode_conversation(tokenizer, template, prompt + completion, variables, train_on_prompt=train_on_prompt)
    raise ZooDataError(f"the prompt and completion columns hold {type(prompt).__name__} and "
                       f"{type(completion).__name__}; give both as str (plain text) or both as lists of "
                       f"messages (conversational)")
