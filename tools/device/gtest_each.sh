#!/usr/bin/env bash
# Runs each test of a gtest program in a process of its own and says which failed:
#
#   bash tools/device/gtest_each.sh PROGRAM FILTER [gtest arguments...]
#
# Why: run_gpu.sh's test stage runs carried test programs, and one test that aborts the
# process (a LOG(FATAL): every FP8 matmul did so on an H200 on 2026-11-28) would hide
# every test after it. EACH_TIMEOUT (300) seconds per test. Exit status 1 if any failed.
set -uo pipefail
prog=${1:?gtest_each.sh: PROGRAM FILTER [gtest arguments]}
filter=${2:?gtest_each.sh: PROGRAM FILTER [gtest arguments]}
shift 2
# --gtest_list_tests: "Suite." lines, then "  Name" lines (a parameter's comment after '#')
names=$("$prog" "$@" --gtest_filter="$filter" --gtest_list_tests | awk '/^[^ ]/ {s = $1} /^  / {print s $1}') || {
  echo "gtest_each: $prog cannot list its tests"
  exit 1
}
n=0
failed=()
for t in $names; do
  n=$((n + 1))
  timeout --kill-after=10 "${EACH_TIMEOUT:-300}" "$prog" "$@" --gtest_filter="$t" || failed+=("$t")
done
echo "gtest_each: $((n - ${#failed[@]})) of $n tests passed${failed[*]:+; failed: ${failed[*]}}"
[ "$n" -gt 0 ] && [ ${#failed[@]} -eq 0 ]
