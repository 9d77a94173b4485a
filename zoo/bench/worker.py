"""One framework's side of a benchmark (`python -m zoo.bench.worker zoo|hf-torch|hf-torch-compile|lm-eval-hf
SPEC_JSON [--hold]`).

Sets up and warms up, prints one JSON line, then answers each stdin line: `round` (time one round),
`final [SINCE]` (throughput, MFU, memory from the rounds so far, or from round SINCE on), `profile DIR`
(zoo: a jax.profiler trace of a few steps into DIR), `quit`. One framework per process. With --hold the
process imports its framework and then waits for a `go` line before it touches the device (the parent
starts peers early so that their imports overlap zoo's compile). zoo's process sets XLA's GPU flags
(zoo.accel) before jax starts.
"""

from __future__ import annotations

import json
import os
import sys
import time
import types

from zoo.bench.common import BANDWIDTH_METHOD, calibrate, hbm_bandwidth, measured_bandwidth, median
from zoo.bench.embed_speed import ZooEmbed
from zoo.bench.embed_train_speed import ZooEmbedTrain
from zoo.bench.eval_speed import ZooScore
from zoo.bench.grpo_speed import ZooGrpo
from zoo.bench.model_report import (apply_preset, compute_dtype, device_peak_memory_mb, frozen_base, settings,
                                    versions_and_fallbacks)


class ZooTrain:
    """A train workload through the trainer's own setup, jitted step, real input and prefetch. A LoRA config
    (model.lora_rank) fine-tunes a base written first (`frozen_base`), as a run with init_from does; a task
    whose metrics count `real_tokens` (sft: positions holding a token) reports their share and rate.
    `devices`: the mesh's (default: every device, as a run)."""

    def __init__(self, spec, devices=None):
        import jax
        from zoo.overrides import apply_overrides, load_config_file
        from zoo.training import flops, freeze, trainer
        from zoo.training.prefetch import Prefetcher
        self.jax = jax
        cfg = load_config_file(spec["config"])
        over = [o for o in spec["overrides"] if not o.startswith("preset=")]
        dtype = compute_dtype(spec, jax)
        cfg = apply_overrides(cfg, over + [f"model.dtype={dtype}", "train.steps=1000000", "train.eval_every=0"])
        cfg = apply_preset(cfg, spec)
        with frozen_base(cfg) as cfg:
            s = trainer.setup(cfg, devices)
            self.state = s.init_state(jax.random.PRNGKey(0))
            if cfg.init_from:  # the frozen half (and any matching params) from the base, as train() does
                self.state = trainer.init_from(s, self.state, cfg.init_from)
        self.step = s.jit_train_step()
        here, processes = jax.process_index(), jax.process_count()  # several: each feeds its rows of the batch
        make = synthetic_batches(spec, cfg, here, processes) if spec.get("synthetic") else \
            s.task.make_data(cfg, here, processes).train
        self.prefetch = Prefetcher(lambda i: trainer.to_device(make(i), s.mesh), 0, 10**9)
        self.i, self.wait, self.times, self.real, self.real_fracs = 0, 0.0, [], [], []
        self.compile_s, self.k = calibrate(self._steps)
        if processes > 1:  # every process must run as many steps a round: process 0's count
            from jax.experimental import multihost_utils
            self.k = int(multihost_utils.broadcast_one_to_all(self.k))
        self.tokens = float(self.m["tokens"])
        if s.trainable is None:
            lengths = {"target_len": spec["target_len"]} if spec.get("target_len") else {}  # seq2seq: S != T
            self.flops_per_token = s.task.flops_per_token(cfg.data.seq_len, **lengths)
        else:  # a frozen base: the trainer's own count (no weight gradients for it, the adapters' added)
            self.flops_per_token = freeze.flops_per_token(s.task, cfg.data.seq_len, s.abstract_params, s.trainable)
        self.n_trainable = sum(x.size for x in jax.tree.leaves(self.state.params))
        self.step_memory_mb = step_memory_mb(self.step, self.state, self.prefetch.get(self.i))
        self.i += 1
        self.devices = s.mesh.devices.flatten().tolist()
        self.local = [d for d in self.devices if d.process_index == here]  # the ones whose memory this process reads
        self.peak = flops.total_peak(self.devices)
        self.batch = cfg.train.batch_size
        self.settings = settings(cfg.model)

    def _steps(self, n):
        for _ in range(n):
            t = time.perf_counter()
            batch = self.prefetch.get(self.i)
            self.wait += time.perf_counter() - t
            self.state, self.m = self.step(self.state, batch)
            if "real_tokens" in self.m:  # kept on the device: read once the round is timed
                self.real.append(self.m["real_tokens"])
            self.i += 1
        self.jax.block_until_ready(self.m)

    def ready(self):
        d = self.devices[0]
        return {"device_kind": d.device_kind, "device_count": len(self.devices), "compile_s": self.compile_s,
                "process_count": self.jax.process_count(), "process_index": self.jax.process_index(),
                "peak_flops": self.peak, "settings": self.settings, "trainable_params": self.n_trainable,
                **versions_and_fallbacks()}

    def profile(self, path):
        with self.jax.profiler.trace(path):
            self._steps(3)

    def round(self):
        self.wait, self.real = 0.0, []
        t = time.perf_counter()
        self._steps(self.k)
        dt = (time.perf_counter() - t) / self.k
        self.times.append(dt)
        if self.real:  # the share of the round's positions that held a token
            self.real_fracs.append(float(sum(self.jax.device_get(self.real))) / (self.k * self.tokens))
        return {"step_s": dt, "input_wait_frac": self.wait / (dt * self.k)}

    def final(self, since: int = 0):
        step = median(self.times[since:])
        tps = self.tokens / step
        out = {"tokens_per_s": tps, "sequences_per_s": self.batch / step,
               "tokens_per_s_per_device": tps / len(self.devices), "mfu": tps * self.flops_per_token / self.peak,
               "peak_memory_mb": device_peak_memory_mb(self.local[0]), "step_memory_mb": self.step_memory_mb}
        if self.real_fracs[since:]:  # tokens_per_s counts every position; these, the ones holding a token
            frac = sum(self.real_fracs[since:]) / len(self.real_fracs[since:])
            out.update(real_token_frac=frac, real_tokens_per_s=tps * frac)
        return out


