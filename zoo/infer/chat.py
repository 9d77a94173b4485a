"""Chat prompts for zoo-sample: a conversation rendered with the run's chat template, ready for the
assistant's turn, and its token ids.

The template is zoo.data.chat.template_for's: the one a chat fine-tuning run trained with
(RUN_DIR/chat_template.jinja), else the one that came with a converted instruct model's tokenizer, else
zoo's DEFAULT_TEMPLATE. It is rendered as transformers renders it (zoo.data.chat), by default with
`add_generation_prompt=True`, so the text ends where the assistant's answer begins. The ids come from
`encode_with_offsets`, so an end-of-turn token the template writes as text (DEFAULT_TEMPLATE's
eos_token) is the tokenizer's `eot_token`, the id sampling stops at.
"""

from __future__ import annotations

from zoo.data import chat


def render(tokenizer_name: str, messages: list[dict], run_dir: str | None = None, *, tokenizer=None,
           add_generation_prompt: bool = True, tools: list | None = None) -> str:
    """`messages` ([{"role": "user", "content": ...}]) as the run's chat template writes them: ready for the
    assistant's turn, or with `add_generation_prompt=False` as they stand (a finished conversation, e.g.
    fine-tuning data), as transformers' apply_chat_template does. `tokenizer_name` is the run's
    cfg.data.tokenizer (`tokenizer`, if given, is it loaded); the template sees every special token, and `tools`
    (OpenAI's tool objects, as transformers' apply_chat_template passes them) where given."""
    if tokenizer is None:
        from zoo.data.tokenizers import get_tokenizer
        tokenizer = get_tokenizer(tokenizer_name)
    variables = {**chat.specials(tokenizer, tokenizer_name), **({"tools": tools} if tools else {})}
    return chat.render(chat.template_for(tokenizer_name, run_dir), messages, add_generation_prompt=add_generation_prompt,
                       variables=variables)


def prompt_ids(tokenizer, tokenizer_name: str, messages: list[dict], run_dir: str | None = None,
               tools: list | None = None) -> list[int]:
    """The token ids of `render(...)`: the prompt the model answers."""
    return tokenizer.encode_with_offsets(render(tokenizer_name, messages, run_dir, tokenizer=tokenizer,
                                                tools=tools))[0]
