"""The settings of the tasks that have their own Config section: dpo (PreferenceConfig), embed (EmbedConfig),
distill (DistillConfig) and grpo (RlConfig), each checked when built; zoo.configuration.Config holds one of each."""

from __future__ import annotations

import math
from dataclasses import dataclass

from zoo.errors import ConfigError


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


PREFERENCE_LOSSES = ("sigmoid", "robust", "ipo", "simpo")
REFERENCES = ("auto", "base", "precomputed", "none")


@dataclass(frozen=True, kw_only=True)
class PreferenceConfig:
    """Preference tuning (task=dpo, zoo.tasks.preference): which loss, its beta, and the reference model."""

    loss: str = "sigmoid"  # sigmoid (DPO) | robust (robust DPO) | ipo (IPO) | simpo (SimPO, reference-free)
    beta: float = 0.1  # DPO's beta (sigmoid, robust), IPO's tau, SimPO's beta (its paper: 2 to 2.5)
    label_smoothing: float = 0.0  # eps: the share of pairs assumed flipped (sigmoid: cDPO; robust: rDPO), < 0.5
    # The reference: auto (the base with the adapters off for a LoRA run, else log-probs precomputed) | base |
    # precomputed (the initial model's log-probs of every pair, computed once before training, kept in the run) |
    # none (a reference-free loss: simpo)
    reference: str = "auto"
    simpo_gamma: float = 0.5  # SimPO's target reward margin gamma (the loss: -log sigmoid(beta * delta - gamma))

    def __post_init__(self):
        _check(self.loss in PREFERENCE_LOSSES,
               f"dpo.loss={self.loss!r} is unknown; choose one of {', '.join(PREFERENCE_LOSSES)}")
        _check(self.reference in REFERENCES,
               f"dpo.reference={self.reference!r} is unknown; choose one of {', '.join(REFERENCES)}")
        _check(math.isfinite(self.beta) and self.beta > 0, f"dpo.beta={self.beta} must be a positive number")
        _check(0.0 <= self.label_smoothing < 0.5, f"dpo.label_smoothing={self.label_smoothing} must be in [0, 0.5)")
        _check(math.isfinite(self.simpo_gamma) and self.simpo_gamma >= 0,
               f"dpo.simpo_gamma={self.simpo_gamma} must be a number >= 0")
        free = self.loss == "simpo"
        _check(not free or self.reference in ("auto", "none"),
               f"dpo.loss=simpo is reference-free; dpo.reference={self.reference!r} does not apply (leave it auto)")
        _check(free or self.reference != "none",
               f"dpo.loss={self.loss} compares against a reference; dpo.reference=none goes with dpo.loss=simpo")

    def reference_of(self, lora: bool) -> str:
        """The reference a run of this config uses: base | precomputed | none."""
        if self.loss == "simpo":
            return "none"
        return self.reference if self.reference != "auto" else ("base" if lora else "precomputed")


EMBED_POOLINGS = ("", "mean", "cls", "max", "mean_sqrt_len", "last")


def embed_poolings(family: str) -> tuple[str, ...]:
    """The poolings task=embed trains a model of `family` with: an encoder's (no last token: [SEP]), or a
    decoder's (no cls: its first token has seen nothing else)."""
    return ("mean", "cls", "max", "mean_sqrt_len") if family == "bert" else ("last", "mean", "max", "mean_sqrt_len")


