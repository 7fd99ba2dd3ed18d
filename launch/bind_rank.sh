#!/usr/bin/env bash
# Per-rank wrapper: finds this rank's local rank on its node (Open MPI, SLURM or a
# generic LOCAL_RANK), binds it to one GPU (CUDA_VISIBLE_DEVICES) and, when numactl
# and nvidia-smi can tell, to the CPU cores near that GPU; then runs the command.
#   launch/bind_rank.sh ./build/lns_train --flagfile=...
# GPUS_PER_NODE (default: nvidia-smi's count) bounds the local rank: more local ranks
# than GPUs is an error naming the host. DRY_RUN=1 prints the binding and the command.
set -euo pipefail
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-${LOCAL_RANK:-}}}
rank=${OMPI_COMM_WORLD_RANK:-${SLURM_PROCID:-${RANK:-0}}}
host=$(hostname)
if [ -z "$local_rank" ]; then
  echo "bind_rank: error: no local rank (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or LOCAL_RANK) on $host" >&2
  exit 1
fi
gpus=${GPUS_PER_NODE:-}
if [ -z "$gpus" ] && command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi --list-gpus | wc -l)
fi
if [ -n "$gpus" ] && [ "$local_rank" -ge "$gpus" ]; then
  echo "bind_rank: error: local rank $local_rank on $host but only $gpus GPUs there; launch at most $gpus ranks per node" >&2
  exit 1
fi
export CUDA_VISIBLE_DEVICES=$local_rank LOCAL_RANK=$local_rank
cpus=""
if command -v nvidia-smi >/dev/null 2>&1 && command -v numactl >/dev/null 2>&1; then
  # The "CPU Affinity" column of the topology matrix for this GPU.
  cpus=$(nvidia-smi topo -m 2>/dev/null | awk -v g="GPU$local_rank" '$1 == g {for (i = 2; i <= NF; ++i) if ($i ~ /^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$/) {print $i; exit}}')
fi
if [ "${DRY_RUN:-0}" = 1 ]; then
  echo "rank $rank host $host local_rank $local_rank CUDA_VISIBLE_DEVICES=$local_rank cpus=${cpus:-any} cmd: $*"
  exit 0
fi
if [ -n "$cpus" ]; then exec numactl --physcpubind="$cpus" "$@"; fi
exec "$@"
