"""Chat / instruction fine-tuning (sft) of a GPT-family model: conversations rendered with the checkpoint's
own chat template, the loss on the assistant's tokens only, examples packed several to a row.

Sources are those zoo reads (`hub:`, local json/jsonl/parquet/csv/tsv; `zoo_commands`, the small chat set zoo
ships: zoo.data.zoo_commands) with either a `data.messages_column` of
conversations (lists of {role, content}: system, user and assistant turns, multi-turn) or
`data.prompt_column` + `data.completion_column` (text: the completion follows the prompt as plain text,
ending in the end-of-text token, as TRL's prompt-completion format; or lists of messages: a conversation
whose answer is the completion). zoo.data.chat renders and masks them: the template is
`data.chat_template` (a .jinja file), else the tokenizer's own, else zoo's documented default; it is
written beside the run (chat_template.jinja), so `zoo-sample --chat` answers in the same format.

The loss falls on the assistant's tokens, each turn's end-of-turn token included (everywhere with
`data.train_on_prompt`), averaged over the answer tokens of the whole batch (the loss is a token sum and
the trainer divides by the summed weights). An example longer than data.seq_len + 1 tokens is truncated
or dropped (`data.truncation`); one with no assistant token left is dropped; both are counted, printed
once. Validation examples are held out by a hash of their rendered text (data.val_fraction).

Packing (`data.packing`, on by default): first fit decreasing into rows of data.seq_len with segment ids
and positions restarting per example (zoo.data.packing); attention never crosses examples. The metrics
carry `real_tokens` beside `tokens` (every position of the rows), so the log shows the real share.
"""

from __future__ import annotations

import dataclasses
import os

import datasets
import jax
import jax.numpy as jnp
import numpy as np

from zoo.data import chat, corpus, packing, zoo_commands
from zoo.data.store import doc_hash, val_documents
from zoo.data.tokenizers import encode_text, get_tokenizer
from zoo.errors import ZooDataError
from zoo.infer.sample import generate
from zoo.models.gpt import output_embedding
from zoo.nn import losses
from zoo.tasks.base import Data
from zoo.tasks import gkd, sft_replay, teacher_cache
from zoo.tasks.lm import LmTask, check_vocab


def template_of(dcfg) -> str:
    """The chat template of a run: data.chat_template's file, else the tokenizer's own, else the default."""
    if dcfg.chat_template:
        path = os.path.expanduser(dcfg.chat_template)
        if not os.path.isfile(path):
            raise ZooDataError(f"data.chat_template={dcfg.chat_template!r}: no such file (a .jinja chat template)")
        return chat.read_template(path, f"data.chat_template={dcfg.chat_template!r}")
    return chat.template_for(dcfg.tokenizer)


def load_rows(dcfg):
    """(the source as a Dataset, its kind: "messages" or "prompt"), its columns checked."""
    if dcfg.source in (zoo_commands.NAME, zoo_commands.GENERAL_NAME):
        convs = zoo_commands.conversations() if dcfg.source == zoo_commands.NAME else zoo_commands.general()
        ds = datasets.Dataset.from_dict({dcfg.messages_column: convs})
    elif dcfg.source.startswith("hub:"):
        ds = corpus.load_hub(dcfg)
    else:
        ds = corpus.load_local(dcfg)
    if dcfg.messages_column in ds.column_names:
        return ds, "messages"
    if dcfg.prompt_column in ds.column_names and dcfg.completion_column in ds.column_names:
        return ds, "prompt"
    raise ZooDataError(f"data.source={dcfg.source!r} has neither a data.messages_column={dcfg.messages_column!r} "
                       f"column (conversations) nor data.prompt_column={dcfg.prompt_column!r} + "
                       f"data.completion_column={dcfg.completion_column!r}; columns: {', '.join(ds.column_names)}")