@dataclass(frozen=True, kw_only=True)
class EmbedConfig:
    """Contrastive fine-tuning of sentence embeddings (task=embed, zoo.tasks.embed): sentence-transformers'
    MultipleNegativesRankingLoss over the whole global batch."""

    scale: float = 20.0  # the cosine similarities' multiplier (1 / temperature; sentence-transformers' default 20)
    symmetric: bool = False  # add the positive -> anchors direction and average (MultipleNegativesSymmetricRankingLoss)
    pooling: str = ""  # "" as the init_from checkpoint's 1_Pooling/config.json says (else an encoder's mean, a
    #   decoder's last) | mean | cls | max | mean_sqrt_len (encoders) | last | mean | max | mean_sqrt_len (decoders)
    # A gradient cache (CachedMultipleNegativesRankingLoss): the encoder runs over chunks of this many pairs (each
    # with its K texts), holding one chunk's activations at a time, while the loss still spans the whole batch.
    # 0: off (the batch in one forward). The loss and gradient are the same; dropout masks are drawn per chunk.
    mini_batch: int = 0

    def __post_init__(self):
        _check(math.isfinite(self.scale) and self.scale > 0, f"embed.scale={self.scale} must be a positive number")
        _check(self.pooling in EMBED_POOLINGS, f"embed.pooling={self.pooling!r} is unknown; choose one of "
               f"{', '.join(repr(p) for p in EMBED_POOLINGS)}")
        _check(isinstance(self.mini_batch, int) and self.mini_batch >= 0,
               f"embed.mini_batch={self.mini_batch!r} must be 0 (off) or a positive number of pairs per chunk")


DISTILL_TASKS = ("gpt_lm", "sft")


@dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """Knowledge distillation on task=gpt_lm or sft (zoo.tasks.distill): a frozen teacher run in the same step, the
    student's loss alpha * T^2 * divergence(teacher, student at temperature T) + (1 - alpha) * cross-entropy."""

    teacher: str = ""  # any zoo.load source (a zoo run, a Hugging Face directory, a .gguf file); "" trains no teacher
    temperature: float = 1.0  # T: both models' logits divided by it; the divergence is scaled by T^2 (Hinton 2015)
    alpha: float = 0.5  # the divergence's share of the loss; 1 - alpha the hard-label cross-entropy's
    # GKD's generalised Jensen-Shannon divergence (TRL's beta): 0 the forward KL(teacher || student), 1 the reverse
    # KL(student || teacher), between them the divergence to the mixture beta * teacher + (1 - beta) * student
    beta: float = 0.0
    # k > 0: the teacher's k largest logits (and their ids) at every position of every training row, computed once
    # before training and cached under data.cache_dir (zoo.tasks.teacher_cache); the step reads them instead of
    # running the teacher, whose weights are then never held beside the student's. 0: the teacher runs in the step
    top_k: int = 0
    # On-policy distillation (GKD, zoo.tasks.gkd; task=sft): the share of steps, drawn from (train.seed, step), whose
    # answers are the student's own samples to the batch's prompts instead of the data's (TRL's lmbda; 0: off)
    on_policy: float = 0.0
    max_new_tokens: int = 128  # the longest answer the student samples on an on-policy step (TRL's max_new_tokens)
    sample_temperature: float = 0.9  # the student's sampling temperature there (TRL's temperature; 0: greedy)

    def __post_init__(self):
        _check(isinstance(self.top_k, int) and self.top_k >= 0,
               f"distill.top_k={self.top_k!r} must be a whole number >= 0 (0: the teacher runs in the step)")
        _check(not self.top_k or self.teacher, f"distill.top_k={self.top_k} caches a teacher's logits; name the "
                                               f"teacher (distill.teacher) or set distill.top_k=0")
        _check(not self.top_k or self.beta == 0.0,
               f"distill.top_k={self.top_k} trains the forward KL on the teacher's top-k (distill.beta=0); "
               f"distill.beta={self.beta} needs the whole vocabulary of both models (set distill.top_k=0)")
        _check(math.isfinite(self.temperature) and self.temperature > 0,
               f"distill.temperature={self.temperature} must be a positive number")
        _check(0.0 <= self.on_policy <= 1.0, f"distill.on_policy={self.on_policy} must be in [0, 1] (the share of "
               f"steps trained on the student's own answers)")
        _check(isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1,
               f"distill.max_new_tokens={self.max_new_tokens!r} must be an integer >= 1")
        _check(math.isfinite(self.sample_temperature) and self.sample_temperature >= 0,
               f"distill.sample_temperature={self.sample_temperature} must be a finite number >= 0 (0: greedy)")
        _check(not (self.top_k and self.on_policy), f"distill.top_k={self.top_k} reads the teacher's logits of the "
               f"data's rows from a cache; distill.on_policy={self.on_policy} needs the teacher live for the student's "
               f"own answers (set one of them to 0)")
        _check(0.0 <= self.alpha <= 1.0, f"distill.alpha={self.alpha} must be in [0, 1] (the divergence's share)")
        _check(0.0 <= self.beta <= 1.0, f"distill.beta={self.beta} must be in [0, 1] (0: forward KL, 1: reverse KL)")


