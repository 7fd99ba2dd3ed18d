#!/usr/bin/env bash
# Train over several nodes with plain mpirun (no SLURM).
#   HOSTFILE=hosts.txt bash launch/mpirun_multinode.sh configs/1b_lns.flags [extra flags]
#   DRY_RUN=1 HOSTFILE=hosts.txt bash launch/mpirun_multinode.sh configs/1b_lns.flags   # print only
# hosts.txt: one node per line ("node01 slots=8"). GPUS_PER_NODE ranks start on each
# node, each bound to its GPU by launch/bind_rank.sh; the run resumes from the newest
# checkpoint in OUT_DIR, which must be on a filesystem every node sees.
# SIGTERM to this script reaches the ranks as SIGUSR1: they finish the step, save and
# exit (docs/cluster.md: mpirun itself would kill them 1 s after a SIGTERM).
# A job that ends with a fault status (a hang the watchdog caught, a failed
# communicator or checkpoint write, a rank killed by a signal) is started again from
# --resume=auto, up to LNS_MAX_RESTARTS times (default 3) with back-off
# (LNS_RESTART_BACKOFF_S, default 30 s, doubled each time); never after a configuration
# error or a SIGTERM (launch/restart_policy.sh, docs/resilience.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/restart_policy.sh
FLAGFILE=${1:?usage: mpirun_multinode.sh FLAGFILE [extra lns_train flags]}
shift
HOSTFILE=${HOSTFILE:?set HOSTFILE to a file with one node per line}
[ -f "$HOSTFILE" ] || { echo "mpirun_multinode: error: HOSTFILE=$HOSTFILE not found" >&2; exit 1; }
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
mapfile -t NODES < <(grep -v '^\s*\(#\|$\)' "$HOSTFILE" | awk '{print $1}')
WORLD=$((${#NODES[@]} * GPUS_PER_NODE))
OUT_DIR=${OUT_DIR:-runs/$(basename "$FLAGFILE" .flags)}
export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-0} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-^lo,docker}
export NCCL_ASYNC_ERROR_HANDLING=${NCCL_ASYNC_ERROR_HANDLING:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export GPUS_PER_NODE
TRAIN=("${LNS_TRAIN_BIN:-./build/lns_train}" --flagfile="$FLAGFILE" --out_dir="$OUT_DIR" --resume=auto "$@")
MPI=(mpirun -np "$WORLD" --hostfile "$HOSTFILE" --map-by "ppr:$GPUS_PER_NODE:node" --bind-to none
     -x NCCL_IB_DISABLE -x NCCL_SOCKET_IFNAME -x NCCL_ASYNC_ERROR_HANDLING -x OMP_NUM_THREADS -x GPUS_PER_NODE
     -x LNS_RESTART_COUNT -x LNS_RESTART_CAUSE -x LNS_RESTART_STATUS
     launch/bind_rank.sh "${TRAIN[@]}")
if [ "${DRY_RUN:-0}" = 1 ]; then
  echo "nodes ${#NODES[@]} x $GPUS_PER_NODE GPUs = $WORLD ranks; out_dir $OUT_DIR"
  echo "restarts: up to ${LNS_MAX_RESTARTS:-3} after a fault status (76 77 78, or killed by a signal), back-off ${LNS_RESTART_BACKOFF_S:-30} s"
  echo "${MPI[*]}"
  for ((r = 0; r < WORLD; ++r)); do
    OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_LOCAL_RANK=$((r % GPUS_PER_NODE)) DRY_RUN=1 launch/bind_rank.sh "${TRAIN[@]}" \
      | sed "s/host [^ ]*/host ${NODES[$((r / GPUS_PER_NODE))]}/"
  done
  exit 0
fi
# Open MPI's mpirun answers SIGTERM by killing the job (SIGTERM to every rank, SIGKILL
# odls_base_sigkill_timeout = 1 s later, exit status 1): too soon for a step and a save.
# SIGUSR1 it forwards to every rank and then exits with the ranks' status.
# One attempt: mpirun in the background, so that the trap below can hand SIGTERM on.
pid=""
run_job() {
  "${MPI[@]}" &
  pid=$!
  local status
  while :; do
    status=0
    wait "$pid" || status=$?
    kill -0 "$pid" 2>/dev/null || break  # still running: wait was interrupted by the trap
  done
  pid=""
  return "$status"
}
trap 'echo "mpirun_multinode: SIGTERM: asking every rank to save and stop (SIGUSR1 to mpirun)" >&2
      LNS_STOP_REQUESTED=1; if [ -n "$pid" ]; then kill -USR1 "$pid"; fi' TERM
status=0
lns_run_with_restarts run_job || status=$?
exit "$status"
