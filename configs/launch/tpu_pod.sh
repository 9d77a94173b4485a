#!/usr/bin/env bash
# A TPU pod slice: the same train.py on every worker of it (--worker=all). jax detects the pod and train.py
# starts jax.distributed by itself. zoo must be installed in REPO on every worker (default: ~/zoo), and
# WORKDIR and data.cache_dir must be on storage every worker sees (a Filestore or NFS mount).
#
#   TPU=my-v5e-32 ZONE=us-west4-a bash configs/launch/tpu_pod.sh configs/gpt2_small.py /mnt/shared/runs/gpt2 \
#       --set data.cache_dir=/mnt/shared/cache/zoo
set -euo pipefail
CONFIG=${1:?usage: tpu_pod.sh CONFIG WORKDIR [train.py options]}
WORKDIR=${2:?usage: tpu_pod.sh CONFIG WORKDIR [train.py options]}
shift 2
: "${TPU:?set TPU to the name of the pod slice}" "${ZONE:?set ZONE to its zone}"
printf -v args '%q ' "$CONFIG" --workdir "$WORKDIR" "$@"
gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=all --command="cd ${REPO:-~/zoo} && python3 train.py $args"
