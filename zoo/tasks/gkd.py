"""On-policy distillation (GKD: Agarwal et al. 2024, arXiv:2306.13649; TRL's GKDTrainer) for task=sft with a
distill.teacher: on a share of the steps the student trains on its own answers to the batch's prompts, graded
token by token by the teacher, instead of on the data's answers.

Which steps (`chosen`): a uniform draw from (train.seed, step) below distill.on_policy (TRL's lmbda), so a resumed
run picks the same steps. TRL draws from Python's global `random` at each step; the share is the same.

What an on-policy step trains (`OnPolicy.__call__`, the task's `rollout`, run on the host before the step as GRPO's
is: zoo.training.trainer):

1. the prompts: each packed example of the batch's rows up to its last assistant answer (the tokens before the
   example's last run of weighted targets: TRL's DataCollatorForChatML prompts with the conversation less its last
   assistant message; earlier turns keep the data's answers as context, unweighted);
2. the answers: the batched KV-cached sampler (zoo.infer.sample.generate_batch) on the current student (a LoRA run's
   adapters merged), at distill.sample_temperature (0: greedy), at most distill.max_new_tokens each (prompts that
   leave less of the model's window are sampled apart, to what the longest of them leaves), stopping at the
   tokenizer's end ids, seeded from (train.seed, step) as GRPO's samples are;
3. the rows: each row holds its own examples again, prompt + sampled answer (+ the end id it stopped at), packed in
   their order with segment ids and positions restarting per example, as sft packs them; the sampled tokens are
   the weighted targets. An example that no longer fits its row (its answer longer than the data's) goes to the
   first row with room, else is left out of this step (sample_kept says the share kept); a row's first example,
   alone, is cut to the row instead.

The batch keeps the packed sft batch's keys, shapes and dtypes (inputs, targets, weights, positions, segment_ids),
plus `on_policy` (float32[B], zoo.tasks.distill.ON_POLICY), 1 on the sampled rows and 0 on an off-policy step's:
one compiled step serves both. Off-policy steps train the data batch itself (with that flag at 0).

The loss: a row flagged on-policy is trained on the divergence alone (alpha taken as 1: TRL's GKD puts no
cross-entropy on the student's own samples; a cross-entropy toward them would teach the student what it already
says); the data's rows keep distill.alpha's mix of divergence and cross-entropy (TRL's GKD has none there; set
distill.alpha=1 for its loss on every step). distill.temperature scales the divergence as before; TRL's GKD computes
it at temperature 1 whatever its sampling temperature.

Metrics (host sums over the logged steps, as GRPO's): on_policy_share (the share of the steps logged that sampled),
sample_length (the sampled answers' mean length in tokens, their end id included), sample_kept (the share of them
the rows held) and gen_seconds (the sampling).
TRL's seq_kd (answers sampled from the teacher on the other steps) is not here: the host holds no teacher to sample.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from zoo.errors import ConfigError
from zoo.nn import lora
from zoo.tasks.distill import ON_POLICY


def chosen(seed: int, step: int, share: float) -> bool:
    """Whether `step` trains on the student's own answers: a uniform draw from (seed, step) below `share`."""
    if share <= 0:
        return False
    return bool(np.random.default_rng((seed, step, 0x6B64)).random() < share)  # random() < 1 always: share 1 is all


def prompts_of(batch: dict) -> list[list[tuple[int, list[int]]]]:
    """Each row's examples' prompts, in order: (segment id, the tokens before the example's last run of weighted
    targets). An example without a weighted target has none."""
    out = []
    for inputs, weights, seg in zip(batch["inputs"], batch["weights"], batch["segment_ids"]):
        row = []
        for s in np.unique(seg[seg > 0]):
            at = np.flatnonzero(seg == s)  # the example's positions, contiguous
            w = weights[at] > 0
            if not w.any():
                continue
            starts = np.flatnonzero(w & ~np.concatenate([[False], w[:-1]]))  # where each weighted run begins
            # target j is token j + 1 of the example: the answer's first token follows inputs[at[0]..at[j]]
            row.append((int(s), inputs[at[0]:at[starts[-1]] + 1].tolist()))
        out.append(row)
    return out


