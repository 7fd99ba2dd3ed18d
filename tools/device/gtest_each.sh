#!/usr/bin/env bash
# Runs each test of a gtest program in a process of its own and says which failed:
#
#   bash tools/device/gtest_each.sh PROGRAM FILTER [gtest arguments...]
#
# Why: run_gpu.sh's test stage runs carried test programs, and one test that aborts the
# process (a LOG(FATAL): every FP8 matmul did so on an H200 on 2026-11-28) would hide
# every test after it. EACH_TIMEOUT (300) seconds per test. Exit status 1 if any failed.
#
# The tests run in the order of FILTER's patterns (those of its first pattern first,
# then the second's, ...; gtest's own order within one), so that a call cut off at its
# limit has run the ones named first: run_gpu.sh's record counts a step figure only where
# its correctness test passed (tools/device/summarize.py, CORRECTNESS). After each test
# one line, "gtest_each: passed|skipped|FAILED NAME", which the record reads; a test
# that called GTEST_SKIP is "skipped", not passed.
set -uo pipefail
prog=${1:?gtest_each.sh: PROGRAM FILTER [gtest arguments]}
filter=${2:?gtest_each.sh: PROGRAM FILTER [gtest arguments]}
shift 2
# --gtest_list_tests: "Suite." lines, then "  Name" lines (a parameter's comment after '#')
listed=$("$prog" "$@" --gtest_filter="$filter" --gtest_list_tests | awk '/^[^ ]/ {s = $1} /^  / {print s $1}') || {
  echo "gtest_each: $prog cannot list its tests"
  exit 1
}
# Order by the filter's positive patterns (gtest's '*' and '?' are bash's glob ones).
names=()
declare -A seen=()
IFS=':' read -r -a patterns <<<"${filter%%-*}"
[ ${#patterns[@]} -gt 0 ] || patterns=('*')
for pat in "${patterns[@]}"; do
  for t in $listed; do
    # shellcheck disable=SC2053  # $pat is a glob on purpose
    if [[ -z ${seen[$t]:-} && $t == $pat ]]; then
      names+=("$t")
      seen[$t]=1
    fi
  done
done
for t in $listed; do  # what no positive pattern matched as a glob (gtest matched it): last
  [ -n "${seen[$t]:-}" ] || names+=("$t")
done
n=0
failed=()
skipped=()
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for t in "${names[@]}"; do
  n=$((n + 1))
  timeout --kill-after=10 "${EACH_TIMEOUT:-300}" "$prog" "$@" --gtest_filter="$t" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    echo "gtest_each: FAILED $t (rc $rc)"
  elif grep -q '^\[  SKIPPED \]' "$out"; then
    skipped+=("$t")
    echo "gtest_each: skipped $t"
  else
    echo "gtest_each: passed $t"
  fi
done
echo "gtest_each: $((n - ${#failed[@]} - ${#skipped[@]})) of $n tests passed${skipped[*]:+; skipped: ${skipped[*]}}${failed[*]:+; failed: ${failed[*]}}"
[ "$n" -gt 0 ] && [ ${#failed[@]} -eq 0 ]
