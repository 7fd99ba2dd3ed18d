# shellcheck shell=bash
# run_gpu.sh's settings: the PRESET file, every setting's default, the results folder
# and the state the steps share. The first file tools/device/run_gpu.sh sources.
#
# Other settings (environment): OUT (results folder, default ./gpu-results),
# BUILD_DIR (build-gpu), JOBS (16), LNS_CUDA (ON), CMAKE_ARGS (extra cmake
# arguments), TEST_LABEL (gpu), CTEST_ARGS (extra ctest arguments), CONFIGS
# ("130m_lns 1b_lns 1b_lns_seq4k"), LNS_STEPS (10) and TORCH_STEPS (10) timed steps
# (at least 10: each step figure is their median, with their min and max in the record),
# PROFILE (1; 0 = no per-class profile), GRAPHS (1; 0 = no --cuda_graphs run), FP8 (1; 0 = no
# --fp8=delayed run), CUDNN (1; 0 = no
# cuDNN attention run; CUDNN_ATTENTION: cudnn, the default, or cudnn_nondeterministic;
# LNS_CUDNN_LIB names libcudnn.so.9, else python3's is found), KERNELS_TORCH (1; 0 skips PyTorch's kernel
# figures), TORCH (1; 0 skips the PyTorch step peers: lns only, a short call),
# VARIANTS (which runs of the bench stage a config gets: space-separated
# "cfg=variant,variant" entries, variants among lns (the plain step) profile graphs cudnn
# fp8 fp8bw torch torch_padded; a config not named gets all that the switches above
# allow. E.g. "1b_lns_seq4k=lns,cudnn" keeps a lease short), KERNELS (1; 0 skips
# lns_bench_kernels),
# GTEST_FILTER (the test stage with carried binaries runs only these gtests),
# PRESET (a file of defaults for these settings; tools/device/lease.env is the next
# lease's one call), LNS_COMMIT (the commit to record, default git's HEAD), BIN_DIR (where the lns_* programs are: $BUILD_DIR, or
# .gpu-deps/bin when pack.sh --binaries made it and there is no build),
# BENCH_LAUNCHER (e.g. "mpirun -np 1"; empty: run directly), STEP_TIMEOUT (seconds
# a stage step may run, 0 = no limit), TIMEOUT_<step name> (that step's own limit, over
# STEP_TIMEOUT: TIMEOUT_step_torch_padded_1b_lns_seq4k=300 gives the compiled peer at seq
# 4096 time for its compile), LNS_DEPS_PREFIX (/tmp/lns-deps), LNS_GPU_DEPS (the kit,
# .gpu-deps), LNS_DEBS ($LNS_GPU_DEPS/debs),
# DRY_RUN (1: run nothing; write the plan, $OUT/plan.tsv, and print its predicted duration
# from the measured costs, tools/device/predict.py and costs.json; exit status 1 where it
# does not fit the budget).

# PRESET: a file of defaults for the settings below (tools/device/lease.env: the next
# lease's one call); the call's own environment wins over it.
if [ -n "${PRESET:-}" ]; then
  [ -f "$PRESET" ] || { echo "run_gpu.sh: PRESET=$PRESET: no such file" >&2; exit 2; }
  set -a
  # shellcheck disable=SC1090
  . "$PRESET" || { echo "run_gpu.sh: PRESET=$PRESET: cannot be read as shell" >&2; exit 2; }
  set +a
fi
STAGES=${STAGES:-build test multi bench}
PREFIX=${LNS_DEPS_PREFIX:-/tmp/lns-deps}
KIT=${LNS_GPU_DEPS:-$ROOT/.gpu-deps}
DEBS=${LNS_DEBS:-$KIT/debs}
DRY_RUN=${DRY_RUN:-0}
# Every step figure is the median of at least MIN_STEPS timed steps: 3 to 5 cannot tell
# 1.10x from 1.15x (issue 44).
MIN_STEPS=10
LNS_STEPS=${LNS_STEPS:-10}
TORCH_STEPS=${TORCH_STEPS:-10}
for v in LNS_STEPS TORCH_STEPS; do
  if ! [[ ${!v} =~ ^[0-9]+$ ]] || [ "${!v}" -lt "$MIN_STEPS" ]; then
    echo "run_gpu.sh: $v=${!v}: expected a whole number >= $MIN_STEPS (a step figure is the median of at least $MIN_STEPS timed steps)" >&2
    exit 2
  fi
done
OUT=${OUT:-$ROOT/gpu-results}
BUILD_DIR=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-16}
LNS_CUDA=${LNS_CUDA:-ON}
CMAKE_ARGS=${CMAKE_ARGS:-}
TEST_LABEL=${TEST_LABEL:-gpu}
CTEST_ARGS=${CTEST_ARGS:-}
CONFIGS=${CONFIGS:-130m_lns 1b_lns 1b_lns_seq4k}
BENCH_LAUNCHER=${BENCH_LAUNCHER:-}
ARCH=x86_64-linux-gnu

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export OUT
RUNLOG=$OUT/run.log
: > "$RUNLOG"
PLAN=$OUT/plan.tsv
[ "$DRY_RUN" = 1 ] && : > "$PLAN"
FAILED=0
RECORDING=0  # 1 once the bench stage has begun: the record is rewritten after each step
STEP_RUNNING=0  # 1 while a step runs
STEP_TMP=$(mktemp -d)  # the running step's output pipe
trap 'rm -rf "$STEP_TMP"' EXIT
# PyTorch runs with the node's own library path: no Debian libraries in its way.
if [ -n "${LD_LIBRARY_PATH+set}" ]; then
  TORCH_ENV=(env "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1)
else
  TORCH_ENV=(env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1)
fi