def encode_rows(dcfg, tokenizer, template: str, conversations: list | None = None):
    """(examples as (ids, mask) pairs, the text each was rendered from, counts of what was cut or dropped): of
    data.source's rows, or of `conversations` given (data.mix_source=replay's)."""
    ds, kind = load_rows(dcfg) if conversations is None else \
        (datasets.Dataset.from_dict({dcfg.messages_column: conversations}), "messages")
    variables = chat.specials(tokenizer, dcfg.tokenizer)
    out, keys = [], []
    counts = {"rows": len(ds), "truncated": 0, "too_long": 0, "no_answer": 0}
    limit = dcfg.seq_len + 1
    for i, row in enumerate(ds):
        if kind == "messages":
            messages = row[dcfg.messages_column]
            chat.check_messages(messages, f"row {i} of data.messages_column={dcfg.messages_column!r}")
            ids, mask = chat.encode_conversation(tokenizer, template, messages, variables,
                                                 train_on_prompt=dcfg.train_on_prompt)
        else:
            prompt, completion = row[dcfg.prompt_column], row[dcfg.completion_column]
            for field in ("prompt_column", "completion_column"):
                col = getattr(dcfg, field)
                if isinstance(row[col], list):  # conversational: lists of messages
                    chat.check_messages(row[col], f"row {i} of data.{field}={col!r}")
            ids, mask = chat.encode_prompt_completion(tokenizer, template, prompt, completion, variables,
                                                      train_on_prompt=dcfg.train_on_prompt)
        if len(ids) > limit:
            if dcfg.truncation == "drop":
                counts["too_long"] += 1
                continue
            counts["truncated"] += 1
            ids, mask = ids[:limit], mask[:limit]
        if len(ids) < 2 or not any(mask[1:]):  # no target is the assistant's: nothing to learn from it
            counts["no_answer"] += 1
            continue
        out.append((np.asarray(ids, np.int32), np.asarray(mask, bool)))
        keys.append(repr(ids))
    return out, keys, counts


def answer_items(dcfg, tokenizer, template: str) -> list[dict]:
    """The rows of a source as zoo.eval.generation items: the prompt's token ids (the conversation up to its last
    assistant message, rendered for the assistant's turn with `template`; or a prompt column's text) and that
    message (or the completion) as the answer. Rows without an assistant answer are left out."""
    ds, kind = load_rows(dcfg)
    variables = chat.specials(tokenizer, dcfg.tokenizer)
    out = []
    for row in ds:
        if kind == "messages":
            msgs = row[dcfg.messages_column]
            last = max((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), default=None)
            if last is None or not msgs[last]["content"].strip():
                continue
            prompt, answer = msgs[:last], msgs[last]["content"]
        else:
            prompt, completion = row[dcfg.prompt_column], row[dcfg.completion_column]
            answer = completion if isinstance(completion, str) else completion[-1]["content"]
        if isinstance(prompt, str):
            ids = encode_text(tokenizer, prompt)
        else:
            text = chat.render(template, prompt, add_generation_prompt=True, variables=variables)
            ids = tokenizer.encode_with_offsets(text)[0]
        if ids and answer.strip():
            out.append({"prompt_ids": ids, "answers": [answer.strip()], "index": len(out)})
    return out


def to_examples(pairs) -> packing.Examples:
    """Inputs, targets and loss weights (on the targets) of (ids, mask) pairs."""
    return packing.Examples([ids[:-1] for ids, _ in pairs], [ids[1:] for ids, _ in pairs],
                            [mask[1:].astype(np.float32) for _, mask in pairs])


def report(dcfg, counts: dict, n_train: int, n_val: int, train: packing.Examples, plan: list, mixed: int = 0) -> str:
    cut = []
    if counts["truncated"]:
        cut.append(f"{counts['truncated']} truncated to data.seq_len + 1 = {dcfg.seq_len + 1} tokens")
    if counts["too_long"]:
        cut.append(f"{counts['too_long']} dropped as longer than {dcfg.seq_len + 1} tokens (data.truncation=drop)")
    if counts["no_answer"]:
        cut.append(f"{counts['no_answer']} dropped with no assistant token (left)")
    layout = (f"packed into {len(plan)} rows" if dcfg.packing else f"one per row, {len(plan)} rows") + \
        f" of {dcfg.seq_len}, {packing.real_fraction(train, plan, dcfg.seq_len):.0%} real tokens"
    mix = f" ({mixed} of them from data.mix_source={dcfg.mix_source}, none held out)" if mixed else ""
    return (f"data: {counts['rows']} examples from {dcfg.source}: {n_train} train{mix}, {n_val} validation"
            + (f"; {'; '.join(cut)}" if cut else "") + f"; train {layout}")


