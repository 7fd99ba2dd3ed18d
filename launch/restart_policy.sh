# Sourced by the launchers (mpirun_multinode.sh, slurm/train.sbatch): which exit
# statuses of a job are faults to restart from --resume=auto, and the restart loop.
# The statuses are lns/core/exit_status.h's (tests/mpi/test_resilience.py checks that the
# two agree); docs/resilience.md explains them.
LNS_EXIT_DONE=0
LNS_EXIT_ERROR=1          # configuration or input: restarting would fail again
LNS_EXIT_SIGNAL_STOP=75   # saved after SIGTERM/SIGUSR1 (SLURM's time limit, pre-emption)
LNS_EXIT_HANG=76          # the watchdog found a section without progress
LNS_EXIT_COMM_FAULT=77    # a communicator failed (a peer died, a link broke)
LNS_EXIT_SAVE_FAULT=78    # a checkpoint write failed

# lns_exit_cause STATUS: one phrase for a log line and run.json.
lns_exit_cause() {
  case "$1" in
    0) echo "finished" ;;
    1) echo "error in the configuration or the input (exit status 1)" ;;
    75) echo "stopped on a signal after saving (exit status 75)" ;;
    76) echo "hang: the watchdog found no progress (exit status 76)" ;;
    77) echo "communicator failure: a peer or a link died (exit status 77)" ;;
    78) echo "checkpoint write failed (exit status 78)" ;;
    *)
      if [ "$1" -gt 128 ] 2>/dev/null; then
        echo "a rank was killed by signal $(($1 - 128)) (exit status $1: crash, out of memory, lost node)"
      else
        echo "exit status $1"
      fi ;;
  esac
}

# lns_is_fault STATUS: true for what a restart from the last checkpoint can get past.
lns_is_fault() {
  case "$1" in
    76|77|78) return 0 ;;
    *) [ "$1" -gt 128 ] 2>/dev/null ;;
  esac
}

# lns_run_with_restarts CMD...: runs CMD; after a fault status, runs it again (it
# resumes with --resume=auto) up to LNS_MAX_RESTARTS times (default 3), waiting
# LNS_RESTART_BACKOFF_S (default 30) seconds, doubled each time, capped at 600. Never
# after a configuration error, a clean end or a stop on a signal. Each attempt sees
# LNS_RESTART_COUNT, LNS_RESTART_CAUSE and LNS_RESTART_STATUS (lns_train records them
# in run.json). A restart is skipped when LNS_STOP_REQUESTED is non-empty (set by a
# launcher's signal trap). Returns the last attempt's status; sets LNS_LAST_STATUS.
lns_run_with_restarts() {
  local max=${LNS_MAX_RESTARTS:-3} backoff=${LNS_RESTART_BACKOFF_S:-30} status=0 attempt=0
  export LNS_RESTART_COUNT=0 LNS_RESTART_CAUSE="" LNS_RESTART_STATUS=""
  while :; do
    status=0
    "$@" || status=$?
    LNS_LAST_STATUS=$status
    if ! lns_is_fault "$status" || [ -n "${LNS_STOP_REQUESTED:-}" ]; then
      return "$status"
    fi
    if [ "$attempt" -ge "$max" ]; then
      echo "launch: $(lns_exit_cause "$status"); no restarts left (LNS_MAX_RESTARTS=$max)" >&2
      return "$status"
    fi
    attempt=$((attempt + 1))
    local wait_s=$backoff
    for ((i = 1; i < attempt; ++i)); do wait_s=$((wait_s * 2)); done
    [ "$wait_s" -le 600 ] || wait_s=600
    echo "launch: $(lns_exit_cause "$status"); restart $attempt of $max in ${wait_s} s from --resume=auto" >&2
    sleep "$wait_s" &
    wait $! || true  # a trapped signal interrupts the wait at once
    [ -z "${LNS_STOP_REQUESTED:-}" ] || return "$status"
    export LNS_RESTART_COUNT=$attempt LNS_RESTART_CAUSE="$(lns_exit_cause "$status")" LNS_RESTART_STATUS=$status
  done
}