def synthetic_batches(spec, cfg, process_index: int = 0, process_count: int = 1):
    """Exact-shape seq2seq batches (source S, target T, no padding): the offline task's phrases are
    short, and the benchmark shapes are fixed. Each process keeps its rows of the global batch. task=dpo:
    synthetic_pairs."""
    import numpy as np
    from zoo.data.batches import process_rows
    if cfg.task == "dpo":
        return synthetic_pairs(spec, cfg, process_index, process_count)
    B, S, T, V = spec["batch"], spec["seq_len"], spec["target_len"], cfg.model.vocab_size
    rows = process_rows(B, process_index, process_count)

    def make(step):
        rng = np.random.default_rng(step)
        tgt = rng.integers(3, V, (B, T + 1), dtype=np.int32)[rows]
        return {"src": rng.integers(3, V, (B, S), dtype=np.int32)[rows], "src_valid": np.ones((B, S), bool)[rows],
                "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:], "weights": np.ones((B, T), np.float32)[rows]}
    return make


def synthetic_pairs(spec, cfg, process_index: int = 0, process_count: int = 1):
    """Exact-shape preference batches of B pairs (task=dpo): each pair two rows of T + 1 ids, a prompt of T // 2
    shared by both, then different random answers to the end (no padding), weights on the targets that are answer
    tokens, as zoo.tasks.preference.Pairs.rows makes them. Each process keeps its pairs of the global batch."""
    import numpy as np
    from zoo.data.batches import process_rows
    B, T, V = spec["batch"], spec["seq_len"], cfg.model.vocab_size
    P = T // 2
    rows = process_rows(B, process_index, process_count)
    mask = np.zeros((B, 2, T), np.float32)
    mask[:, :, P - 1:] = 1.0  # target t is id t + 1: the answer's ids are P..T

    def make(step):
        rng = np.random.default_rng(step)
        ids = rng.integers(3, V, (B, 2, T + 1), dtype=np.int32)
        ids[:, 1, :P] = ids[:, 0, :P]  # one prompt a pair; the answers differ (random ids, redrawn if equal)
        same = (ids[:, 0, P:] == ids[:, 1, P:]).all(-1)
        ids[same, 1, P] = 3 + (ids[same, 0, P] - 3 + 1) % (V - 3)
        return {"inputs": ids[rows, :, :-1], "targets": ids[rows, :, 1:], "weights": mask[rows],
                "pair_weights": np.ones(B, np.float32)[rows]}
    return make


def step_memory_mb(step, state, batch) -> float | None:
    """The jitted step's memory by XLA's own count (the compiled executable, cached: no second compile):
    arguments, temporaries and the outputs not written over donated arguments. Unlike peak_memory_mb, whose
    CPU figure is the process's peak RSS (at the CPU shapes mostly jax, XLA and libraries), it is the step's
    alone on every backend: what full training and LoRA compare on. None where the backend does not say."""
    try:
        m = step.lower(state, batch).compile().memory_analysis()
    except Exception:  # noqa: BLE001 - a backend without the analysis
        return None
    if m is None:
        return None
    return (m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes) / 2**20


class ZooGenerate:
    """Greedy generation with the KV cache: prefill, then 128 tokens in one jitted loop."""

    def __init__(self, spec):
        import jax
        import jax.numpy as jnp
        import flax.linen as nn
        from zoo import tasks
        from zoo.overrides import apply_overrides, load_config_file
        from zoo.infer.sample import _generate
        from zoo.training import flops
        self.jax = jax
        over = [o for o in spec["overrides"] if not o.startswith("preset=")]
        dtype = compute_dtype(spec, jax)
        if dtype != "float32":  # inference: parameters stored in the compute dtype (no master weights to keep)
            over = [f"model.dtype={dtype}", f"model.param_dtype={dtype}"] + over
        cfg = apply_overrides(load_config_file(spec["config"]), over)
        cfg = apply_preset(cfg, spec)
        task = tasks.build(cfg)
        self.model = task.model
        self.params = jax.jit(lambda r: nn.unbox(task.init(r)))(jax.random.PRNGKey(0))
        if cfg.model.family == "gpt":  # as zoo.load(...).generate decodes: on a CPU, kernels [out, in] (decode_layout)
            from zoo.nn import decode_layout
            self.params = decode_layout.transposed(self.model, self.params)
        B, P, self.new = spec["batch"], spec["prompt"], spec["new"]
        self.prompt = jax.random.randint(jax.random.PRNGKey(1), (B, P), 0, cfg.model.vocab_size)
        kw = dict(model=self.model, temperature=0.0, top_k=0, top_p=1.0, vocab_limit=cfg.model.vocab_size, eos_id=None)
        self.gen = lambda n: _generate(self.params, self.prompt, jax.random.PRNGKey(0), max_new_tokens=n, **kw)
        cache = jax.eval_shape(lambda: self.model.init(jax.random.PRNGKey(0), jnp.zeros((B, P + self.new), jnp.int32),
                                                       decode=True))["cache"]
        cache = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), nn.unbox(cache))
        self.prefill = jax.jit(lambda p, c, x: self.model.apply({"params": p, "cache": c}, x, decode=True,
                                                               mutable=["cache"])[0][:, -1])
        self.cache = cache
        # The keys and values a step reads on average: each row holds P + new/2 tokens midway through the decode.
        per_token = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(cache) if a.ndim >= 3) / (B * (P + self.new))
        self.kv_bytes = B * (P + self.new / 2) * per_token
        self.bandwidth = measured_bandwidth() if jax.devices()[0].platform == "cpu" else None
        t = time.perf_counter()
        jax.block_until_ready(self.gen(self.new))
        self.compile_s = time.perf_counter() - t
        jax.block_until_ready(self.prefill(self.params, self.cache, self.prompt))
        self.B, self.P = B, P
        self.n_params = sum(x.size for x in jax.tree.leaves(self.params))
        self.param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.params))
        self.device = jax.devices()[0]
        self.peak = flops.total_peak([self.device])
        self.settings = settings(cfg.model)
        self.times = []

    def ready(self):
        return {"device_kind": self.device.device_kind, "device_count": 1, "compile_s": self.compile_s,
                "peak_flops": self.peak, "settings": self.settings, **versions_and_fallbacks()}

    def profile(self, path):
        with self.jax.profiler.trace(path):
            self.jax.block_until_ready(self.gen(self.new))

    def round(self):
        t = time.perf_counter()
        self.jax.block_until_ready(self.prefill(self.params, self.cache, self.prompt))
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        self.jax.block_until_ready(self.gen(self.new))
        total = time.perf_counter() - t
        r = {"prefill_s": prefill, "generate_s": total}
        self.times.append(r)
        return r

    def final(self, since: int = 0):
        times = self.times[since:]
        prefill = median([r["prefill_s"] for r in times])
        total = median([r["generate_s"] for r in times])
        decode = max(total - prefill, 1e-9)
        dtps = self.B * self.new / decode
        out = {"tokens_per_s": dtps, "decode_tokens_per_s": dtps, "prefill_tokens_per_s": self.B * self.P / prefill,
               "time_to_first_token_s": prefill + decode / self.new,
               "mfu": dtps * 2 * self.n_params / self.peak, "peak_memory_mb": device_peak_memory_mb(self.device)}
        return {**out, **bandwidth_bound(dtps, self.B, self.param_bytes, self.device.device_kind, self.kv_bytes,
                                         self.bandwidth)}


