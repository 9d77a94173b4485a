#!/usr/bin/env bash
# The GPU story in one call on a lent H100/H200 (issue #20), most important first, each step under its own
# time limit so that whatever the lease allows comes back: GPT-2 124M beside both peers (with a profile),
# then what the last lease did not measure (SmolLM2-135M, generation, T5-small with cuDNN), BERT-base,
# GPT-2 medium/large, and last GPT-2 without zoo's XLA GPU flags (1.22x on 2026-11-27).
# On an H200 (2026-11-27, 570 s) the first four steps took 113, 64, 142 and 93 s (compile included; the
# torch.compile peer compiles for 26-50 s); generation and GPT-2 large did not finish in the 75 and 53 s
# left (their limits are raised here), T5-small took 150 s in a second call.
#
#     bash zoo/bench/gpu_story.sh OUT_DIR [SECONDS]     # SECONDS: the whole budget (default 540)
#
# OUT_DIR gets bench_gpu.jsonl (one row per shape), story.log, profiles.txt (per-op summary of each shape's
# trace: python -m zoo.bench.profile_summary), env.txt. SHAPES=cpu runs the same steps on the CPU shapes (a
# dry run of the script itself). Python packages missing on the machine come as wheels in .whl (see the
# device notes); .whl/more holds ones installed only if `import datasets` fails without them.
set -u
OUT=${1:?OUT_DIR}; BUDGET=${2:-540}; SHAPES=${SHAPES:-gpu}
mkdir -p "$OUT"; T0=$(date +%s); PROF=/tmp/zoo_prof; rm -rf "$PROF"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  if ! $PY -c "import datasets" 2>>"$OUT/env.txt" && ls .whl/more/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/more/*.whl
  fi
else
  export PYTHONPATH=$PWD
fi
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
  $PY -c "import jax, jaxlib, flax, optax, torch, transformers, datasets; print('jax', jax.__version__, 'flax',
flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__,
'datasets', datasets.__version__); print(jax.devices())" 2>&1 | tail -3
} >>"$OUT/env.txt"
# XLA aborts on a flag it does not know: check zoo's GPU flags once, and run without them if they abort
if ! $PY -c "from zoo import accel; print('flags', accel.configure()); import jax.numpy as jnp; jnp.ones(2).block_until_ready()" >>"$OUT/env.txt" 2>&1; then
  echo "zoo's XLA GPU flags abort this jaxlib: ZOO_XLA_GPU_FLAGS=0 for every step" | tee -a "$OUT/env.txt"
  export ZOO_XLA_GPU_FLAGS=0
fi
cat "$OUT/env.txt"

step() {  # step NAME SECONDS [ENV=...] -- zoo-bench args: run if the budget still allows SECONDS/2
  local name=$1 want=$2; shift 2
  local left=$((BUDGET - ($(date +%s) - T0) - 10))
  if [ "$left" -lt $((want / 2)) ]; then echo "== skip $name (${left}s left)" | tee -a "$OUT/story.log"; return; fi
  local lim=$((want < left ? want : left)); local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  echo "== $name (limit ${lim}s) $*" | tee -a "$OUT/story.log"
  local t=$(date +%s)
  env "${envs[@]}" timeout -k 5 "$lim" $PY -m zoo.cli.bench --shapes "$SHAPES" --rounds 3 --out "$OUT/bench_gpu.jsonl" \
    --profile "$PROF/$name" "$@" 2>&1 | grep -v '^{' | tee -a "$OUT/story.log"
  echo "== $name took $(($(date +%s) - t))s, rc ${PIPESTATUS[0]}" | tee -a "$OUT/story.log"
  if [ -d "$PROF/$name" ]; then
    { echo "######## $name"; $PY -m zoo.bench.profile_summary "$PROF/$name" --top 30; } >>"$OUT/profiles.txt" 2>&1
  fi
}
BOTH=hf-torch,hf-torch-compile
if [ "$SHAPES" = gpu ]; then G=gpt2_small-T1024-B16 B=bert_base-T128-B64
else G=L4-D256-T256-B8-V8192 B=L4-D256-T128-B16-V30522; fi
step gpt_train 240 -- --workload gpt_train --shape $G --peer $BOTH
step llama_train 170 -- --workload llama_train --peer $BOTH
step generate 150 -- --workload generate --peer hf-torch
step encdec_train 150 -- --workload encdec_train --peer $BOTH
step bert_mlm 150 -- --workload bert_mlm --shape $B --peer $BOTH
step gpt2_medium 100 -- --workload gpt_train --shape $G --preset gpt2_medium --batch 8
step gpt2_large 150 -- --workload gpt_train --shape $G --preset gpt2_large --batch 8
step gpt_noflags 75 ZOO_XLA_GPU_FLAGS=0 -- --workload gpt_train --shape $G
echo "== done in $(($(date +%s) - T0))s" | tee -a "$OUT/story.log"
