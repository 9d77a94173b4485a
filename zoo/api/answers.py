"""Pretrained.logprobs(prompts, answers=...): the log-probability of an answer given its prompt, the answer's
tokens only, as a preference run (zoo.tasks.preference, task=dpo) scores a pair's chosen or rejected answer.

A pair is encoded by the call a DPO run encodes its rows with (zoo.data.chat.encode_prompt_completion, with the
run's chat template and special tokens), in TRL's two formats: a text prompt and a text answer as one text
(prompt + answer, the checkpoint's BOS first where its tokenizer adds one, the end-of-text id after the answer),
or a conversation (a list of {"role", "content"} dicts) and the assistant's answer (a string, or a list of
messages) rendered with the template. The tokens scored are those DPO's loss sums over (the answer's, with its
end-of-turn), less any assistant turn of the prompt itself: DPO's mask covers every assistant turn of the rendered
conversation, and a prompt's turns are no part of its answer. A pair that does not fit the model's window is
refused (DPO keeps a long row's start and loses the answer's end).

Each pair is one row, read up to its last answer token and scored as Pretrained.logprobs scores texts
(zoo.eval.loglik.score_tokens: the fused output projection of the trainer's loss, float32, batched and bucketed);
an answer's sum is DPO's summed log-probability of it (logps/chosen) to float32 rounding.
"""

from __future__ import annotations

import numpy as np

from zoo.errors import ArgumentError, ZooDataError


def _is_conversation(value) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(m, dict) for m in value)


def _one(value) -> bool:
    """Whether `value` is one prompt or one answer (a text or a list of messages), not a list of them."""
    return isinstance(value, str) or _is_conversation(value)


def pairs_of(prompts, answers) -> tuple[list, list, bool]:
    """(prompts, answers, whether one pair was given), each prompt a text or a conversation and each answer a text
    or a list of messages, one answer per prompt; ArgumentError in one line otherwise."""
    from zoo.api.decoder import _short
    shape = ("a text, a conversation (a list of {'role', 'content'} dicts), or a non-empty list of texts or "
             "conversations")
    if _one(prompts):
        if not _one(answers):
            raise ArgumentError(f"answers={_short(answers)}: one prompt was given; give its answer (a non-empty "
                                f"string, or the assistant's messages)")
        return [prompts], [answers], True
    if not isinstance(prompts, (list, tuple)) or not prompts or not all(_one(p) for p in prompts):
        raise ArgumentError(f"prompts={_short(prompts)}: give {shape}")
    if not isinstance(answers, (list, tuple)) or _is_conversation(answers) or len(answers) != len(prompts):
        got = f"{len(answers)}" if isinstance(answers, (list, tuple)) and not _is_conversation(answers) else \
            _short(answers)
        raise ArgumentError(f"answers: {got} for {len(prompts)} prompts; give a list of one answer per prompt "
                            f"(a non-empty string, or the assistant's messages)")
    return list(prompts), list(answers), False


def _checked(prompt, answer, where: str):
    """(prompt, answer) as encode_prompt_completion takes them: a conversation's string answer becomes the
    assistant's message. ArgumentError naming `where` for an empty or ill-typed one."""
    from zoo.api.decoder import _short, utf8
    from zoo.data.chat import check_messages
    if isinstance(prompt, str):
        if not prompt:
            raise ArgumentError(f"{where}: the prompt is empty; give the text the answer follows")
        utf8(prompt, f"{where}: the prompt")
    else:
        prompt = list(prompt)
        try:
            check_messages(prompt, f"{where}: the prompt")
        except ZooDataError as e:
            raise ArgumentError(str(e)) from None
        for j, m in enumerate(prompt):
            utf8(m["content"], f"{where}: the prompt's message {j}")
    if isinstance(answer, str):
        if not answer.strip():
            raise ArgumentError(f"{where}: the answer is {'empty' if not answer else 'blank'}; give the text to score")
        utf8(answer, f"{where}: the answer")
        return prompt, answer if isinstance(prompt, str) else [{"role": "assistant", "content": answer}]
    if not isinstance(answer, (list, tuple)):
        raise ArgumentError(f"{where}: the answer is {_short(answer)}; give a string or the assistant's messages")
    answer = list(answer)
    try:
        check_messages(answer, f"{where}: the answer")
    except ZooDataError as e:
        raise ArgumentError(str(e)) from None
    if isinstance(prompt, str):
        raise ArgumentError(f"{where}: a text prompt with an answer of messages; give the prompt as a conversation "
                            f"(a list of messages) or the answer as a string")
    if not any(m["role"] == "assistant" and m["content"].strip() for m in answer):
        raise ArgumentError(f"{where}: the answer has no non-empty assistant message; an answer is the assistant's "
                            f"turn (its tokens are what is scored)")
    for j, m in enumerate(answer):
        utf8(m["content"], f"{where}: the answer's message {j}")
    return prompt, answer


def encode(lm, prompt, answer) -> tuple[list[int], list[int]]:
    """(ids of the pair's row, the positions in it of the answer's tokens scored) of a checked pair: the row as
    a DPO run of this checkpoint encodes it (zoo.tasks.preference.encode_pairs), its mask less the prompt's own
    tokens (those of the prompt rendered alone for the assistant's turn, where the two agree token for token)."""
    from zoo.data import chat
    tok, name = lm.tokenizer, lm.config.data.tokenizer
    template = chat.template_for(name, lm.run_dir)
    ids, mask = chat.encode_prompt_completion(tok, template, prompt, answer, chat.specials(tok, name))
    start = 1  # the first id has nothing before it to be predicted from (DPO's targets are ids[1:] too)
    if not isinstance(prompt, str):
        from zoo.infer.chat import prompt_ids
        alone = prompt_ids(tok, name, prompt, lm.run_dir)
        common = 0
        while common < min(len(ids), len(alone)) and ids[common] == alone[common]:
            common += 1
        start = max(start, common)
    return ids, [k for k in range(start, len(ids)) if mask[k]]


def answer_logprobs(lm, prompts, answers, batch_size: int = 8):
    """float32[answer tokens] per pair (one array for one pair, else a list): see Pretrained.logprobs."""
    from zoo.eval.loglik import Row, score_tokens
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ArgumentError(f"batch_size={batch_size!r} must be a whole number >= 1")
    ps, answers, single = pairs_of(prompts, answers)
    window, vocab = lm.config.window, lm.config.model.vocab_size
    rows, scored = [], []
    for i, (p, a) in enumerate(zip(ps, answers)):
        where = "the pair" if single else f"pair {i}"
        ids, positions = encode(lm, *_checked(p, a, where))
        if not positions:
            raise ArgumentError(f"{where}: the answer gives no token to score (the template writes none of it)")
        first, last = positions[0], positions[-1]
        if last > window:
            raise ArgumentError(f"{where}: the prompt and answer need a window of {last} tokens, beyond the model's "
                                f"{window}; shorten the prompt")
        if max(ids[:last + 1]) >= vocab:
            raise ArgumentError(f"{where}: the tokenizer gives id {max(ids[:last + 1])}, beyond the model's {vocab} "
                                f"tokens")
        rows.append(Row(tuple(ids[:last + 1]), last + 1 - first))
        scored.append(np.asarray(positions) - first)
    model, params = lm.decoding()
    per_row = score_tokens(model, params, rows, batch_size=batch_size, max_len=window)
    out = [lp[k] for lp, k in zip(per_row, scored)]
    return out[0] if single else out
