"""What every transformers peer of zoo-bench shares (zoo.bench.torch_peer, dpo_peer, grpo_peer): the model built
from a spec, the PEFT LoRA config, the base peer (device, dtype, report, memory) and the timing loop of training
peers. Kept apart from torch_peer's registry, which imports the TRL peers only where they run."""

from __future__ import annotations

import time

import torch
import transformers

from zoo.bench.common import median, rss_mb


def _hf_model(hf: dict):
    arch = hf["arch"]
    kw = {k: v for k, v in hf.items() if k != "arch"}
    kw["attn_implementation"] = "sdpa"  # transformers' default where available; named so every row says it
    if arch == "gpt2":
        # GPT-2's end-of-text is its last id (50256 of 50257): the last of a smaller vocabulary too, where
        # GPT2Config's default 50256 lies outside it (and transformers warns)
        end = kw["vocab_size"] - 1
        cfg = transformers.GPT2Config(**kw, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=end,
                                      eos_token_id=end)
        model = transformers.GPT2LMHeadModel(cfg)
        # transformers reads the loss off the class name, and "GPT2LMHeadModel" names none (it warns, then
        # takes the causal-LM loss): named here
        model.loss_type = "ForCausalLM"
        return model
    if arch == "bert":
        return transformers.BertForMaskedLM(transformers.BertConfig(**kw, hidden_dropout_prob=0.0,
                                                                   attention_probs_dropout_prob=0.0))
    if arch == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw, attention_dropout=0.0))
    if arch == "t5":
        return transformers.T5ForConditionalGeneration(transformers.T5Config(**kw, dropout_rate=0.0, pad_token_id=0,
                                                                             decoder_start_token_id=0))
    raise ValueError(f"no transformers peer for {arch!r}")


class _Peer:
    """What both peers share: the device, the bf16 choice, synchronisation, the ready() report."""

    def __init__(self, spec, name: str):
        torch.manual_seed(0)
        self.name, self.compiled = name, name.endswith("-compile")
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.bf16 = self.cuda and spec.get("dtype") != "float32"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def card(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.cuda else "cpu"

    def peak_memory_mb(self) -> float:
        return torch.cuda.max_memory_allocated(self.device) / 2**20 if self.cuda else rss_mb()

    def report(self, model, dtype: str) -> dict:
        return {"name": self.name, "versions": f"transformers {transformers.__version__} / torch {torch.__version__}",
                "device": self.card(), "dtype": dtype, "attention": model.config._attn_implementation,
                "compile": self.compiled, "compile_s": self.compile_s, "threads": torch.get_num_threads()}


def lora_config(lora: dict):
    """PEFT's LoraConfig of the spec's `lora`: adapters of its rank and alpha on its target modules, no dropout."""
    import warnings

    import peft
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # peft on transformers 5: noise
    return peft.LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], target_modules=list(lora["targets"]),
                           lora_dropout=0.0)


def lora_model(model, lora: dict):
    """`model` wrapped by PEFT with adapters of lora's rank and alpha on its target modules (no dropout): the
    base frozen (requires_grad False), the adapters alone trainable."""
    import peft
    return peft.get_peft_model(model, lora_config(lora))


class _TrainPeer(_Peer):
    """A peer timed by training steps: `_steps(n)` runs n of them; `tokens` and `batch` are one step's."""

    def round(self):
        t = time.perf_counter()
        self._steps(self.k)
        dt = (time.perf_counter() - t) / self.k
        self.times.append(dt)
        return {"step_s": dt}

    def final(self, since: int = 0):
        step = median(self.times[since:])
        return {"tokens_per_s": self.tokens / step, "sequences_per_s": self.batch / step,
                "peak_memory_mb": self.peak_memory_mb()}


class _TrlPeer(_TrainPeer):
    """A TRL trainer's step as transformers.Trainer's loop takes it: `trainer`, `model`, `inputs`; `STEP_ARGS` go
    to training_step after the inputs (GRPOTrainer's takes the number of items in the batch)."""

    STEP_ARGS: tuple = ()

    def _steps(self, n):
        t = self.trainer
        for _ in range(n):  # one batch an optimizer step
            self.loss = t.training_step(self.model, self.inputs, *self.STEP_ARGS)
            if t.args.max_grad_norm > 0:
                t._clip_grad_norm(self.model)
            t.optimizer.step()
            t.lr_scheduler.step()
            self.model.zero_grad()
        self.sync()
