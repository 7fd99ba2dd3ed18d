# shellcheck shell=bash
# What every stage of run_gpu.sh calls: log, the stage and variant choices, step (one
# step of a stage: its limit, its log markers, the record after it) and the signal
# handler that ends a call cut off at its limit.
# Sourced by tools/device/run_gpu.sh in its own shell: it reads and sets the driver's
# variables (settings.sh) and calls its functions (common.sh, deps.sh).

log() { echo "[run_gpu] $*" | tee -a "$RUNLOG"; }
has_stage() { [[ " $STAGES " == *" $1 "* ]]; }
# want CFG VARIANT: whether the bench stage runs VARIANT for CFG (VARIANTS above).
want() {
  local e
  for e in ${VARIANTS:-}; do
    [[ $e == "$1="* ]] && { [[ ",${e#*=}," == *",$2,"* ]]; return; }
  done
  return 0
}

# The run's record, rewritten from what has finished (atomically: a kill leaves the last
# one whole). Quiet: its path is printed at the end of the run.
record() {
  [ "$RECORDING" = 1 ] && [ "$DRY_RUN" != 1 ] || return 0
  PYTHONDONTWRITEBYTECODE=1 python3 "$ROOT/tools/device/bench_record.py" "$OUT" --out "$OUT" --update \
    >/dev/null || log "record: bench_record.py failed"
}

# named CFG VARIANT: whether VARIANTS names VARIANT for CFG itself (not by default).
named() {
  local e
  for e in ${VARIANTS:-}; do
    [[ $e == "$1="* && ",${e#*=}," == *",$2,"* ]] && return 0
  done
  return 1
}

# step NAME LOGFILE CMD...: runs CMD, its output to the terminal and LOGFILE
# between the markers summarize.py reads; records a failure; rewrites the record.
step() {
  local name=$1 logfile=$2; shift 2
  local t0=$SECONDS rc limit_var=TIMEOUT_$name
  # STEP_TIMEOUT (seconds, 0: none): a hung kernel ends its step, not the whole lease;
  # TIMEOUT_<name>: this step's own (a compile that needs longer).
  local limit=${!limit_var:-${STEP_TIMEOUT:-0}}
  echo "### step $name: $*" | tee -a "$logfile"
  if [ "$DRY_RUN" = 1 ]; then  # the plan: name, limit, command
    printf '%s\t%s\t%s\n' "$name" "$limit" "$*" >> "$PLAN"
    rc=0
  else
    # In the background with a wait, not a foreground pipeline: a signal to this script
    # (the call cut off) runs on_signal at once, which passes it on to the step. The step's
    # timeout leads a process group of its own, which a signal to ours does not reach.
    rm -f "$STEP_TMP/out" && mkfifo "$STEP_TMP/out"
    STEP_RUNNING=1
    tee -a "$logfile" < "$STEP_TMP/out" &
    local tee_pid=$!
    timeout --kill-after=10 "$limit" "$@" > "$STEP_TMP/out" 2>&1 &
    wait "$!"
    rc=$?
    STEP_RUNNING=0
    wait "$tee_pid"
  fi
  echo "### done $name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$logfile"
  [ "$rc" -eq 0 ] || FAILED=1
  record
  return "$rc"
}

# A call cut off at its limit by SIGTERM (coreutils timeout's signal) ends its running
# step and rewrites its record with what finished since the last step (a kernel bench's
# figures so far); after a SIGKILL the record of the last finished step stays.
# shellcheck disable=SC2317  # run by run_gpu.sh's trap
on_signal() {
  # $!: the step's timeout (or its tee, where the signal came before the timeout began),
  # even where the signal came before step() could note it anywhere
  if [ "$STEP_RUNNING" = 1 ]; then
    kill -TERM "$!" 2>/dev/null  # the step's timeout passes it on to the step
    wait "$!"
  fi
  log "stopped by a signal"
  record
  exit 143
}