def bandwidth_bound(decode_tokens_per_s, batch, param_bytes, device_kind, kv_bytes: float = 0.0,
                    bandwidth: float | None = None) -> dict:
    """Decoding against the memory-bandwidth bound: each step reads every parameter once (param_bytes) and the
    keys and values its rows hold (kv_bytes, all rows, on average over the decode), so at most
    batch * bandwidth / (param_bytes + kv_bytes) tokens/s; `decode_bound_frac` is the share of that reached.
    The bandwidth: the vendor's figure for a known GPU, else `bandwidth` (measured_bandwidth on a CPU), else none."""
    bw, method = hbm_bandwidth(device_kind), "vendor"
    if not bw:
        bw, method = bandwidth, "measured"
    if not bw:
        return {}
    bound = batch * bw / (param_bytes + kv_bytes)
    return {"param_bytes": param_bytes, "kv_bytes_per_step": kv_bytes, "hbm_bandwidth": bw,
            "bandwidth_method": BANDWIDTH_METHOD[method], "decode_bound_tokens_per_s": bound,
            "decode_bound_frac": decode_tokens_per_s / bound}


class ZooInput:
    """Tokenizer throughput on the built-in corpus, and batches/s from the token store."""

    def __init__(self, spec):
        from pydoc_data.topics import topics
        from zoo import tasks
        from zoo.overrides import apply_overrides, load_config_file
        from zoo.data.tokenizers import get_tokenizer
        self.texts = [topics[k] for k in sorted(topics)]
        self.mb = sum(len(t.encode()) for t in self.texts) / 2**20
        self.tokenizers = {n: get_tokenizer(n) for n in spec["tokenizers"]}
        cfg = apply_overrides(load_config_file(spec["config"]), spec["overrides"])
        self.batches = tasks.build(cfg).make_data(cfg, 0, 1).train
        self.batch, self.T, self.times = cfg.train.batch_size, cfg.data.seq_len, []

    def ready(self):
        return {"device_kind": "host", "device_count": 1, "compile_s": 0.0}

    def round(self):
        r = {}
        for name, tok in self.tokenizers.items():
            t = time.perf_counter()
            tok.encode_batch(self.texts)
            r[f"tokenize_{name}_s"] = time.perf_counter() - t
        t = time.perf_counter()
        for i in range(200):
            self.batches(i)
        r["batches_200_s"] = time.perf_counter() - t
        self.times.append(r)
        return r

    def final(self, since: int = 0):
        times = self.times[since:]
        out = {f"tokenizer_{n}_mb_per_s": self.mb / median([r[f"tokenize_{n}_s"] for r in times])
               for n in self.tokenizers}
        bps = 200 / median([r["batches_200_s"] for r in times])
        return {**out, "batches_per_s": bps, "tokens_per_s": bps * self.batch * self.T, "mfu": None}


