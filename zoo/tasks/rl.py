"""Reinforcement learning from rewards (task=grpo) of a GPT-family model: GRPO (Shao et al. 2024, DeepSeekMath,
arXiv:2402.03300) on the one trainer.

Data: prompts from any source zoo reads (`data.prompt_column`: text, or a list of messages rendered with the
checkpoint's chat template for the assistant's turn; `zoo_arithmetic`: zoo's own offline questions); the source's
other columns (an expected answer) go to the rewards. A step takes `train.batch_size` prompts and:

1. samples `grpo.num_generations` (G) completions of each with the batched KV-cached sampler (zoo.infer.sample.
   generate_batch: the same program zoo.load(...).generate runs; temperature 0 is its greedy decoding) on the run's
   params (a LoRA run's adapters merged), with a key that is a function of (train.seed, step): a resumed run
   samples the same completions;
2. scores them with the reward functions (plain Python, outside jit, TRL's signature: zoo.rewards; loaded, called and checked by
   zoo.tasks.reward_calls), summed with
   `grpo.reward_weights`;
3. normalises each reward within its group: advantage = (r - mean) / (std + 1e-4) (std with Bessel's correction,
   as TRL's scale_rewards="group");
4. takes one gradient step on the clipped objective, per completion token t:
       -min(ratio_t A, clip(ratio_t, 1 - eps, 1 + eps) A) + beta KL_t
   ratio_t = pi(t) / pi_old(t) (log-probabilities under the logits divided by grpo.temperature, the distribution
   sampled, as TRL takes them), pi_old the policy that sampled (one step per sample, TRL's num_iterations=1:
   ratio 1, its gradient the policy gradient), KL_t = exp(ref - pi) - (ref - pi) - 1 (Schulman's k3 estimator),
   ref the reference: a LoRA run's base with the adapters off (zoo.nn.lora.adapters_off; no second copy of the
   weights). Full fine-tuning has no reference to hand, so it needs grpo.beta=0.
   Averaged (`grpo.loss_type`, TRL's names): bnpo over every completion token of the batch (DAPO, Yu et al.
   2025, arXiv:2503.14476; TRL's default `dapo` on one process), grpo over each completion's tokens then the
   completions (DeepSeekMath), dr_grpo over completions x max_completion_tokens (Dr. GRPO, Liu et al. 2025,
   arXiv:2503.20783).

Metrics per logged step, as TRL names them (`reward_sums`): reward (the mean over the completions), reward_std (the
standard deviation of each step's whole batch of rewards, as TRL 1.16 logs it; the advantages divide by each
group's), frac_reward_zero_std (the share of completions in groups whose rewards all tie: no advantage), each reward
function's mean as rewards/NAME, kl, completion_length, completions/clipped_ratio (the share of completions that
reached grpo.max_completion_tokens without ending), clip_ratio, and gen_seconds (sampling and scoring) beside
seconds (the whole interval); at each evaluation the held-out prompts' greedy completions are scored: eval_reward,
eval_rewards/NAME.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from zoo.data import arithmetic, chat, corpus
from zoo.data.batches import EpochOrder, process_rows
from zoo.data.store import doc_hash, val_documents
from zoo.data.tokenizers import encode_text, get_tokenizer
from zoo.errors import ConfigError, TrainError, ZooDataError
from zoo.models.gpt import output_embedding
from zoo.nn import lora, losses
from zoo.tasks.base import Data
from zoo.tasks.lm import LmTask, check_vocab
from zoo.tasks.reward_calls import RewardInterrupt, call_reward, load_rewards, weights_of  # (rl.X: read by others)
from zoo.tasks.sft import template_of


def load_prompts(dcfg):
    """The source as a Dataset, its prompt column checked (zoo_arithmetic: zoo's own questions)."""
    import datasets
    if dcfg.source == arithmetic.NAME:
        rows = arithmetic.rows()
        ds = datasets.Dataset.from_dict({dcfg.prompt_column: [r["prompt"] for r in rows],
                                         "answer": [r["answer"] for r in rows]})
    elif dcfg.source.startswith("hub:"):
        ds = corpus.load_hub(dcfg)
    else:
        ds = corpus.load_local(dcfg)
    if dcfg.prompt_column not in ds.column_names:
        raise ZooDataError(f"data.source={dcfg.source!r} has no data.prompt_column={dcfg.prompt_column!r} column; "
                           f"columns: {', '.join(ds.column_names)}")
    return ds



@dataclasses.dataclass
class PromptSet:
    """Encoded prompts (ids of each), the source's value of each (text or messages), its other columns, and each
    prompt's row in the source (what an error names)."""

    ids: list[list[int]]
    prompts: list
    columns: dict
    where: list[int]

    def __len__(self):
        return len(self.ids)

    def take(self, idx) -> "PromptSet":
        idx = list(idx)
        return PromptSet([self.ids[i] for i in idx], [self.prompts[i] for i in idx],
                         {k: [v[i] for i in idx] for k, v in self.columns.items()}, [self.where[i] for i in idx])


class PromptBatches:
    """step -> this process's prompt indices of the global batch (epoch-wise permutations from (seed, epoch))."""

    def __init__(self, n: int, global_batch: int, seed: int, process_index: int = 0, process_count: int = 1):
        self.order, self.rows = EpochOrder(n, global_batch, seed), process_rows(global_batch, process_index,
                                                                                 process_count)

    def __call__(self, step: int) -> dict:
        return {"index": self.order(step)[self.rows]}


def group_advantages(rewards_R: np.ndarray, G: int) -> np.ndarray:
    """(r - mean) / (std + 1e-4) within each group of G completions of one prompt (std: Bessel's correction)."""
    r = rewards_R.reshape(-1, G).astype(np.float64)
    return ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-4)).reshape(-1).astype(np.float32)


