#!/usr/bin/env bash
# Two processes of one run on this machine, as two hosts would run it: each starts jax.distributed from the
# flags below, computes on its own devices, and feeds its own rows; process 0 prints and writes.
#
#   bash configs/launch/local_two_process.sh CONFIG WORKDIR [train.py options ...]
#
# On CPU give each process devices of its own, e.g. XLA_FLAGS=--xla_force_host_platform_device_count=4 (two
# processes x 4 devices train as one process with 8). On one machine with GPUs, split them: GPUS_0=0,1,2,3
# GPUS_1=4,5,6,7 (each process's CUDA_VISIBLE_DEVICES). PORT (default 12355) is the coordinator's port.
set -euo pipefail
CONFIG=${1:?usage: local_two_process.sh CONFIG WORKDIR [train.py options]}
WORKDIR=${2:?usage: local_two_process.sh CONFIG WORKDIR [train.py options]}
shift 2
cd "$(dirname "$0")/../.."
pids=()
for i in 0 1; do
  gpus_var="GPUS_$i"
  env ${!gpus_var:+CUDA_VISIBLE_DEVICES=${!gpus_var}} \
    python train.py "$CONFIG" --workdir "$WORKDIR" --coordinator "127.0.0.1:${PORT:-12355}" --num-processes 2 \
    --process-id "$i" "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
