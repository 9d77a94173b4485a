"""The `eval_score` workload: zoo-eval's scoring rate beside the training step's forward rate on the same shape.

zoo's side scores a fixed set of documents (random byte ids, every one of T tokens, a multiple of B of them)
through zoo-eval's own path (zoo.eval.perplexity.document_logliks: one window per document, prefixed with the
end-of-text token, B rows of T input tokens a batch) and runs the task's jitted loss, forward only, on one
batch of the same [B, T]. A round times one scoring pass over all the documents (host work included: rows,
padding, transfers) and a round's worth of forward steps; the row reports both rates and their ratio
`score_vs_forward`, how many programs the scoring compiled (`score_programs`: one shape, one program) and
how many XLA compilations the timed rounds caused (`round_compiles`: none, as scoring never recompiles per
document or per round).

The peer `lm-eval-hf` (zoo.bench.harness_peer) scores the same documents with lm-evaluation-harness's own
`hf` model (HFLM.loglikelihood_rolling: the harness's windows, here one per document, batches of B) on the
same weights: zoo's worker writes its random parameters through zoo's exporter (zoo.hf.to_hf) to a directory
both workers of the run know (named after the benchmark's process), and removes it when it ends. Both sides
report `nll_per_token`, so the row shows they scored the same model.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time

import numpy as np

from zoo.bench.common import calibrate, median

PREFIX = 256  # zoo's byte tokenizer's end-of-text: the token each document is scored from
DOC_BATCHES = 2  # documents: this many batches of B


def export_dir(spec: dict) -> str:
    """Where zoo's worker writes the weights for the peer: the same path in both workers of one benchmark
    process (their parent), one per shape."""
    return os.path.join(tempfile.gettempdir(), f"zoo-bench-eval-{os.getppid()}-{spec['name']}")


def documents(n: int, T: int) -> list[list[int]]:
    """n documents of T byte ids each, the same in every process."""
    return np.random.default_rng(0).integers(0, 256, (n, T)).tolist()


class ZooScore:
    """zoo-eval's scoring and the task's forward pass at one [B, T] (see the module docstring)."""

    def __init__(self, spec):
        import flax.linen as nn
        import jax
        from jax import monitoring
        from zoo import hf, tasks
        from zoo.bench.model_report import apply_preset, compute_dtype, settings
        from zoo.overrides import apply_overrides, load_config_file
        from zoo.eval import loglik
        from zoo.training import checkpoint
        self.jax, self.loglik = jax, loglik
        self.compiles = 0
        monitoring.register_event_duration_secs_listener(self._on_event)
        over = [o for o in spec["overrides"] if not o.startswith("preset=")]
        cfg = apply_overrides(load_config_file(spec["config"]), over + [f"model.dtype={compute_dtype(spec, jax)}"])
        cfg = apply_preset(cfg, spec)
        task = tasks.build(cfg)
        self.model, self.B, self.T = task.model, cfg.train.batch_size, cfg.data.seq_len
        self.params = jax.jit(lambda r: nn.unbox(task.init(r)))(jax.random.PRNGKey(0))
        self.docs = documents(DOC_BATCHES * self.B, self.T)
        self.path = export_dir(spec)  # the peer's copy of these weights, through zoo's exporter
        shutil.rmtree(self.path, ignore_errors=True)
        atexit.register(shutil.rmtree, self.path, True)
        checkpoint.save_weights(os.path.join(self.path, "run"), self.params, cfg)
        hf.to_hf(os.path.join(self.path, "run"), os.path.join(self.path, "hf"), verbose=False)
        with open(os.path.join(self.path, "hf", "bench.json"), "w") as f:
            json.dump({"batch": self.B, "seq_len": self.T, "documents": len(self.docs), "prefix": PREFIX}, f)
        rows = [loglik.Row(tuple([PREFIX, *d]), self.T) for d in self.docs[:self.B]]
        inputs_BT, targets_BT, weights_BT = (jax.device_put(a) for a in loglik.pad_batch(rows, self.B, self.T))
        self.batch = {"inputs": inputs_BT, "targets": targets_BT, "weights": weights_BT}
        rng = jax.random.PRNGKey(0)
        self.loss = jax.jit(lambda p, b: task.loss(p, b, rng, False)[0])  # the train step's forward, no gradient
        t = time.perf_counter()
        self.lls = self._score()
        self.compile_s = time.perf_counter() - t  # the first scoring pass, its compile included
        _, self.k = calibrate(self._forward)
        self.device = jax.devices()[0]
        self.settings = settings(cfg.model)
        self.score_times, self.forward_times, self.round_compiles = [], [], 0

    def _on_event(self, event, duration, **kwargs):
        self.compiles += event == "/jax/core/compile/backend_compile_duration"

    def _score(self):
        from zoo.eval.perplexity import document_logliks
        return document_logliks(self.model, self.params, self.docs, prefix=PREFIX, context=self.T + 1,
                                stride=self.T, batch_size=self.B)

    def _forward(self, n):
        for _ in range(n):
            out = self.loss(self.params, self.batch)
        self.jax.block_until_ready(out)

    def ready(self):
        from zoo.bench.model_report import versions_and_fallbacks
        return {"device_kind": self.device.device_kind, "device_count": 1, "compile_s": self.compile_s,
                "settings": self.settings, **versions_and_fallbacks()}

    def round(self):
        before = self.compiles
        t = time.perf_counter()
        self.lls = self._score()
        score = time.perf_counter() - t
        t = time.perf_counter()
        self._forward(self.k)
        forward = (time.perf_counter() - t) / self.k
        self.round_compiles += self.compiles - before
        self.score_times.append(score)
        self.forward_times.append(forward)
        return {"score_s": score, "forward_step_s": forward}

    def final(self, since: int = 0):
        from zoo.bench.model_report import device_peak_memory_mb
        scored = len(self.docs) * self.T
        tps = scored / median(self.score_times[since:])
        forward = self.B * self.T / median(self.forward_times[since:])
        return {"tokens_per_s": tps, "forward_tokens_per_s": forward, "score_vs_forward": tps / forward,
                "documents": len(self.docs), "scored_tokens": scored, "nll_per_token": -float(self.lls.sum()) / scored,
                "score_programs": self.loglik._row_loglik._cache_size(), "round_compiles": self.round_compiles,
                "peak_memory_mb": device_peak_memory_mb(self.device)}