def reward_sums(total_R: np.ndarray, per_RF: np.ndarray, names: list[str], G: int) -> dict:
    """One rollout's reward figures as sums over the logged steps (GrpoTask.train_metrics divides), as TRL 1.16's
    GRPOTrainer logs them: reward the mean; reward_std the standard deviation of the step's whole batch of rewards
    (Bessel's correction; not the groups' that the advantages divide by), averaged over the steps logged;
    frac_reward_zero_std the share of completions whose group's rewards all tie (std 0: no advantage, no
    gradient); each reward function's mean."""
    total = np.asarray(total_R, np.float64)
    zero = np.isclose(total.reshape(-1, G).std(1, ddof=1), 0.0)  # torch.isclose's tolerances, as TRL tests it
    return {"reward_sum": float(total.sum()), "reward_std_sum": float(total.std(ddof=1)) if total.size > 1 else 0.0,
            "rollouts": 1.0, "zero_std_completions": float(G * zero.sum()), "completions": float(total.size),
            **{f"reward_sum/{n}": float(per_RF[:, k].sum()) for k, n in enumerate(names)}}


class GrpoTask(LmTask):
    """GRPO on the one trainer (the module's docstring)."""

    name = "grpo"
    PERPLEXITY = False
    WATCH = "reward"  # zoo.training.objective_watch: reward, KL and completion length watched; the best reward's step kept
    UNIFORM_OVER_VOCAB = False

    def __init__(self, cfg):
        super().__init__(cfg)
        self.lora = cfg.model.lora_spec

    # ---- data ---------------------------------------------------------------------------------------------
    @classmethod
    def check_data(cls, cfg, vocab: bool = True):
        if cfg.grpo.beta > 0 and cfg.model.lora_spec is None:
            raise ConfigError(f"grpo.beta={cfg.grpo.beta} penalises the distance to a reference, which only a LoRA run "
                              f"has for free (its base): train adapters (model.lora_rank) or set grpo.beta=0")
        if vocab:
            check_vocab(cfg, get_tokenizer(cfg.data.tokenizer))
            template_of(cfg.data)
        load_prompts(cfg.data)
        load_rewards(cfg.grpo)
        if cfg.window - cfg.grpo.max_completion_tokens < 1:
            raise ConfigError(f"grpo.max_completion_tokens={cfg.grpo.max_completion_tokens} leaves no room for a "
                              f"prompt in the model's {cfg.window}-token context")
        return cfg

    def encode(self, dcfg, tokenizer, template) -> PromptSet:
        ds = load_prompts(dcfg)
        variables = chat.specials(tokenizer, dcfg.tokenizer)
        room = self.cfg.window - self.cfg.grpo.max_completion_tokens
        ids, prompts = [], []
        for i, p in enumerate(ds[dcfg.prompt_column]):
            if isinstance(p, list):
                chat.check_messages(p, f"row {i} of data.prompt_column={dcfg.prompt_column!r}")
                row = tokenizer.encode_with_offsets(chat.render(template, p, add_generation_prompt=True,
                                                                variables=variables))[0]
            elif isinstance(p, str) and p:
                row = encode_text(tokenizer, p)
            else:
                raise ZooDataError(f"row {i} of data.prompt_column={dcfg.prompt_column!r} is {p!r}; give a text or a "
                                   f"list of messages")
            if len(row) > room:
                raise ZooDataError(f"row {i}'s prompt is {len(row)} tokens: with grpo.max_completion_tokens="
                                   f"{self.cfg.grpo.max_completion_tokens} the {self.cfg.window}-token context leaves "
                                   f"no room for its completion; shorten it or lower grpo.max_completion_tokens")
            ids.append(row)
            prompts.append(p)
        columns = {c: list(ds[c]) for c in ds.column_names if c != dcfg.prompt_column}
        return PromptSet(ids, prompts, columns, list(range(len(ids))))

    def make_data(self, cfg, process_index: int, process_count: int) -> Data:
        d = cfg.data
        if process_count > 1:
            raise ConfigError(f"task=grpo samples its completions on one process; this run has {process_count} "
                              f"processes: run it as one (its devices are one mesh there)")
        tokenizer = get_tokenizer(d.tokenizer)
        check_vocab(cfg, tokenizer)
        template = template_of(d)
        every = self.encode(d, tokenizer, template)
        is_val = val_documents(np.asarray([doc_hash(repr(x)) for x in every.ids]), d.val_fraction)
        train, val = every.take(np.flatnonzero(~is_val)), every.take(np.flatnonzero(is_val))
        if not len(train):
            raise ZooDataError(f"data.source={d.source!r} leaves no training prompt")
        self.try_rewards(train)
        if process_index == 0:
            print(f"data: {len(every)} prompts from {d.source}: {len(train)} train, {len(val)} validation; "
                  f"{cfg.grpo.num_generations} completions of up to {cfg.grpo.max_completion_tokens} tokens each",
                  flush=True)
        return Data(train=PromptBatches(len(train), cfg.train.batch_size, cfg.train.seed, process_index,
                                        process_count),
                    eval=[], tokenizer=tokenizer, files={"chat_template.jinja": template}, rows=len(train),
                    examples={"train": train, "eval": val})

    def length(self, prompts: PromptSet) -> int:
        """T of every training row: the longest prompt's power-of-two bucket plus the completion (one program)."""
        longest = max(map(len, prompts.ids))
        return min(1 << (longest - 1).bit_length(), self.cfg.window - self.cfg.grpo.max_completion_tokens) + \
            self.cfg.grpo.max_completion_tokens

    # ---- a step's samples ---------------------------------------------------------------------------------
    @functools.cached_property
    def rewards(self) -> list[tuple[str, object]]:
        return load_rewards(self.cfg.grpo)

    def complete(self, params, prompts: list[list[int]], tokenizer, *, seed: int, temperature: float):
        """(completion ids, whether each ended) of each prompt: the batched sampler on the policy (merged)."""
        from zoo.infer.sample import generate_batch, scanned, stop_ids
        g = self.cfg.grpo
        model, policy = scanned(self.model, lora.merge(params, self.lora))  # zoo.load's decoder: one scanned layer
        eos = stop_ids(tokenizer)
        out = generate_batch(model, policy, prompts, g.max_completion_tokens, temperature=temperature,
                             top_k=g.top_k, top_p=g.top_p, seed=seed, eos_id=eos, vocab_limit=tokenizer.n_vocab,
                             window=self.cfg.window, group=g.num_generations)  # each prompt's G rows prefilled once
        return out, [len(c) < g.max_completion_tokens for c in out], eos[0]

    def try_rewards(self, prompts: PromptSet) -> None:
        """Each reward once, on the first prompt and an empty completion, before anything compiles: a reward that
        cannot take this source's completions (a list of one message for a conversational source, TRL's
        convention, where the reward expects a string) is one line now, not after minutes of compiling."""
        try:
            self.score(prompts.take([0]), [""])
        except RewardInterrupt:  # a reward that stops the run stops it where a step calls it: with a checkpoint
            return
        except TrainError as e:
            how = ("a list of one message, [{'role': 'assistant', 'content': TEXT}] (TRL's convention for a source of "
                   "conversations)" if isinstance(prompts.prompts[0], list) else "a string")
            raise TrainError(f"{e}; tried before compiling, on an empty completion: each completion a reward gets is "
                             f"{how}") from None

    def score(self, prompts: PromptSet, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(weighted reward [R], each function's [R, F]) of completions `texts` of the rows of `prompts`."""
        rewards = self.rewards
        conversational = isinstance(prompts.prompts[0], list)
        completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        per = np.stack([call_reward(n, fn, prompts.prompts, completions, prompts.columns, prompts.where)
                        for n, fn in rewards], 1)
        return per @ weights_of(self.cfg.grpo, len(rewards)).astype(np.float64), per

    def rollout(self, params, batch: dict, step: int, data: Data) -> tuple[dict, dict]:
        """The training batch of a step (rows of prompt + completion, the completion's targets weighted, each
        row's advantage) and its host metrics: samples drawn and scored as the module's docstring says."""
        t = time.perf_counter()
        g, G = self.cfg.grpo, self.cfg.grpo.num_generations
        pool: PromptSet = data.examples["train"]
        idx = [int(i) for i in batch["index"] for _ in range(G)]
        rows = pool.take(idx)
        seed = (self.cfg.train.seed * 1_000_003 + step) % (2 ** 31)
        comps, ended, eos = self.complete(params, rows.ids, data.tokenizer, seed=seed, temperature=g.temperature)
        total, per = self.score(rows, [data.tokenizer.decode(c) for c in comps])
        adv = group_advantages(total, G)
        T = self.length(pool)
        R = len(idx)
        inputs, targets = np.zeros((R, T), np.int32), np.zeros((R, T), np.int32)
        weights = np.zeros((R, T), np.float32)
        for r, (p, c, done) in enumerate(zip(rows.ids, comps, ended)):
            seq = p + c + ([eos] if done else [])
            n = len(seq) - 1
            inputs[r, :n], targets[r, :n] = seq[:-1], seq[1:]
            weights[r, len(p) - 1:n] = 1.0  # the completion's tokens (and its end) are the targets trained
        host = {**reward_sums(total, per, [n for n, _ in self.rewards], G), "completion_tokens": float(weights.sum()),
                "capped": float(len(ended) - sum(ended)), "gen_seconds": time.perf_counter() - t}
        return {"inputs": inputs, "targets": targets, "weights": weights, "advantages": adv}, host

    # ---- the objective ------------------------------------------------------------------------------------
    def token_logps(self, params, batch, train, rng):
        """Per-token log-probabilities of the policy that sampled: its logits at grpo.temperature (1 for greedy
        sampling), as TRL computes them."""
        h_RTD, balance = self.hidden(params, batch["inputs"], train, rng)
        temperature = self.cfg.grpo.temperature or 1.0
        return losses.token_logprobs_grad(h_RTD, output_embedding(self.cfg.model, params), batch["targets"],
                                          logit_cap=self.cfg.model.final_softcap, temperature=temperature), balance

    def loss(self, params, batch, rng, train):
        g = self.cfg.grpo
        lp_RT, balance = self.token_logps(params, batch, train, rng)
        mask_RT = batch["weights"]
        adv_R1 = batch["advantages"][:, None]
        ratio_RT = jnp.exp(lp_RT - jax.lax.stop_gradient(lp_RT))  # one step per sample: pi_old is this policy
        clipped_RT = jnp.clip(ratio_RT, 1 - g.epsilon, 1 + g.epsilon)
        per_RT = -jnp.minimum(ratio_RT * adv_R1, clipped_RT * adv_R1)
        kl_RT = jnp.zeros_like(lp_RT)
        if g.beta > 0:
            with lora.adapters_off():  # the reference: the base, the adapters switched off
                ref_RT = jax.lax.stop_gradient(self.token_logps(params, batch, False, rng)[0])
            kl_RT = jnp.exp(ref_RT - lp_RT) - (ref_RT - lp_RT) - 1
            per_RT = per_RT + g.beta * kl_RT
        tokens_R = jnp.sum(mask_RT, -1)
        R, T = mask_RT.shape
        if g.loss_type == "bnpo":
            loss_sum, weight = jnp.sum(per_RT * mask_RT), jnp.sum(mask_RT)
        elif g.loss_type == "grpo":
            loss_sum = jnp.sum(jnp.sum(per_RT * mask_RT, -1) / jnp.maximum(tokens_R, 1.0))
            weight = jnp.asarray(R, jnp.float32)
        else:  # dr_grpo
            loss_sum, weight = jnp.sum(per_RT * mask_RT) / g.max_completion_tokens, jnp.asarray(R, jnp.float32)
        out_RT = ((ratio_RT < 1 - g.epsilon) & (adv_R1 < 0)) | ((ratio_RT > 1 + g.epsilon) & (adv_R1 > 0))
        aux = {"weight": weight, "tokens": jnp.asarray(R * T, jnp.float32), "kl_sum": jnp.sum(kl_RT * mask_RT),
               "clipped": jnp.sum(out_RT * mask_RT), "answer_tokens": jnp.sum(mask_RT)}
        return self.add_balance(loss_sum, aux, balance, train)

    def train_metrics(self, totals: dict) -> dict:
        n = max(totals.get("completions", 0.0), 1.0)
        tokens = max(totals.get("answer_tokens", 0.0), 1.0)
        out = {"reward": totals.get("reward_sum", 0.0) / n,
               "reward_std": totals.get("reward_std_sum", 0.0) / max(totals.get("rollouts", 0.0), 1.0),
               "frac_reward_zero_std": totals.get("zero_std_completions", 0.0) / n,
               "kl": totals.get("kl_sum", 0.0) / tokens, "clip_ratio": totals.get("clipped", 0.0) / tokens,
               "completion_length": totals.get("completion_tokens", 0.0) / n,
               "completions/clipped_ratio": totals.get("capped", 0.0) / n,
               "gen_seconds": totals.get("gen_seconds", 0.0)}
        out.update({f"rewards/{k[len('reward_sum/'):]}": v / n for k, v in totals.items()
                    if k.startswith("reward_sum/")})
        return out

    def evaluate_extra(self, params, data: Data) -> dict:
        """The held-out prompts answered greedily (at most train.eval_batches x train.batch_size) and scored."""
        pool: PromptSet = data.examples.get("eval")
        if not pool:
            return {}
        n = min(len(pool), self.cfg.train.eval_batches * self.cfg.train.batch_size)
        held = pool.take(range(n))
        comps, _, _ = self.complete(params, held.ids, data.tokenizer, seed=0, temperature=0.0)
        total, per = self.score(held, [data.tokenizer.decode(c) for c in comps])
        out = {"eval_reward": float(total.mean())}
        out.update({f"eval_rewards/{name}": float(per[:, k].mean()) for k, (name, _) in enumerate(self.rewards)})
        return out

    def flops_per_token(self, seq_len):
        """The decoder's training FLOPs (the sampling is not counted), one more forward pass with a reference."""
        fpt = super().flops_per_token(seq_len)
        return fpt * 4 / 3 if self.cfg.grpo.beta > 0 else fpt
