"""Chat prompts: a converted instruct model's own chat template, rendered as transformers renders it.

The template travels with the checkpoint's tokenizer into the run (`chat_template.jinja`, or the
`chat_template` field of tokenizer_config.json). It is Jinja, run in a sandbox with the helpers
transformers provides (`raise_exception`, `strftime_now`) and the tokenizer's special tokens, with
`add_generation_prompt=True` so the text ends where the assistant's answer begins.
"""

from __future__ import annotations

import datetime
import json
import os

from zoo.errors import ZooDataError


def template_of(tokenizer_dir: str) -> str | None:
    """The chat template in a tokenizer directory, or None."""
    path = os.path.join(tokenizer_dir, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    conf = os.path.join(tokenizer_dir, "tokenizer_config.json")
    if os.path.isfile(conf):
        with open(conf, encoding="utf-8") as f:
            template = json.load(f).get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return template
    return None


def _special(tokenizer_dir: str, key: str) -> str:
    conf = os.path.join(tokenizer_dir, "tokenizer_config.json")
    if not os.path.isfile(conf):
        return ""
    with open(conf, encoding="utf-8") as f:
        value = json.load(f).get(key)
    return value.get("content", "") if isinstance(value, dict) else (value or "")


def render(tokenizer_dir: str, messages: list[dict]) -> str:
    """`messages` ([{"role": "user", "content": ...}]) as the model's chat template writes them, ready
    for the assistant's turn. ZooDataError if the run's tokenizer has no chat template."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    template = template_of(tokenizer_dir) if os.path.isdir(tokenizer_dir) else None
    if not template:
        raise ZooDataError(f"--chat needs a chat template; the run's tokenizer {tokenizer_dir!r} has none "
                           f"(chat_template.jinja or tokenizer_config.json's chat_template)")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                                bos_token=_special(tokenizer_dir, "bos_token"),
                                                eos_token=_special(tokenizer_dir, "eos_token"))
    except jinja2.exceptions.TemplateError as e:
        raise ZooDataError(f"the chat template of {tokenizer_dir!r} failed: {e}") from None