def exact_answers(segment_ids_BT, answer_BT, ok_BT) -> dict:
    """{"answers": examples with answer tokens, "exact": those whose answer tokens are all `ok`}, per
    (row, segment) of packed rows."""
    B, T = segment_ids_BT.shape
    ids = (jnp.arange(B)[:, None] * (T + 1) + segment_ids_BT).reshape(-1)
    has = jax.ops.segment_max(answer_BT.reshape(-1).astype(jnp.int32), ids, num_segments=B * (T + 1))
    wrong = jax.ops.segment_max((answer_BT & ~ok_BT).reshape(-1).astype(jnp.int32), ids, num_segments=B * (T + 1))
    has, wrong = jnp.maximum(has, 0), jnp.maximum(wrong, 0)
    return {"answers": jnp.sum(has).astype(jnp.float32), "exact": jnp.sum(has * (1 - wrong)).astype(jnp.float32)}


class SftTask(LmTask):
    """The causal LM of gpt_lm on packed chat rows: loss on the weighted (assistant) targets only."""

    name = "sft"

    def __init__(self, cfg):
        super().__init__(cfg)
        if cfg.distill.on_policy > 0:  # only then a rollout: the trainer samples on the host for a task that has one
            self.rollout = gkd.OnPolicy(self)

    def loss(self, params, batch, rng, train, teacher=None):
        packing = {"positions_BT": batch["positions"], "segment_ids_BT": batch["segment_ids"]}
        h_BTD, balance = self.hidden(params, batch["inputs"], train, rng, **packing)
        loss_sum, correct, extra = self.token_loss(params, h_BTD, batch, train, teacher, **packing)
        B, T = batch["inputs"].shape
        aux = {"weight": jnp.sum(batch["weights"]), "correct": correct, "tokens": jnp.asarray(B * T, jnp.float32),
               "real_tokens": jnp.sum(batch["segment_ids"] > 0).astype(jnp.float32), **extra}
        if not train:  # an answer greedy decoding reproduces exactly: all its (teacher-forced) tokens correct
            ok_BT = losses.token_correct(h_BTD, output_embedding(self.cfg.model, params), batch["targets"])
            aux.update(exact_answers(batch["segment_ids"], batch["weights"] > 0, ok_BT))
        return self.add_balance(loss_sum, aux, balance, train)

    def train_metrics(self, totals: dict) -> dict:
        return {**super().train_metrics(totals), **gkd.train_metrics(totals)}

    def eval_metrics(self, totals: dict) -> dict:
        return {"eval_exact_match": totals.get("exact", 0.0) / max(totals.get("answers", 0.0), 1.0)}

    @classmethod
    def check_data(cls, cfg, vocab: bool = True):
        if vocab:
            check_vocab(cfg, get_tokenizer(cfg.data.tokenizer))
            template_of(cfg.data)  # the tokenizer's own template, when no file is named
        load_rows(cfg.data)
        if sft_replay.is_replay(cfg.data.mix_source):
            sft_replay.prompts_of(cfg.data)  # the prompts the base will answer, read and checked
        for field in ("eval_source", "mix_source"):  # read as data.source is; an error names its own setting
            if getattr(cfg.data, field) and not (field == "mix_source" and sft_replay.is_replay(cfg.data.mix_source)):
                try:
                    load_rows(dataclasses.replace(cfg.data, source=getattr(cfg.data, field)))
                except ZooDataError as e:
                    raise ZooDataError(str(e).replace("data.source=", f"data.{field}=", 1)) from None
        return cfg

    def make_data(self, cfg, process_index: int, process_count: int) -> Data:
        d = cfg.data
        tokenizer = get_tokenizer(d.tokenizer)
        check_vocab(cfg, tokenizer)
        template = template_of(d)
        pairs, keys, counts = encode_rows(d, tokenizer, template)
        # data.mix_source's examples train beside data.source's and are never held out: validation stays the user's
        files = {"chat_template.jinja": template}
        if sft_replay.is_replay(d.mix_source):
            replayed = getattr(self, "replayed", None)
            if replayed is None:
                raise ZooDataError(f"data.mix_source={d.mix_source!r} needs the base's answers, which the trainer "
                                   f"generates before the data (SftTask.prepare_data); train the run to use it")
            mix = encode_rows(d, tokenizer, template, replayed)[0]
            files[sft_replay.REPLAY_FILE] = sft_replay.file_text(replayed)
        else:
            mix = encode_rows(dataclasses.replace(d, source=d.mix_source), tokenizer, template)[0] if d.mix_source \
                else []
        answers = []
        if d.eval_source:  # the user's own held-out set: all of data.source trains
            held = dataclasses.replace(d, source=d.eval_source)
            val_pairs = encode_rows(held, tokenizer, template)[0]
            train, val = to_examples(pairs + mix), to_examples(val_pairs)
            answers = answer_items(held, tokenizer, template)
            if not pairs or not len(val):
                raise ZooDataError(f"data.source={d.source!r} and data.eval_source={d.eval_source!r} must each hold "
                                   f"an example with assistant tokens")
        else:
            if len(pairs) < 2:
                raise ZooDataError(f"data.source={d.source!r} leaves {len(pairs)} example with assistant tokens; "
                                   f"a train/validation split needs 2")
            is_val = val_documents(np.asarray([doc_hash(k) for k in keys]), d.val_fraction)
            train = to_examples([p for p, v in zip(pairs, is_val) if not v] + mix)
            val = to_examples([p for p, v in zip(pairs, is_val) if v])
        layout = (lambda ex: packing.first_fit_decreasing(ex.lengths, d.seq_len)) if d.packing else \
            (lambda ex: packing.one_per_row(len(ex)))
        plan, val_plan = layout(train), layout(val)
        if process_index == 0:
            print(report(d, counts, len(train), len(val), train, plan, len(mix)), flush=True)
        B = cfg.train.batch_size
        data = Data(train=packing.PackedBatches(train, plan, d.seq_len, B, cfg.train.seed, process_index,
                                                process_count),
                    eval=packing.eval_batches(val, val_plan, d.seq_len, B, cfg.train.eval_batches, process_index,
                                              process_count),
                    tokenizer=tokenizer, files=files, rows=len(plan), answers=answers,
                    packed_examples=len(train) if d.packing else 0)  # epochs of a small set: zoo.training.sizing
        return teacher_cache.deferred(cfg, data, process_index, process_count)  # distill.top_k's rows

    def prepare_data(self, params_of, workdir: str, resume: bool) -> None:
        """data.mix_source=replay: the base's answers (`params_of()`: the params the run starts from) generated, or on
        a resume read back from the run (zoo.tasks.sft_replay); make_data mixes them in."""
        d = self.cfg.data
        if not sft_replay.is_replay(d.mix_source):
            return
        if resume:
            self.replayed = sft_replay.read_back(d, workdir)
            said = f"data.mix_source={d.mix_source}: {len(self.replayed)} base answers read back from the run's " \
                   f"{sft_replay.REPLAY_FILE}"
        else:
            # the model's whole window (as sample's): a base's answer is not cut at data.seq_len
            self.replayed, said = sft_replay.answer(self.model, params_of(), get_tokenizer(d.tokenizer), d,
                                                    template_of(d), self.model.cfg.max_len)
        if jax.process_index() == 0:
            print(said, flush=True)

    def evaluate_extra(self, params, data: Data) -> dict:
        """With data.eval_source: its answers generated greedily and scored (zoo.eval.generation)."""
        if not data.answers:
            return {}
        from zoo.eval import generation
        longest = max(len(data.tokenizer.encode(a["answers"][0])) for a in data.answers)
        r = generation.evaluate(self.model, params, data.tokenizer, self.cfg.data.tokenizer, data.answers,
                                run_dir=None, window=self.cfg.window, max_new_tokens=min(longest + 8, 256))
        return {"eval_answer_exact_match": r["exact"] / r["items"], "eval_answer_contains": r["contained"] / r["items"]}

    def sample(self, params, tokenizer, prompt: str, max_new_tokens: int) -> str:
        """An answer to `prompt` as a user turn, in the run's chat format (temperature 0.8, top-k 40, seed 0)."""
        d = self.cfg.data
        text = chat.render(template_of(d), [{"role": "user", "content": prompt}], add_generation_prompt=True,
                           variables=chat.specials(tokenizer, d.tokenizer))
        ids, _ = tokenizer.encode_with_offsets(text)
        out = generate(self.model, params, ids, max_new_tokens, temperature=0.8, top_k=40, seed=0,
                       eos_id=tokenizer.eot_token,
                       vocab_limit=tokenizer.n_vocab, window=self.model.cfg.max_len)[0]
        return tokenizer.decode(out)
