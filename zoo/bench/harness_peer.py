"""The peer `lm-eval-hf` of the eval_score workload: lm-evaluation-harness's own `hf` model (HFLM) scoring the
documents zoo's worker scores, on the weights it exported (zoo.bench.eval_speed). Imported only in the peer's
own process, after zoo's worker has written them.

HFLM.loglikelihood_rolling runs as the harness runs it (its windows, batches of B, its padding and log-softmax);
only its tok_encode reads the fixed documents' ids instead of encoding text, so both sides score the same ids.
On CUDA the weights are bfloat16 unless the spec asks for float32; on CPU float32.
"""

from __future__ import annotations

import json
import os
import time

import lm_eval
import torch
import transformers
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from zoo.bench.common import median, rss_mb
from zoo.bench.eval_speed import documents, export_dir


class _IdsLM(HFLM):
    """HFLM whose requests name documents by index: tok_encode returns their ids."""

    docs: list[list[int]] = []

    def tok_encode(self, string, *args, **kwargs):
        return self.docs[int(string)]

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, override_bs=None):
        # loglikelihood_rolling asks for a progress bar per batch: none in a benchmark's output
        return super()._loglikelihood_tokens(requests, disable_tqdm=True, override_bs=override_bs)


class HarnessScore:
    def __init__(self, spec, name: str = "lm-eval-hf"):
        path = os.path.join(export_dir(spec), "hf")
        if not os.path.isfile(os.path.join(path, "bench.json")):
            raise FileNotFoundError(f"{path}: zoo's worker writes the weights first")
        with open(os.path.join(path, "bench.json")) as f:
            meta = json.load(f)
        self.cuda = torch.cuda.is_available()
        self.bf16 = self.cuda and spec.get("dtype") != "float32"
        self.tokens = meta["documents"] * meta["seq_len"]
        transformers.utils.logging.disable_progress_bar()  # "Loading weights"
        t = time.perf_counter()
        self.lm = _IdsLM(pretrained=path, backend="causal", device="cuda" if self.cuda else "cpu",
                         dtype="bfloat16" if self.bf16 else "float32", batch_size=meta["batch"],
                         max_length=meta["seq_len"], prefix_token_id=meta["prefix"])
        self.lm.docs = documents(meta["documents"], meta["seq_len"])
        self.requests = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(str(i),), idx=i)
                         for i in range(meta["documents"])]
        self.name, self.times = name, []
        self.round()
        self.compile_s = time.perf_counter() - t  # loading and the first pass
        self.times = []

    def ready(self):
        model = self.lm.model
        return {"name": self.name, "device": torch.cuda.get_device_name() if self.cuda else "cpu",
                "versions": f"lm-eval {lm_eval.__version__} / transformers {transformers.__version__} / "
                            f"torch {torch.__version__}",
                "dtype": "bfloat16" if self.bf16 else "float32", "attention": model.config._attn_implementation,
                "compile_s": self.compile_s, "threads": torch.get_num_threads()}

    def round(self):
        t = time.perf_counter()
        self.lls = self.lm.loglikelihood_rolling(self.requests, disable_tqdm=True)
        if self.cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        self.times.append(dt)
        return {"score_s": dt}

    def final(self, since: int = 0):
        peak = torch.cuda.max_memory_allocated() / 2**20 if self.cuda else rss_mb()
        return {"tokens_per_s": self.tokens / median(self.times[since:]),
                "nll_per_token": -sum(self.lls) / self.tokens, "peak_memory_mb": peak}
