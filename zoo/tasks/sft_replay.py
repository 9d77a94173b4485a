"""`data.mix_source=replay` (issue #54): the base's own answers mixed into a chat fine-tune, so that tuning on a few
chats of your own moves the base's other answers less (a replay of what it said, not answers someone wrote).

Before the first step the trainer hands the task the params the run starts from (SftTask.prepare_data); the
prompts, zoo's general questions (zoo.data.zoo_commands.GENERAL) or `replay:PROMPTS.jsonl`'s, are rendered with
the run's chat template and answered greedily in KV-cached batches (zoo.eval.generation.greedy_ids, what
zoo-eval --task generate decodes with), each answer at most data.replay_max_new_tokens tokens. The (prompt,
answer) conversations then mix in as any data.mix_source does (trained, never held out). They are kept in the run
(REPLAY_FILE, written with the run's other files): a resume reads them back rather than asking the trained params,
so it trains on the same rows, bit for bit.
"""

from __future__ import annotations

import json
import os
import time

from zoo.data import chat, zoo_commands
from zoo.errors import ZooDataError

NAME = "replay"
REPLAY_FILE = "replay.jsonl"  # in the run: the prompts and the base's answers, {"messages": [...]} a line
SHAPE = '{"prompt": "a user message"} or {"messages": [{"role": "user", "content": "..."}]}'


def is_replay(mix_source: str) -> bool:
    return mix_source == NAME or mix_source.startswith(NAME + ":")


def prompts_of(dcfg) -> list[list[dict]]:
    """The conversations the base answers: GENERAL's questions, or the file's rows (a "prompt" as a user message;
    "messages" up to their last user message: a file of chats with answers replays their questions)."""
    setting = f"data.mix_source={dcfg.mix_source!r}"
    if dcfg.mix_source == NAME:
        return [[{"role": "user", "content": q}] for q, _ in zoo_commands.GENERAL]
    path = os.path.expanduser(dcfg.mix_source[len(NAME) + 1:])
    if not path:
        raise ZooDataError(f"{setting}: name a JSONL file of prompts after 'replay:' (each line {SHAPE}), or give "
                           f"'replay' alone for zoo's {len(zoo_commands.GENERAL)} general questions")
    if not os.path.isfile(path):
        raise ZooDataError(f"{setting}: no such file {path!r} (a JSONL file of prompts, each line {SHAPE})")
    from zoo.eval.jsonl import read_jsonl
    try:
        return read_jsonl(path, _prompt, SHAPE)
    except ZooDataError as e:
        raise ZooDataError(f"{setting}: {e}") from None


def _prompt(row, where: str) -> list[dict]:
    if isinstance(row, dict) and "prompt" in row and "messages" not in row:
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise ZooDataError(f"{where}: 'prompt' must be a non-empty string; each line is {SHAPE}")
        return [{"role": "user", "content": row["prompt"]}]
    if isinstance(row, dict) and "messages" in row and "prompt" not in row:
        chat.check_messages(row["messages"], f"{where}: 'messages'")
        last = max((i for i, m in enumerate(row["messages"]) if m["role"] == "user"), default=None)
        if last is None:
            raise ZooDataError(f"{where}: 'messages' holds no user message for the base to answer")
        return [{"role": m["role"], "content": m["content"]} for m in row["messages"][:last + 1]]
    got = f"keys {', '.join(map(repr, row))}" if isinstance(row, dict) else f"a {type(row).__name__}"
    raise ZooDataError(f"{where}: got {got}; each line is {SHAPE}")


def answer(model, params, tokenizer, dcfg, template: str, window: int) -> tuple[list[list[dict]], str]:
    """(each prompt with the base's greedy answer appended, the console line saying what was done and how long it
    took). `params` are the base's: the model the run starts from, LoRA adapters merged (zero: the base)."""
    from zoo.eval.generation import greedy_ids
    prompts = prompts_of(dcfg)
    variables = chat.specials(tokenizer, dcfg.tokenizer)
    ids = [tokenizer.encode_with_offsets(chat.render(template, p, add_generation_prompt=True,
                                                     variables=variables))[0] for p in prompts]
    start = time.perf_counter()
    out = greedy_ids(model, params, tokenizer, ids, window=window, max_new_tokens=dcfg.replay_max_new_tokens)
    took = time.perf_counter() - start
    convs = [p + [{"role": "assistant", "content": tokenizer.decode(o)}] for p, o in zip(prompts, out)]
    cut = sum(len(o) >= dcfg.replay_max_new_tokens for o in out)
    said = (f"data.mix_source={dcfg.mix_source}: the base answered {len(convs)} prompts greedily in {took:.1f} s"
            + (f" ({cut} cut at data.replay_max_new_tokens={dcfg.replay_max_new_tokens})" if cut else "")
            + f"; kept in the run's {REPLAY_FILE}, which a resume reads back")
    return convs, said


def read_back(dcfg, workdir: str) -> list[list[dict]]:
    """The conversations a run generated when it began (REPLAY_FILE), for a resume; refused in one line when the
    file is gone (the trained params are no longer the base) or its prompts are not data.mix_source's now."""
    path = os.path.join(workdir, REPLAY_FILE)
    setting = f"data.mix_source={dcfg.mix_source!r}"
    if not os.path.isfile(path):
        raise ZooDataError(f"{setting}: {path} is missing, and a resumed run's params are no longer its base's to "
                           f"answer with; start the run afresh, or resume with another data.mix_source")
    with open(path, encoding="utf-8") as f:
        convs = [json.loads(line)["messages"] for line in f if line.strip()]
    if [c[:-1] for c in convs] != prompts_of(dcfg):
        raise ZooDataError(f"{setting}: its prompts are not those the run began with ({path}); resume with the "
                           f"same prompts, or start the run afresh")
    return convs


def file_text(convs: list[list[dict]]) -> str:
    """REPLAY_FILE's text: one {"messages": [...]} a line (a source zoo reads, data.source or data.mix_source)."""
    return "".join(json.dumps({"messages": c}, ensure_ascii=False) + "\n" for c in convs)
