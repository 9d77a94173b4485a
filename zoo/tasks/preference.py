"""Preference tuning (task=dpo) of a GPT-family model: pairs of a preferred (chosen) and a dispreferred (rejected)
answer to one prompt, and a loss that raises the first against the second relative to a reference model.

Data: TRL's preference formats from any source zoo reads: `data.prompt_column`, `data.chosen_column`,
`data.rejected_column` as plain text (the answer follows the prompt as text, ending in the end-of-text token) or
as lists of messages (the prompt's turns, then the answer's assistant message; rendered with the checkpoint's
chat template, as the chat task renders them: zoo.data.chat). Each pair is two rows, prompt + chosen and
prompt + rejected, run in one forward pass ([B, 2, T]); a row's log-probability is the sum over its answer tokens
only (the chat task's mask: the assistant's tokens and their end-of-turn). A row longer than data.seq_len + 1
tokens keeps its first tokens (TRL's keep_start); a pair left with no answer token in either row (a prompt as
long as the window) is dropped, and a pair whose chosen equals its rejected, both counted in one line.

Losses (beta = dpo.beta, eps = dpo.label_smoothing; pi and ref the summed log-probabilities under the policy and
the reference, |y| an answer's token count):
  delta = (pi(y_w) - ref(y_w)) - (pi(y_l) - ref(y_l))
  sigmoid  DPO (Rafailov et al. 2023, arXiv:2305.18290) with conservative label smoothing (cDPO, Mitchell 2023):
           -(1 - eps) log sigmoid(beta delta) - eps log sigmoid(-beta delta)
  robust   robust DPO (Chowdhury et al. 2024, arXiv:2403.00409), TRL's `robust`:
           (-(1 - eps) log sigmoid(beta delta) + eps log sigmoid(-beta delta)) / (1 - 2 eps)
  ipo      IPO (Azar et al. 2023, arXiv:2310.12036, eq. 17), each log-ratio averaged over its answer's tokens as
           TRL does: (delta_avg - 1 / (2 beta))^2
  simpo    SimPO (Meng et al. 2024, arXiv:2405.14734), reference-free, length-normalised:
           -log sigmoid(beta (pi(y_w) / |y_w| - pi(y_l) / |y_l|) - gamma), gamma = dpo.simpo_gamma
The loss is averaged over the batch's pairs. Metrics, as TRL names them: rewards/chosen and rewards/rejected
(beta times each log-ratio; SimPO: beta times the average log-probability), rewards/accuracies (the share of
pairs whose chosen reward is higher), rewards/margins, logps/chosen, logps/rejected (batch means); training's in
metrics.jsonl, held-out pairs' as eval_rewards/... .

The reference (dpo.reference): a LoRA run's frozen base with the adapters switched off (zoo.nn.lora.adapters_off:
no second copy of the weights, one more forward pass a step), else the initial model's log-probabilities of
every pair, computed once before the first step and kept in the run (WORKDIR/reference_logps.npz: 2 floats a
pair; read back on --resume), so no second model is held either.

Before the first step the run says how the initial model already ranks the held-out pairs (chosen preferred in
n/N, the mean log-prob margin): reward accuracy counts the gain over the reference, so a set the model already
prefers 10/10 can show accuracy 1 while both answers are pushed down (zoo.training.objective_watch warns of that). A
split of fewer than MIN_VAL_PAIRS held-out pairs is refused where the set could hold out more, else warned of.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from zoo.data import chat, corpus, zoo_commands
from zoo.data.store import doc_hash, val_documents
from zoo.data.tokenizers import get_tokenizer
from zoo.errors import ConfigError, ZooDataError
from zoo.models.gpt import output_embedding
from zoo.nn import lora, losses
from zoo.tasks.base import Data
from zoo.tasks.classify import ClsBatches, eval_batches
from zoo.tasks.lm import LmTask, check_vocab
from zoo.tasks.sft import template_of

REFERENCE_FILE = "reference_logps.npz"  # beside a run with dpo.reference=precomputed
# A held-out accuracy over fewer pairs moves in steps of 25 points or more and cannot show a run over-fitting (the
# user's 1-pair split read 1.0 while greedy answers got worse). A set of REFUSE_FROM pairs or more can hold out
# MIN_VAL_PAIRS and still train on 16: there a smaller split is a setting to raise (refused); a smaller set is warned.
MIN_VAL_PAIRS = 4
REFUSE_FROM = 20
METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected")


def load_pairs(dcfg):
    """The source as a Dataset, its prompt, chosen and rejected columns checked (zoo_preferences: zoo's own set,
    zoo.data.zoo_commands.preferences)."""
    if dcfg.source == zoo_commands.PREFERENCES:
        import datasets
        rows = zoo_commands.preferences()
        ds = datasets.Dataset.from_dict({dcfg.prompt_column: [r["prompt"] for r in rows],
                                         dcfg.chosen_column: [r["chosen"] for r in rows],
                                         dcfg.rejected_column: [r["rejected"] for r in rows]})
    elif dcfg.source.startswith("hub:"):
        ds = corpus.load_hub(dcfg)
    else:
        ds = corpus.load_local(dcfg)
    missing = [f"data.{f}={getattr(dcfg, f)!r}" for f in ("prompt_column", "chosen_column", "rejected_column")
               if getattr(dcfg, f) not in ds.column_names]
    if missing:
        raise ZooDataError(f"data.source={dcfg.source!r} has no {', '.join(missing)} column; columns: "
                           f"{', '.join(ds.column_names)} (a preference set has prompt / chosen / rejected)")
    return ds


def _answer(value, where: str):
    """A chosen or rejected answer: text, or a list of messages (checked)."""
    if isinstance(value, list):
        chat.check_messages(value, where)
        if not any(m["content"].strip() for m in value):
            raise ZooDataError(f"{where} is empty; a preference pair needs two answers")
        if not any(m["role"] == "assistant" for m in value):  # the loss falls on the assistant's tokens alone
            roles = sorted({m["role"] for m in value})
            raise ZooDataError(f"{where} holds {' and '.join(repr(r) for r in roles)} messages only; an answer is the "
                               f"assistant's turn: give it role 'assistant' (its tokens are what DPO scores)")
        return value
    if not isinstance(value, str) or not value.strip():
        raise ZooDataError(f"{where} is {'empty' if isinstance(value, str) else type(value).__name__}; a preference "
                           f"pair needs two answers (text or lists of messages)")
    return value


@dataclasses.dataclass
class Pairs:
    """Encoded pairs padded to T: ids [N, 2, T+1] (row 0 chosen, 1 rejected), answer masks on the targets
    [N, 2, T], and the reference log-probabilities ref [N, 2] once computed."""

    ids: np.ndarray
    mask: np.ndarray
    ref: np.ndarray | None = None

    def __len__(self):
        return len(self.ids)

    def rows(self, idx: np.ndarray, weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
        out = {"inputs": self.ids[idx, :, :-1], "targets": self.ids[idx, :, 1:], "weights": self.mask[idx],
               "pair_weights": np.ones(len(idx), np.float32) if weights is None else weights.astype(np.float32)}
        if self.ref is not None:
            out["ref"] = self.ref[idx]
        return out


def encode_pairs(dcfg, tokenizer, template: str):
    """(Pairs of the source, their texts (for the validation split), counts of what was cut or dropped)."""
    ds = load_pairs(dcfg)
    variables = chat.specials(tokenizer, dcfg.tokenizer)
    T = dcfg.seq_len
    counts = {"rows": len(ds), "truncated": 0, "no_answer": 0, "same": 0}
    ids_out, mask_out, keys = [], [], []
    for i, row in enumerate(ds):
        where = f"row {i} of data.source={dcfg.source!r}"
        prompt = row[dcfg.prompt_column]
        if isinstance(prompt, list):
            chat.check_messages(prompt, f"{where}: data.prompt_column")
        chosen = _answer(row[dcfg.chosen_column], f"{where}: data.chosen_column={dcfg.chosen_column!r}")
        rejected = _answer(row[dcfg.rejected_column], f"{where}: data.rejected_column={dcfg.rejected_column!r}")
        if chosen == rejected:
            counts["same"] += 1
            continue
        two = [chat.encode_prompt_completion(tokenizer, template, prompt, a, variables) for a in (chosen, rejected)]
        if any(len(ids) > T + 1 for ids, _ in two):
            counts["truncated"] += 1
            two = [(ids[:T + 1], mask[:T + 1]) for ids, mask in two]
        if not all(any(mask[1:]) for _, mask in two):
            counts["no_answer"] += 1
            continue
        ids = np.zeros((2, T + 1), np.int32)
        mask = np.zeros((2, T), np.float32)
        for r, (row_ids, row_mask) in enumerate(two):
            ids[r, :len(row_ids)] = row_ids
            mask[r, :len(row_ids) - 1] = row_mask[1:]
        ids_out.append(ids)
        mask_out.append(mask)
        keys.append(repr(two[0][0]))
    if not ids_out:
        raise ZooDataError(f"data.source={dcfg.source!r} leaves no preference pair (of {counts['rows']} rows: "
                           f"{counts['same']} with chosen equal to rejected, {counts['no_answer']} with no answer "
                           f"token within data.seq_len={T})")
    return Pairs(np.stack(ids_out), np.stack(mask_out)), keys, counts


def report(dcfg, counts: dict, n_train: int, n_val: int) -> str:
    cut = []
    if counts["same"]:
        cut.append(f"{counts['same']} dropped with chosen equal to rejected")
    if counts["truncated"]:
        cut.append(f"{counts['truncated']} cut to data.seq_len + 1 = {dcfg.seq_len + 1} tokens (their start kept)")
    if counts["no_answer"]:
        cut.append(f"{counts['no_answer']} dropped with no answer token left (a prompt as long as data.seq_len)")
    return (f"data: {counts['rows']} preference pairs from {dcfg.source}: {n_train} train, {n_val} validation"
            + (f"; {'; '.join(cut)}" if cut else ""))


def sequence_logps(h_XTD, w_VD, targets_XT, weights_XT, cap: float = 0.0):
    """float32[X]: each row's summed log-probability of its weighted targets (the fused loss per row: no [X, T, V]
    logits, its own gradient)."""
    def one(h_TD, t_T, w_T):
        return -losses.linear_cross_entropy(h_TD[None], w_VD, t_T[None], w_T[None], logit_cap=cap)[0]
    return jax.vmap(one)(h_XTD, targets_XT, weights_XT)


def pair_loss(pi_B2, ref_B2, lengths_B2, cfg):
    """(loss per pair [B], chosen and rejected rewards [B] each) of log-probabilities summed over the answers
    (`ref_B2` None for a reference-free loss), `cfg` a zoo.configuration.PreferenceConfig: the formulas of the module's
    docstring."""
    beta, eps = cfg.beta, cfg.label_smoothing
    if cfg.loss == "simpo":
        avg = pi_B2 / jnp.maximum(lengths_B2, 1.0)
        margin = beta * (avg[:, 0] - avg[:, 1]) - cfg.simpo_gamma
        return -jax.nn.log_sigmoid(margin), beta * avg[:, 0], beta * avg[:, 1]
    ratio_B2 = pi_B2 - ref_B2
    delta = ratio_B2[:, 0] - ratio_B2[:, 1]
    if cfg.loss == "sigmoid":
        loss = -(1 - eps) * jax.nn.log_sigmoid(beta * delta) - eps * jax.nn.log_sigmoid(-beta * delta)
    elif cfg.loss == "robust":
        loss = (-(1 - eps) * jax.nn.log_sigmoid(beta * delta) + eps * jax.nn.log_sigmoid(-beta * delta)) / (1 - 2 * eps)
    else:  # ipo
        avg = ratio_B2 / jnp.maximum(lengths_B2, 1.0)
        loss = (avg[:, 0] - avg[:, 1] - 1 / (2 * beta)) ** 2
    return loss, beta * ratio_B2[:, 0], beta * ratio_B2[:, 1]


class DpoTask(LmTask):
    """Preference tuning of a decoder on chosen / rejected pairs (the module's docstring)."""

    name = "dpo"
    PERPLEXITY = False  # a preference loss is no per-token loss of text
    WATCH = "preference"  # zoo.training.objective_watch: the chosen log-prob watched against the margin
    UNIFORM_OVER_VOCAB = False

    def __init__(self, cfg):
        super().__init__(cfg)
        self.reference = cfg.dpo.reference_of(cfg.model.lora_spec is not None)

    def logps(self, params, batch, train, rng):
        """(summed answer log-probabilities [B, 2], answer token counts [B, 2]) of a pair batch."""
        B, _, T = batch["inputs"].shape
        h_XTD, balance = self.hidden(params, batch["inputs"].reshape(2 * B, T), train, rng)
        w_XT = batch["weights"].reshape(2 * B, T)
        lp_X = sequence_logps(h_XTD, output_embedding(self.cfg.model, params), batch["targets"].reshape(2 * B, T), w_XT,
                              self.cfg.model.final_softcap)
        return lp_X.reshape(B, 2), jnp.sum(batch["weights"], -1), balance

    def loss(self, params, batch, rng, train):
        pi_B2, lengths_B2, balance = self.logps(params, batch, train, rng)
        if self.reference == "base":  # the frozen base: the same params, the adapters switched off
            with lora.adapters_off():
                ref_B2 = jax.lax.stop_gradient(self.logps(params, batch, False, rng)[0])
        else:
            ref_B2 = batch.get("ref")
        loss_B, chosen_B, rejected_B = pair_loss(pi_B2, ref_B2, lengths_B2, self.cfg.dpo)
        w_B = batch["pair_weights"]
        won_B = (chosen_B > rejected_B).astype(jnp.float32)
        B, _, T = batch["inputs"].shape
        aux = {"weight": jnp.sum(w_B), "correct": jnp.sum(won_B * w_B), "tokens": jnp.asarray(2 * B * T, jnp.float32),
               "rewards_chosen": jnp.sum(chosen_B * w_B), "rewards_rejected": jnp.sum(rejected_B * w_B),
               "margins": jnp.sum((chosen_B - rejected_B) * w_B), "logps_chosen": jnp.sum(pi_B2[:, 0] * w_B),
               "logps_rejected": jnp.sum(pi_B2[:, 1] * w_B)}
        return self.add_balance(jnp.sum(loss_B * w_B), aux, balance, train)

    def train_metrics(self, totals: dict) -> dict:
        """TRL's names, from the summed aux of the steps logged."""
        n = max(totals.get("weight", 0.0), 1e-9)
        return {"rewards/chosen": totals["rewards_chosen"] / n, "rewards/rejected": totals["rewards_rejected"] / n,
                "rewards/accuracies": totals["correct"] / n, "rewards/margins": totals["margins"] / n,
                "logps/chosen": totals["logps_chosen"] / n, "logps/rejected": totals["logps_rejected"] / n}

    def eval_metrics(self, totals: dict) -> dict:
        return {f"eval_{k}": v for k, v in self.train_metrics(totals).items()}

    def flops_per_token(self, seq_len):
        """The decoder's, and (a base as reference) one more forward pass: 2N + attention's third per token."""
        fpt = super().flops_per_token(seq_len)
        return fpt * 4 / 3 if self.reference == "base" else fpt

    @classmethod
    def check_data(cls, cfg, vocab: bool = True):
        if cfg.dpo.reference_of(cfg.model.lora_spec is not None) == "precomputed" and jax.process_count() > 1:
            raise ConfigError("dpo.reference=precomputed computes the reference on one process; train LoRA adapters "
                              "(model.lora_rank: the base is the reference) to run on several")
        if vocab:
            check_vocab(cfg, get_tokenizer(cfg.data.tokenizer))
            template_of(cfg.data)
        load_pairs(cfg.data)
        return cfg

    def make_data(self, cfg, process_index: int, process_count: int) -> Data:
        d = cfg.data
        tokenizer = get_tokenizer(d.tokenizer)
        check_vocab(cfg, tokenizer)
        template = template_of(d)
        pairs, keys, counts = encode_pairs(d, tokenizer, template)
        if len(pairs) < 2:
            raise ZooDataError(f"data.source={d.source!r} leaves {len(pairs)} preference pair; a train/validation "
                               f"split needs 2")
        is_val = val_documents(np.asarray([doc_hash(k) for k in keys]), d.val_fraction)
        if is_val.all() or not is_val.any():  # a tiny set: one pair held out at least, one trained
            is_val = np.zeros(len(pairs), bool)
            is_val[-1] = True
        check_split(d, int(is_val.sum()), len(pairs), process_index == 0)
        train, val = (Pairs(pairs.ids[m], pairs.mask[m]) for m in (~is_val, is_val))
        if self.reference == "precomputed":
            train.ref, val.ref = np.zeros((len(train), 2), np.float32), np.zeros((len(val), 2), np.float32)
        if process_index == 0:
            print(report(d, counts, len(train), len(val)), flush=True)
        B = cfg.train.batch_size
        return Data(train=ClsBatches(train, B, cfg.train.seed, process_index, process_count),
                    eval=eval_batches(val, B, cfg.train.eval_batches, process_index, process_count),
                    tokenizer=tokenizer, files={"chat_template.jinja": template}, rows=len(train),
                    examples={"train": train, "eval": val})

    def prepare(self, params, data: Data, workdir: str, resume: bool, mesh) -> None:
        """dpo.reference=precomputed: the reference log-probabilities of every pair, from the initial params, before
        the first step (read back from WORKDIR/REFERENCE_FILE on a resume, where the params moved on). A fresh run
        then says how its initial model ranks the held-out pairs (`held_out_line`)."""
        train, val = data.examples["train"], data.examples["eval"]
        if self.reference == "precomputed":
            path = os.path.join(workdir, REFERENCE_FILE)
            if resume and os.path.isfile(path):
                with np.load(path) as f:
                    train.ref, val.ref = f["train"], f["eval"]
            else:
                train.ref, val.ref = self.all_logps(params, train), self.all_logps(params, val)
                tmp = path + ".tmp.npz"
                np.savez(tmp, train=train.ref, eval=val.ref)
                os.replace(tmp, path)
            data.eval[:] = eval_batches(val, self.cfg.train.batch_size, self.cfg.train.eval_batches)
        if not resume and jax.process_count() == 1:  # several processes: each would print; the eval pass says it
            n = min(len(val), self.cfg.train.eval_batches * self.cfg.train.batch_size)  # the pairs evaluated
            print(held_out_line(val.ref[:n] if self.reference == "precomputed" else
                                self.all_logps(params, val, n)), flush=True)

    def all_logps(self, params, ex: Pairs, n: int | None = None) -> np.ndarray:
        """float32[n, 2]: the summed answer log-probabilities of the first `n` pairs of `ex` (all: None) under
        `params` (a LoRA run's adapters left out: its base), 16 pairs a call."""
        logps = jax.jit(lambda p, b: self.logps(p, b, False, jax.random.PRNGKey(0))[0])
        n = len(ex) if n is None else n
        out = [np.asarray(logps(params, ex.rows(np.arange(i, min(i + 16, n))))) for i in range(0, n, 16)]
        return np.concatenate(out).astype(np.float32) if out else np.zeros((0, 2), np.float32)


def held_out_line(lp_N2: np.ndarray) -> str:
    """How a model ranks held-out pairs, as the shipped config's results say it (zoo.cli.results)."""
    n, won = len(lp_N2), int((lp_N2[:, 0] > lp_N2[:, 1]).sum())
    line = (f"before training: chosen preferred in {won}/{n} held-out pairs, mean log-prob margin "
            f"{float(np.mean(lp_N2[:, 0] - lp_N2[:, 1])) if n else 0.0:+.2f}")
    return line + (" (all already preferred: DPO can only widen their margins; watch logps/chosen)"
                   if n and won == n else "")


def check_split(dcfg, n_val: int, n: int, main: bool = True) -> None:
    """Refuse (ConfigError) a validation split of fewer than MIN_VAL_PAIRS pairs of a set of REFUSE_FROM or more;
    warn of one in a smaller set (which holds out one pair at least: make_data)."""
    if n_val >= MIN_VAL_PAIRS:
        return
    frac = min(0.5, math.ceil(100 * 2 * MIN_VAL_PAIRS / n) / 100)  # twice MIN_VAL_PAIRS expected: hashing varies
    what = (f"data.val_fraction={dcfg.val_fraction:g} holds out {n_val} of the {n} preference pairs; a held-out "
            f"accuracy over fewer than {MIN_VAL_PAIRS} pairs moves in steps of {100 // n_val} points and cannot show "
            f"a run over-fitting")
    if n >= REFUSE_FROM:
        raise ConfigError(f"{what}: set data.val_fraction >= {frac:g} (at least {MIN_VAL_PAIRS} pairs)")
    if main:
        print(f"warning: {what}; judge this run by its answers (zoo-sample) or add pairs (with {REFUSE_FROM} or more, "
              f"data.val_fraction >= {min(0.5, 2 * MIN_VAL_PAIRS / REFUSE_FROM):g} holds out enough)",
              file=sys.stderr, flush=True)