def pack(rows: list[list[tuple[list[int], int]]], B: int, T: int) -> tuple[dict[str, np.ndarray], int]:
    """(the [B, T] batch in zoo.data.packing's layout, how many examples it holds) of rows of (example ids, prompt
    length): inputs ids[:-1], targets ids[1:], the targets after the prompt weighted (the answer). An example goes
    to its own row, else to the first row with room, else is left out; a row's first example, alone in its row, is
    cut to the row (its prompt fits: it came from a row)."""
    out = {k: np.zeros((B, T), np.int32) for k in ("inputs", "targets", "positions", "segment_ids")}
    out["weights"] = np.zeros((B, T), np.float32)
    used, segs, kept = [0] * B, [0] * B, 0
    for own, examples in enumerate(rows):
        for ids, prompt in examples:
            n = len(ids) - 1  # positions the example takes
            if used[own] == 0 and n > T:
                ids, n = ids[:T + 1], T
            b = next((r for r in [own, *range(B)] if used[r] + n <= T), None)
            if b is None:
                continue
            at, segs[b], kept = used[b], segs[b] + 1, kept + 1
            out["inputs"][b, at:at + n], out["targets"][b, at:at + n] = ids[:-1], ids[1:]
            out["weights"][b, at + prompt - 1:at + n] = 1.0
            out["segment_ids"][b, at:at + n], out["positions"][b, at:at + n] = segs[b], np.arange(n)
            used[b] += n
    return out, kept


class OnPolicy:
    """An sft task's `rollout` when distill.on_policy > 0 (the module's docstring)."""

    def __init__(self, task):
        self.task, self.cfg = task, task.cfg

    def sample(self, params, prompts: list[list[int]], tokenizer, seed: int) -> list[list[int]]:
        """Each prompt's sampled answer, ending in the end id it stopped at (none when cut at the length cap): up to
        distill.max_new_tokens, or for prompts that leave less of the window, what the longest of them leaves."""
        from zoo.infer.sample import generate_batch, scanned, stop_ids
        d, window = self.cfg.distill, self.cfg.window
        model, student = scanned(self.task.model, lora.merge(params, self.cfg.model.lora_spec))
        fits = [len(p) + d.max_new_tokens <= window for p in prompts]
        out: list = [None] * len(prompts)
        for part in (True, False):  # at most two programs a step: the batched sampler takes one length cap
            idx = [i for i, f in enumerate(fits) if f == part]
            if not idx:
                continue
            n_new = d.max_new_tokens if part else window - max(len(prompts[i]) for i in idx)
            got = generate_batch(model, student, [prompts[i] for i in idx], n_new, temperature=d.sample_temperature,
                                 seed=seed, eos_id=stop_ids(tokenizer), vocab_limit=tokenizer.n_vocab, window=window,
                                 keep_end=True)
            for i, answer in zip(idx, got):
                out[i] = answer
        return out

    def __call__(self, params, batch: dict, step: int, data) -> tuple[dict, dict]:
        """(the step's batch, its host metrics): the data batch on an off-policy step, else the student's answers."""
        if jax.process_count() > 1:
            raise ConfigError(f"distill.on_policy={self.cfg.distill.on_policy} samples on one process; this run has "
                              f"{jax.process_count()}: run it as one, or set distill.on_policy=0")
        t = time.perf_counter()
        B, T = batch["inputs"].shape
        host = {"gkd_steps": 1.0, "on_policy_steps": 0.0}
        flag = np.zeros((B,), np.float32)
        seed = self.cfg.train.seed
        # prompts the window leaves room to answer (a prompt is at most a row: T <= the window)
        where = [[(s, p) for s, p in row if len(p) < self.cfg.window] for row in prompts_of(batch)]
        flat = [p for row in where for _, p in row]
        if not chosen(seed, step, self.cfg.distill.on_policy) or not flat:
            return {**batch, ON_POLICY: flag}, host
        answers = iter(self.sample(params, flat, data.tokenizer, (seed * 1_000_003 + step) % (2 ** 31)))
        rows, lengths = [], []
        for row in where:
            rows.append([])
            for _, prompt in row:
                answer = next(answers)
                lengths.append(len(answer))
                rows[-1].append((prompt + answer, len(prompt)))
        out, kept = pack(rows, B, T)
        flag[:] = 1.0
        host.update(on_policy_steps=1.0, sampled_answers=float(len(lengths)), sampled_tokens=float(sum(lengths)),
                    kept_answers=float(kept), gen_seconds=time.perf_counter() - t)
        return {**out, ON_POLICY: flag}, host


def train_metrics(totals: dict) -> dict:
    """on_policy_share, sample_length and gen_seconds from the rollouts' host sums (nothing without a rollout)."""
    if "gkd_steps" not in totals:
        return {}
    out = {"on_policy_share": totals["on_policy_steps"] / max(totals["gkd_steps"], 1.0),
           "gen_seconds": totals.get("gen_seconds", 0.0)}
    if totals.get("sampled_answers", 0.0):
        out["sample_length"] = totals["sampled_tokens"] / totals["sampled_answers"]
        out["sample_kept"] = totals["kept_answers"] / totals["sampled_answers"]
    return out
