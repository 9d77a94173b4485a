"""The transformers (PyTorch) side of `zoo-bench --peer hf-torch|hf-torch-compile`: same shapes, same
round protocol as zoo.bench.worker. Imported only in the peer's own process.

On the device zoo runs on: CUDA when torch sees a GPU, with SDPA attention, bf16 autocast (float32
weights, as zoo's bf16 compute with float32 master weights) and fused AdamW for training, bf16
weights for generation (as `torch_dtype=torch.bfloat16` inference), `torch.cuda.synchronize()`
before every timer read. `hf-torch-compile` adds `torch.compile` of the model for training and, for
generation, a static KV cache, with which transformers compiles the decoding step itself on CUDA
(prefill stays eager on both peers). On CPU both stay float32 as before. A spec with dtype float32
keeps float32 on CUDA too. lora_train wraps the model with PEFT (`peft.get_peft_model`: the spec's rank,
alpha and target modules) and trains the adapters alone. dpo_train's peer is TRL's DPOTrainer with the same
PEFT adapters (zoo.bench.dpo_peer), grpo_train's TRL's GRPOTrainer (zoo.bench.grpo_peer).
"""

from __future__ import annotations

import contextlib
import time

import torch

from zoo.bench.common import calibrate, median
from zoo.bench.shapes import PEER_NAMES


from zoo.bench.peer_base import _hf_model, _Peer, _TrainPeer, lora_model


class TorchTrain(_TrainPeer):
    """A training step of the transformers model as a user writes the loop by default: `model(**batch).loss`,
    `loss.backward()`, `torch.optim.AdamW(params, lr=1e-4)` with torch's defaults otherwise (weight decay 0.01;
    the foreach update on a CPU, fused on CUDA, as transformers' Trainer picks), `opt.step()`, `opt.zero_grad()`,
    no gradient clipping. zoo's own step clips the global norm at 1.0 and decays 2-D weights by 0.1 (its defaults),
    so it does a little more work than its peer. With the spec's `lora`: the PEFT LoRA model, the adapters alone
    trained."""

    def __init__(self, spec, name: str = "hf-torch"):
        super().__init__(spec, name)
        model = _hf_model(spec["hf"])
        self.model = (lora_model(model, spec["lora"]) if spec.get("lora") else model).to(self.device).train()
        self.forward = torch.compile(self.model) if self.compiled else self.model
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        opt_kw = {"fused": True} if self.cuda else {}
        self.opt = torch.optim.AdamW(self.params, lr=1e-4, **opt_kw)
        B, T, V = spec["batch"], spec["seq_len"], spec["hf"]["vocab_size"]
        x = torch.randint(0, V, (B, T))
        self.kwargs = {"input_ids": x, "labels": x}
        self.tokens, self.batch, self.times = B * T, B, []
        if spec["hf"]["arch"] == "bert":  # MLM: loss on 15% of positions, like zoo's masking
            labels = x.clone()
            labels[torch.rand(B, T) >= 0.15] = -100
            self.kwargs["labels"] = labels
        if spec["hf"]["arch"] == "t5":
            y = torch.randint(0, V, (B, spec["target_len"]))
            self.kwargs = {"input_ids": x, "labels": y}
            self.tokens = B * (T + spec["target_len"])
        self.kwargs = {k: v.to(self.device) for k, v in self.kwargs.items()}
        self.compile_s, self.k = calibrate(self._steps)

    def _autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()

    def _steps(self, n):
        for _ in range(n):
            with self._autocast():
                loss = self.forward(**self.kwargs).loss
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
        self.sync()

    def ready(self):
        return {**self.report(self.model, "bfloat16 autocast, float32 weights" if self.bf16 else "float32"),
                "trainable_params": sum(p.numel() for p in self.params)}



class TorchGenerate(_Peer):
    def __init__(self, spec, name: str = "hf-torch"):
        super().__init__(spec, name)
        model = _hf_model(spec["hf"]).eval()
        self.model = model.to(self.device, torch.bfloat16 if self.bf16 else torch.float32)
        B, self.P, self.new = spec["batch"], spec["prompt"], spec["new"]
        self.x = torch.randint(0, spec["hf"]["vocab_size"], (B, self.P)).to(self.device)
        self.gen_kw = dict(max_new_tokens=self.new, min_new_tokens=self.new, do_sample=False, use_cache=True,
                           pad_token_id=0)
        if self.compiled:  # transformers compiles the decoding step itself with a static cache (on CUDA)
            self.gen_kw["cache_implementation"] = "static"
        self.B, self.times = B, []
        t = time.perf_counter()
        self.round()
        self.compile_s = time.perf_counter() - t  # the first prefill + generate (compile included)
        self.times = []

    def ready(self):
        return self.report(self.model, "bfloat16" if self.bf16 else "float32")

    @torch.no_grad()
    def round(self):
        t = time.perf_counter()
        self.model(input_ids=self.x, use_cache=True)
        self.sync()
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        self.model.generate(self.x, **self.gen_kw)
        self.sync()
        r = {"prefill_s": prefill, "generate_s": time.perf_counter() - t}
        self.times.append(r)
        return r

    def final(self, since: int = 0):
        times = self.times[since:]
        prefill = median([r["prefill_s"] for r in times])
        decode = max(median([r["generate_s"] for r in times]) - prefill, 1e-9)
        dtps = self.B * self.new / decode
        return {"tokens_per_s": dtps, "decode_tokens_per_s": dtps, "prefill_tokens_per_s": self.B * self.P / prefill,
                "time_to_first_token_s": prefill + decode / self.new, "peak_memory_mb": self.peak_memory_mb()}


def _dpo(spec, name: str):
    from zoo.bench.dpo_peer import TrlDpo  # TRL's import: only where it runs
    return TrlDpo(spec, name)


def _grpo(spec, name: str):
    from zoo.bench.grpo_peer import TrlGrpo  # TRL's import: only where it runs
    return TrlGrpo(spec, name)


PEERS = {"gpt_train": TorchTrain, "llama_train": TorchTrain, "lora_train": TorchTrain, "dpo_train": _dpo,
         "grpo_train": _grpo, "bert_mlm": TorchTrain, "encdec_train": TorchTrain, "generate": TorchGenerate,
         "llama_generate": TorchGenerate}


def make(name: str, spec: dict):
    """The peer `name` (one of PEER_NAMES) set up for `spec`."""
    if name not in PEER_NAMES:
        raise ValueError(f"unknown peer {name!r}; choose one of {', '.join(PEER_NAMES)}")
    embed = spec["workload"] in ("embed", "embed_train")
    if (name == "st-torch") != embed:
        raise ValueError(f"{spec['workload']}'s peer is st-torch" if embed else
                         f"st-torch is the embed and embed_train workloads' peer, not {spec['workload']}'s")
    if name == "st-torch" and spec["workload"] == "embed_train":
        from zoo.bench.embed_train_speed import StEmbedTrain
        return StEmbedTrain(spec, name)
    if name == "st-torch":
        from zoo.bench.embed_speed import StEmbed
        return StEmbed(spec, name)
    if (name == "lm-eval-hf") != (spec["workload"] == "eval_score"):
        raise ValueError(f"{spec['workload']}'s peers are " + ("lm-eval-hf" if spec["workload"] == "eval_score"
                                                              else "hf-torch and hf-torch-compile"))
    if name == "lm-eval-hf":
        from zoo.bench.harness_peer import HarnessScore  # lm-eval's import: only where it runs
        return HarnessScore(spec, name)
    return PEERS[spec["workload"]](spec, name)