ZOO = {"gpt_train": ZooTrain, "llama_train": ZooTrain, "lora_train": ZooTrain, "dpo_train": ZooTrain,
       "grpo_train": ZooGrpo, "sft_train": ZooTrain, "bert_mlm": ZooTrain, "encdec_train": ZooTrain,
       "generate": ZooGenerate, "llama_generate": ZooGenerate, "input": ZooInput, "eval_score": ZooScore,
       "embed": ZooEmbed, "embed_train": ZooEmbedTrain}


def serve(bench) -> None:
    print(json.dumps(bench.ready()), flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "quit":
            break
        if cmd == "round":
            out = bench.round()
        elif cmd == "final":
            out = bench.final(int(arg or 0))
        elif cmd == "profile":
            if not hasattr(bench, "profile"):
                out = {"profile": None}
            else:
                bench.profile(arg)
                out = {"profile": arg}
        else:
            out = {"error": f"unknown command {cmd!r}"}
        print(json.dumps(out), flush=True)


def main() -> int:
    framework, spec = sys.argv[1], json.loads(sys.argv[2])
    hold = "--hold" in sys.argv[3:]
    try:
        if framework == "zoo":
            from zoo import accel
            accel.configure()  # XLA's GPU flags, before jax's backend starts
            if os.environ.get("ZOO_BENCH_DISTRIBUTED"):  # one of several processes (zoo.cli.bench): before any jax call
                from zoo import distributed
                distributed.start(types.SimpleNamespace())
            if hold:
                sys.stdin.readline()
            bench = ZOO[spec["workload"]](spec)
        else:
            from zoo.bench import torch_peer  # the framework imports, before waiting
            if hold:
                sys.stdin.readline()
            bench = torch_peer.make(framework, spec)
    except Exception as e:  # reported to the parent as one line
        print(json.dumps({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}), flush=True)
        return 1
    serve(bench)
    if os.environ.get("ZOO_BENCH_DISTRIBUTED"):  # process 0 holds the coordination service: it leaves last
        from zoo import distributed
        distributed.finished()
        distributed.linger()
    return 0


if __name__ == "__main__":
    sys.exit(main())
