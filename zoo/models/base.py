"""What every model family's config shares, and the FAMILIES registry's entry type.

`ModelConfig` holds the fields every family has (compute and parameter dtypes, layer scan, remat and
its policy, the attention backend) and checks them; a family's config subclasses it and adds its
architecture. `Family` is one entry of `zoo.models.FAMILIES`: everything the rest of zoo needs to
know about a family (its config class, presets, tasks and Hugging Face converters). Tasks and
converters sit in higher layers, so they are named as "module:attribute" strings and imported on use.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

from zoo.errors import ConfigError
from zoo.nn.attention import IMPLEMENTATIONS
from zoo.nn.lora import LoraSpec
from zoo.nn.stack import REMAT_POLICIES

DTYPES = ("float32", "bfloat16", "float16")
QUANTIZE_BASE = ("none", "int8", "nf4")


def check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def check_choice(name: str, value, choices) -> None:
    check(value in choices, f"model.{name}={value!r} is unknown; choose one of {', '.join(map(str, choices))}")


def check_positive(cfg, *names: str) -> None:
    for name in names:
        check(getattr(cfg, name) > 0, f"model.{name}={getattr(cfg, name)} must be positive")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Fields and checks every family shares; `family` names the FAMILIES entry (a class constant)."""

    family: ClassVar[str] = ""
    dtype: str = "float32"  # compute dtype of activations and matmuls
    param_dtype: str = "float32"  # storage dtype of parameters
    scan_layers: bool = False  # one nn.scan over stacked blocks: compile time independent of depth
    remat: bool = False  # recompute block activations in the backward pass to save memory
    remat_policy: str = "full"  # with remat: full | dots | dots_no_batch (what is saved, see zoo.nn.stack)
    attention_impl: str = "auto"  # auto (CPU: einsum; else jax.nn.dot_product_attention picks) | xla | cudnn | einsum
    # LoRA (zoo.nn.lora): low-rank adapters beside the Einsum layers named in lora_targets; the base is frozen.
    lora_rank: int = 0  # adapter rank r; 0: no adapters
    lora_alpha: float = 16.0  # the adapters' output is scaled by lora_alpha / lora_rank (PEFT's lora_alpha)
    lora_dropout: float = 0.0  # dropout on the adapters' input, training only
    lora_targets: str = "query,key,value,out,gate,fc,proj"  # Einsum layers adapted: names or path suffixes, comma-separated
    quantize_base: str = "none"  # none | int8 | nf4: the frozen base's adapted kernels held quantized (QLoRA)

    @property
    def lora_spec(self) -> LoraSpec | None:
        """The adapters this model carries (rank, alpha, dropout, targets), None without any (lora_rank 0)."""
        if not self.lora_rank:
            return None
        targets = tuple(t.strip().strip("/") for t in self.lora_targets.split(",") if t.strip())
        return LoraSpec(self.lora_rank, self.lora_alpha, self.lora_dropout, targets)

    def __post_init__(self):
        for name in ("dtype", "param_dtype"):
            value = getattr(self, name)
            check(value in DTYPES, f"model.{name}={value!r} is not a dtype; choose one of {', '.join(DTYPES)}")
        check(self.attention_impl in IMPLEMENTATIONS,
              f"model.attention_impl={self.attention_impl!r}; choose one of {', '.join(IMPLEMENTATIONS)}")
        check(self.remat_policy in REMAT_POLICIES,
              f"model.remat_policy={self.remat_policy!r}; choose one of {', '.join(REMAT_POLICIES)}")
        dropout = getattr(self, "dropout", 0.0)
        check(0.0 <= dropout < 1.0, f"model.dropout={dropout} must be in [0, 1)")
        check(self.lora_rank >= 0, f"model.lora_rank={self.lora_rank} must be >= 0 (0: no LoRA adapters)")
        check(self.lora_alpha > 0, f"model.lora_alpha={self.lora_alpha} must be positive")
        check(0.0 <= self.lora_dropout < 1.0, f"model.lora_dropout={self.lora_dropout} must be in [0, 1)")
        check(self.quantize_base in QUANTIZE_BASE,
              f"model.quantize_base={self.quantize_base!r}; choose one of {', '.join(QUANTIZE_BASE)}")
        check(self.quantize_base == "none" or self.lora_rank > 0,
              f"model.quantize_base={self.quantize_base!r} holds a frozen base for LoRA; set model.lora_rank > 0")
        check(self.lora_rank == 0 or any(t.strip() for t in self.lora_targets.split(",")),
              "model.lora_targets is empty; name the Einsum layers to adapt, e.g. query,value")


def resolve(ref: str) -> Any:
    """The object a "package.module:attribute" string names."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Family:
    """One model family: config class, named presets, the tasks that train it, its HF converters."""

    name: str
    config: type  # the family's ModelConfig subclass
    presets: dict  # preset name -> config
    tasks: dict  # task name -> "module:builder" (cfg -> Task); the first is the family's default
    hf: dict = dataclasses.field(default_factory=dict)  # HF model_type -> "module" (a converter, see zoo.hf;
    #   model types of one architecture share it: roberta, xlm-roberta); export tries them in this order

    @property
    def default_task(self) -> str:
        return next(iter(self.tasks))
