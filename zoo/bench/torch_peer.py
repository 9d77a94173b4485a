"""The transformers (PyTorch, float32) side of `zoo.bench --peer hf-torch`: same shapes, same
round protocol as zoo.bench.worker. Imported only in the peer's own process."""

from __future__ import annotations

import time

import torch
import transformers

from zoo.bench.common import calibrate, median, rss_mb


def _hf_model(hf: dict, lm: bool = True):
    arch = hf["arch"]
    kw = {k: v for k, v in hf.items() if k != "arch"}
    if arch == "gpt2":
        cfg = transformers.GPT2Config(**kw, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return transformers.GPT2LMHeadModel(cfg)
    if arch == "bert":
        return transformers.BertForMaskedLM(transformers.BertConfig(**kw, hidden_dropout_prob=0.0,
                                                                   attention_probs_dropout_prob=0.0))
    if arch == "t5":
        return transformers.T5ForConditionalGeneration(transformers.T5Config(**kw, dropout_rate=0.0, pad_token_id=0,
                                                                             decoder_start_token_id=0))
    raise ValueError(f"no transformers peer for {arch!r}")


class TorchTrain:
    def __init__(self, spec):
        torch.manual_seed(0)
        self.model = _hf_model(spec["hf"]).train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.1)
        B, T, V = spec["batch"], spec["seq_len"], spec["hf"]["vocab_size"]
        self.x = torch.randint(0, V, (B, T))
        self.kwargs = {"input_ids": self.x, "labels": self.x}
        self.tokens, self.batch, self.times = B * T, B, []
        if spec["hf"]["arch"] == "bert":  # MLM: loss on 15% of positions, like zoo's masking
            labels = self.x.clone()
            labels[torch.rand(B, T) >= 0.15] = -100
            self.kwargs["labels"] = labels
        if spec["hf"]["arch"] == "t5":
            y = torch.randint(0, V, (B, spec["target_len"]))
            self.kwargs = {"input_ids": self.x, "labels": y}
            self.tokens = B * (T + spec["target_len"])
        self.compile_s, self.k = calibrate(self._steps)

    def _steps(self, n):
        for _ in range(n):
            loss = self.model(**self.kwargs).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)

    def ready(self):
        return {"name": f"transformers {transformers.__version__} / torch {torch.__version__}",
                "compile_s": self.compile_s, "threads": torch.get_num_threads()}

    def round(self):
        t = time.perf_counter()
        self._steps(self.k)
        dt = (time.perf_counter() - t) / self.k
        self.times.append(dt)
        return {"step_s": dt}

    def final(self):
        step = median(self.times)
        return {"tokens_per_s": self.tokens / step, "sequences_per_s": self.batch / step, "peak_memory_mb": rss_mb()}


class TorchGenerate:
    def __init__(self, spec):
        torch.manual_seed(0)
        self.model = _hf_model(spec["hf"]).eval()
        B, self.P, self.new = spec["batch"], spec["prompt"], spec["new"]
        self.x = torch.randint(0, spec["hf"]["vocab_size"], (B, self.P))
        self.B, self.times = B, []
        self.round()
        self.times = []

    def ready(self):
        return {"name": f"transformers {transformers.__version__} / torch {torch.__version__}", "compile_s": 0.0}

    @torch.no_grad()
    def round(self):
        t = time.perf_counter()
        self.model(input_ids=self.x, use_cache=True)
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        self.model.generate(self.x, max_new_tokens=self.new, min_new_tokens=self.new, do_sample=False,
                            use_cache=True, pad_token_id=0)
        r = {"prefill_s": prefill, "generate_s": time.perf_counter() - t}
        self.times.append(r)
        return r

    def final(self):
        prefill = median([r["prefill_s"] for r in self.times])
        decode = max(median([r["generate_s"] for r in self.times]) - prefill, 1e-9)
        dtps = self.B * self.new / decode
        return {"tokens_per_s": dtps, "decode_tokens_per_s": dtps, "prefill_tokens_per_s": self.B * self.P / prefill,
                "time_to_first_token_s": prefill + decode / self.new, "peak_memory_mb": rss_mb()}


PEERS = {"gpt_train": TorchTrain, "bert_mlm": TorchTrain, "encdec_train": TorchTrain, "generate": TorchGenerate}
