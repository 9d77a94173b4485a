"""Benchmark zoo's hot paths (step time, tokens/s, MFU, memory, compile time), beside transformers if asked.

Peers (--peer, repeatable or a comma list): hf-torch runs transformers (PyTorch) on the same shapes and
device (CUDA: bf16 autocast, SDPA, fused AdamW; CPU: float32), hf-torch-compile adds torch.compile;
lm-eval-hf (eval_score's peer) scores the same documents with lm-evaluation-harness's `hf` model on zoo's
exported weights.

    zoo-bench --workload gpt_train --preset gpt2_small --seq-len 1024 --batch 8 --dtype bfloat16
    zoo-bench --out bench.jsonl                    # every workload, one JSON line each, then a table
    zoo-bench --shapes cpu --peer hf-torch         # the scaled CPU shapes, transformers side by side
    zoo-bench --shapes cpu --workload llama_train --workload lora_train --workload sft_train --peer hf-torch
                                                   # full training vs LoRA (PEFT beside it), packed vs padded sft
    zoo-bench --shapes gpu --peer hf-torch,hf-torch-compile --rounds 3 --out bench_gpu.jsonl
                                                   # the GPU story in one call (one H100/H200)
    zoo-bench --workload eval_score --shapes cpu --peer lm-eval-hf
                                                   # zoo-eval's scoring vs the forward pass, and vs lm-eval's hf

Each framework runs in its own worker process; the parent alternates timed rounds between zoo and
each peer so that both see the same machine conditions, and reports medians and minima over rounds.
Ratios are zoo / peer measured in the same run. Each row names the card, the dtype, zoo's jax/flax
versions and each peer's transformers/torch versions. lora_train writes a random base first (its
init_from) and trains rank-16 adapters on it; sft_train reports real_tokens_per_s (the positions that
hold a token) beside tokens_per_s (every position). `--profile DIR` writes a jax.profiler trace of
a few zoo steps per shape (view with TensorBoard's profile plugin or Perfetto).

Several hosts: run the same command on every host, with `--coordinator HOST:PORT --num-processes N
--process-id I` (or the JAX_* variables, or on a cluster jax detects), as train.py takes them. zoo's worker on
each host then starts jax.distributed and the train workloads step over every host's devices: tokens/s and
MFU are the whole job's; process 0 prints the rows and writes --out. Peers and the generation and input
workloads run on one host only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from zoo import distributed
from zoo.bench import shapes as bench_shapes
from zoo.bench.run import ROUNDS, WARMUP, run_spec, table
from zoo.bench.shapes import PEER_NAMES
from zoo.cli import error
from zoo.errors import ConfigError

# The workloads that step over a mesh of several processes' devices (zoo.bench.worker.ZooTrain).
SEVERAL = ("gpt_train", "llama_train", "lora_train", "sft_train", "bert_mlm", "encdec_train")


def several_processes(a, peers, workloads) -> dict | None:
    """The zoo worker's environment for a multi-process run (None: one process); refusals -> ConfigError."""
    if not distributed.wanted(a):
        return None
    if peers:
        raise ConfigError(f"--peer {','.join(peers)} runs transformers on one host; on several processes zoo-bench "
                          f"measures zoo alone (leave out --peer)")
    alone = [w for w in workloads if w not in SEVERAL]
    if alone:
        raise ConfigError(f"--workload {alone[0]} runs on one process; on several: {', '.join(SEVERAL)}")
    env = {"ZOO_BENCH_DISTRIBUTED": "1"}
    explicit = distributed._explicit(a)
    if explicit:  # the flags reach the worker as jax's variables
        env.update({"JAX_COORDINATOR_ADDRESS": explicit["coordinator_address"],
                    "JAX_NUM_PROCESSES": str(explicit["num_processes"]), "JAX_PROCESS_ID": str(explicit["process_id"])})
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="zoo-bench", description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=bench_shapes.WORKLOADS, action="append",
                    help="repeatable; default: every workload with shapes in the --shapes set")
    ap.add_argument("--shapes", choices=bench_shapes.SHAPE_SETS, default="full",
                    help="full: the published shapes; cpu: the scaled shapes for a CPU; gpu: the GPU story "
                         "(GPT-2, BERT-base, T5-small, generation) for one H100/H200 (default: %(default)s)")
    ap.add_argument("--shape", action="append", metavar="NAME",
                    help="repeatable: only the shapes of this name (e.g. gpt2_small-T1024-B16); default: every "
                         "shape of the chosen workloads in the --shapes set")
    ap.add_argument("--preset", help="model preset for the train workloads (e.g. gpt2_small, bert_base); default: "
                                     "each shape's own model")
    example = bench_shapes.SHAPES[("gpt_train", "full")][0][1]  # for the defaults' example
    ap.add_argument("--seq-len", type=int, metavar="T",
                    help="tokens per training sequence (encdec_train: the source length) in every chosen shape, "
                         f"zoo's and the peers'; default: each shape's own (gpt_train's full shape: "
                         f"{example['seq_len']}); generation keeps its prompt and new-token lengths")
    ap.add_argument("--batch", type=int, metavar="B",
                    help="sequences per step (generation: prompts decoded together) in every chosen shape, zoo's "
                         f"and the peers'; default: each shape's own (gpt_train's full shape: {example['batch']})")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"),
                    help="compute dtype of zoo, and of the peers on CUDA (bf16 autocast in training, bf16 weights "
                         "in generation; on a CPU they stay float32); default: float32 on a CPU, bfloat16 on an "
                         "accelerator")
    ap.add_argument("--rounds", type=int, default=ROUNDS,
                    help=f"timed rounds per shape, alternated between zoo and each peer after {WARMUP} warm-up "
                         f"rounds; medians and minima are over these (default: %(default)s)")
    ap.add_argument("--peer", action="append", default=[], metavar="|".join(PEER_NAMES),
                    help="run transformers (PyTorch) on the same shapes and device, beside zoo; repeatable or "
                         "a comma list (each peer's ratio is reported); default: zoo alone")
    ap.add_argument("--out", help="append one JSON line per shape to this file; default: the lines are printed "
                                  "only")
    ap.add_argument("--profile", metavar="DIR", help="write a jax.profiler trace of a few zoo steps per shape "
                                                     "to DIR/WORKLOAD-SHAPE; default: no trace")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override for zoo's side, repeatable (e.g. model.attention_impl=xla, "
                         "model.remat=true); default: none")
    distributed.add_arguments(ap)
    a = ap.parse_args(argv)
    peers = list(dict.fromkeys(p.strip() for arg in a.peer for p in arg.split(",") if p.strip()))
    for p in peers:
        if p not in PEER_NAMES:
            ap.error(f"argument --peer: invalid choice: {p!r} (choose from {', '.join(PEER_NAMES)})")
    try:
        specs = bench_shapes.specs(a.workload or bench_shapes.workloads_with(a.shapes), a.shapes, preset=a.preset,
                                   seq_len=a.seq_len, batch=a.batch, dtype=a.dtype,
                                   names=a.shape)
        env = several_processes(a, peers, list(dict.fromkeys(spec["workload"] for spec in specs)))
    except (ValueError, ConfigError) as e:
        return error(e)
    rows = []
    for spec in specs:
        spec["overrides"] = spec.get("overrides", []) + a.set
        t = time.perf_counter()
        try:
            row = run_spec(spec, peers, a.rounds, profile=a.profile, env=env)
        except RuntimeError as e:  # zoo's worker refused the spec (bad --set) or died: one line, no traceback
            print(f"error: {spec['workload']} {spec['name']}: {e}", file=sys.stderr)
            return 2
        row["bench_wall_s"] = time.perf_counter() - t
        if row.pop("process_index", 0):  # one row per shape for the whole job: process 0's
            continue
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    if rows or env is None:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