RL_LOSSES = ("bnpo", "grpo", "dr_grpo")


@dataclass(frozen=True, kw_only=True)
class RlConfig:
    """Reinforcement learning from rewards (task=grpo, zoo.tasks.rl): sampling, the rewards and the objective."""

    num_generations: int = 8  # G: completions sampled per prompt, their rewards normalised within the group (TRL's 8)
    max_completion_tokens: int = 64  # the longest completion sampled
    temperature: float = 1.0  # sampling temperature of the completions (TRL's default)
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    # Reward functions, comma-separated MODULE:FUNCTION or FILE.py:FUNCTION, each called as TRL and Tunix call them:
    # reward(prompts, completions, **columns) -> list[float] (one per completion; columns: the source's other ones)
    rewards: str = "zoo.rewards:exact_answer,zoo.rewards:answer_format"
    reward_weights: str = ""  # comma-separated weights of the rewards' sum ("": 1 each)
    beta: float = 0.04  # KL penalty to the reference (DeepSeekMath's and Tunix's 0.04; TRL's default is 0)
    epsilon: float = 0.2  # the clipped ratio's range, 1 -/+ epsilon
    # How the per-token objective is averaged: bnpo (over every completion token of the batch; DAPO, TRL's default
    # dapo on one process) | grpo (over each completion's tokens, then the completions; DeepSeekMath) | dr_grpo
    # (over completions x max_completion_tokens; Dr. GRPO)
    loss_type: str = "bnpo"

    def __post_init__(self):
        _check(self.num_generations >= 2, f"grpo.num_generations={self.num_generations} must be >= 2: the advantage "
               f"compares each completion with the others of its group")
        _check(self.max_completion_tokens >= 1, f"grpo.max_completion_tokens={self.max_completion_tokens} must be >= 1")
        _check(math.isfinite(self.temperature) and self.temperature >= 0,
               f"grpo.temperature={self.temperature} must be a finite number >= 0")
        _check(self.top_k >= 0 and 0 < self.top_p <= 1, f"grpo.top_k={self.top_k} must be >= 0 and grpo.top_p="
               f"{self.top_p} in (0, 1]")
        _check(math.isfinite(self.beta) and self.beta >= 0, f"grpo.beta={self.beta} must be a number >= 0")
        _check(0 < self.epsilon < 1, f"grpo.epsilon={self.epsilon} must be in (0, 1)")
        _check(self.loss_type in RL_LOSSES, f"grpo.loss_type={self.loss_type!r} is unknown; choose one of "
               f"{', '.join(RL_LOSSES)}")
        _check(bool(self.rewards.strip()), "grpo.rewards is empty; name at least one MODULE:FUNCTION")
        if self.reward_weights:
            try:
                weights = [float(w) for w in self.reward_weights.split(",")]
            except ValueError:
                raise ConfigError(f"grpo.reward_weights={self.reward_weights!r} must be comma-separated numbers") \
                    from None
            n = len([r for r in self.rewards.split(",") if r.strip()])
            _check(len(weights) == n, f"grpo.reward_weights={self.reward_weights!r} has {len(weights)} number(s) for "
                   f"the {n} function(s) of grpo.rewards={self.rewards!r}")
