#!/usr/bin/env bash
# Builds lns with CUDA on an OFFLINE GPU node, runs the GPU tests and the
# benchmarks (ours and the PyTorch references), and prints a summary table.
# Run from anywhere; it works in the repo root:
#
#   bash tools/device/run_gpu.sh                   # all stages
#   STAGES="build test" bash tools/device/run_gpu.sh
#   STAGES=bench CONFIGS=130m_lns bash tools/device/run_gpu.sh
#   PRESET=tools/device/lease.env bash tools/device/run_gpu.sh   # what is still unmeasured
#   DRY_RUN=1 PRESET=tools/device/lease.env bash tools/device/run_gpu.sh   # its plan and time
#
# Why: the node has CUDA, CMake, ninja, a compiler and PyTorch, but none of our
# Debian dependencies and no registry. tools/device/pack.sh (on a Debian 12
# machine) put their .debs into .gpu-deps/debs/; here they are unpacked with
# `dpkg -x` into a private prefix (default /tmp/lns-deps, never /), and
# PATH / LD_LIBRARY_PATH / CMAKE_PREFIX_PATH and Open MPI's relocation
# variables (OPAL_PREFIX, PMIX_*) point there. Checked on Debian 12 with the
# system's copies hidden: configure, CPU build, unit and MPI tests pass. Debian's
# update-alternatives links (mpirun, mpicxx, libopenblas.so, ...), which
# package scripts would make, are made by hand.
#
# Stages (STAGES, space-separated; the dependencies are always set up), run in this
# order, whatever order STAGES names them in; the bench stage comes before the tests, so
# that a call cut off at its limit keeps its figures:
#   configure  cmake -S . -B $BUILD_DIR -G Ninja -DLNS_CUDA=ON -DCMAKE_BUILD_TYPE=Release
#   build      configure + cmake --build $BUILD_DIR -j $JOBS
#   bench      lns_bench_kernels, bench_kernels_torch.py, and for each of
#              $CONFIGS lns_bench_step --profile, lns_bench_step --cuda_graphs,
#              lns_bench_step --attention=cudnn, the FP8 steps and
#              bench_step_torch.py --compile (at the config's FFN and padded to a
#              multiple of 64; at seq 4096 the padded one only, unless VARIANTS names
#              torch); tools/device/bench_record.py rewrites the run's record
#              <gpu>-<date>.json after every step of the run from here on (the tests'
#              verdicts too: a step variant's figure counts only where its correctness
#              test passed in the same record), atomically, so that a call cut off at
#              its limit leaves a record of what finished
#   test       ctest --test-dir $BUILD_DIR -L $TEST_LABEL --output-on-failure
#   multi      tests/gpu/test_layouts_one_gpu.py: every parallel layout over
#              --comm=mpi on this one GPU (tp2, pp2, dp2 with ZeRO, tp2 with sequence
#              parallelism, pp2 interleaved, tp2 x pp2 x dp2, tp2 x pp2 with
#              --recompute=full) against the one-rank CUDA run, and a resume under
#              another layout on the GPU and the CPU, and NCCL's collectives at a
#              world of one rank (issue 29; under 2 minutes)
#   depth      the depth study's grid with --device=cuda (DEPTH_STUDY width64, scale: issue
#              31's width-512 grid on data/realtext, or fp8: issue 30's FP8-at-depth grid
#              beside the width-64 bf16 cells, docs/fp8_depth.md; DEPTH_GRID full, DEPTH_JOBS 4,
#              DEPTH_SECONDS 0 = no limit, DEPTH_OUT /tmp/depth_study_cuda), the cells
#              recorded in docs/depth_study_runs_cuda skipped; the records and the runs'
#              logs come back as $OUT/depth_study_cuda.tgz. Needs data/fortunes_bpe4k.*
#              (tools/experiments/bpe_corpus.py here; carry data)
#   fp8gap     issue 30's loss gap: 130M trained with --fp8=none and --fp8=delayed on
#              data/realtext (tools/experiments/fp8_gap.py; FP8_STEPS 2000, FP8_BATCH 64),
#              the record as $OUT/fp8_gap.json
#   crosscheck issue 31's CPU f32 cross-check: the scale study's smallest cell (12 blocks,
#              Pre-LN) for its first CROSSCHECK_STEPS (4) steps on this machine's CPU cores
#              and on the GPU, from the same weights and batches
#              (tools/experiments/scale_crosscheck.py; needs data/realtext, STAGES=data);
#              the record as $OUT/scale_crosscheck.json (commit it as
#              docs/depth_study_scale_crosscheck.json)
#   data       nothing but the set-up: a call that carries .gpu-data (tools/device/pack_data.sh)
#              unpacks its token files into the tree, where later calls on the machine find them
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
# The commit recorded (env.json, the record) is LNS_COMMIT where set; else, where the
# programs are the kit's (pack.sh --binaries), the one pack.sh stamped into the kit
# (bin/COMMIT), never the travelled tree's git; else the tree's.
#
# Results in $OUT (few files, as the device tool brings back at most 8):
#   env.json     date, GPU name and driver, nvcc, glibc, git commit, stages
#   run.log      every stage but the build, between '### step NAME' and
#                '### done NAME rc=RC seconds=S' lines (RESULT lines inside)
#   build.log    configure + build output
#   kernels.json, kernels_torch.json   the kernel benchmarks' figures
#   <gpu>-<date>.json   the run's record (tools/device/bench_record.py), rewritten after
#                every step from the bench stage on
#   summary.md   the table printed at the end (tools/device/summarize.py)
#   plan.tsv     DRY_RUN=1 only: each step, its limit, its command
# Exit status: 0 when every stage that ran succeeded, else 1.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
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

# ---- dependencies: unpack the .debs into $PREFIX -------------------------------------
# Unpacks one .deb with dpkg-deb, or with Python where dpkg is missing.
unpack_deb() {
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$PREFIX"
  else
    python3 - "$1" "$PREFIX" <<'EOF'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
with open(deb, "rb") as f:
    data = f.read()
assert data[:8] == b"!<arch>\n", deb + ": not a .deb"
pos = 8
while pos < len(data):           # ar members: 60-byte header, body padded to 2 bytes
    name, size = data[pos:pos + 16].decode().strip().rstrip("/"), int(data[pos + 48:pos + 58])
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        tf = tarfile.open(fileobj=io.BytesIO(body))
        # "tar" keeps absolute symlinks (Python >= 3.14 would refuse them by default)
        tf.extractall(dest, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
    pos += 60 + size + (size & 1)
EOF
  fi
}

setup_deps() {
  local debs=("$DEBS"/*.deb)
  if [ ! -e "${debs[0]}" ]; then
    log "no .debs in $DEBS: using the system's packages (run tools/device/pack.sh and carry .gpu-deps if cmake fails)"
    return 0
  fi
  local stamp
  stamp=$(stat -c '%n %s' "${debs[@]}" | md5sum | cut -d' ' -f1)   # names and sizes
  if [ "$(cat "$PREFIX/.lns-stamp" 2>/dev/null)" != "$stamp" ]; then
    log "unpacking ${#debs[@]} .debs into $PREFIX"
    rm -rf "$PREFIX"
    mkdir -p "$PREFIX"
    for d in "${debs[@]}"; do unpack_deb "$d" || { log "cannot unpack $d"; exit 1; }; done
    fix_prefix
    echo "$stamp" > "$PREFIX/.lns-stamp"
  else
    log "dependencies already unpacked in $PREFIX"
  fi
}

fix_prefix() {
  local U=$PREFIX/usr L=$PREFIX/usr/lib/$ARCH t l
  # update-alternatives links made by the packages' scripts on a real install
  for t in mpirun mpiexec mpicc mpicxx mpic++ mpiCC; do
    [ -e "$U/bin/$t" ] || ln -s "$t.openmpi" "$U/bin/$t"
  done
  for t in libblas.so.3 libblas.so liblapack.so.3 liblapack.so libopenblas.so.0 libopenblas.so; do
    [ -e "$L/$t" ] || ln -s "openblas-pthread/$t" "$L/$t"
  done
  # absolute symlinks (to /usr/..., /lib/...) are pointed into the prefix
  while IFS= read -r l; do
    t=$(readlink "$l")
    [ -e "$PREFIX$t" ] && ln -sfn "$PREFIX$t" "$l"
  done < <(find "$PREFIX" -type l -lname '/*')
  # Base-system libraries packed only for a system without them: where the
  # system has its own (usually newer) copy, ours must not shadow it.
  local ldcache
  ldcache=$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null)
  for t in libudev.so.1 libz.so.1 liblzma.so.5 libatomic.so.1 libquadmath.so.0 libgfortran.so.5; do
    l=$(awk -v so="$t" '$1 == so && /x86-64/ {print $NF; exit}' <<<"$ldcache")
    if [ -n "$l" ] && [ -f "$l" ]; then
      rm -f "$L/$t" "$L/$t".* "$PREFIX/lib/$ARCH/$t" "$PREFIX/lib/$ARCH/$t".*
    fi
  done
}

# NCCL: from the CUDA toolkit, else from PyTorch's pip package nvidia-nccl (which
# has no libnccl.so link and no CMake config: a small folder with both is made).
NCCL_DIR=""
find_nccl() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    if [ -e "$d/libnccl.so" ] || [ -e "$d/libnccl.so.2" ]; then NCCL_DIR=/usr/local/cuda; return; fi
  done
  d=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null) || return 0
  [ -e "$d/lib/libnccl.so.2" ] || return 0
  NCCL_DIR=$PREFIX/nccl
  mkdir -p "$NCCL_DIR/lib"
  ln -sfn "$d/include" "$NCCL_DIR/include"
  ln -sf "$d/lib/libnccl.so.2" "$NCCL_DIR/lib/libnccl.so.2"
  ln -sf libnccl.so.2 "$NCCL_DIR/lib/libnccl.so"
}

setup_env() {
  local U=$PREFIX/usr L=$PREFIX/usr/lib/$ARCH
  export PATH=$U/bin:/usr/local/cuda/bin:$PATH
  export LD_LIBRARY_PATH=$L:$L/openblas-pthread:$L/openmpi/lib:$L/pmix2/lib:$PREFIX/lib/$ARCH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export CMAKE_PREFIX_PATH=$U${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  # Open MPI and PMIx find their plugins, help texts and wrapper data from these
  # (PMIx was configured with absolute libdir and datadir: both are given).
  export OPAL_PREFIX=$U
  export PMIX_INSTALL_PREFIX=$L/pmix2 PMIX_LIBDIR=$L/pmix2/lib PMIX_DATADIR=$L/pmix2/share
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # Shared memory and TCP only: no InfiniBand/UCX probing (their providers are
  # not unpacked; tests/mpi/test_multihost.py needs TCP), and no CMA (ptrace
  # may be refused in a VM or container).
  export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
  export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp}
  export OMPI_MCA_osc=${OMPI_MCA_osc:-^ucx}
  export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
  # mpirun refuses to start without an ssh/rsh binary, even for local ranks.
  local ssh
  ssh=$(command -v ssh || command -v rsh || true)
  [ -f "$ssh" ] && [ -x "$ssh" ] || export OMPI_MCA_plm_rsh_agent=${OMPI_MCA_plm_rsh_agent:-false}
  find_nccl
  find_cudnn
  if [ -n "$NCCL_DIR" ]; then
    export NCCL_ROOT=$NCCL_DIR NCCL_HOME=$NCCL_DIR
    export CMAKE_PREFIX_PATH=$CMAKE_PREFIX_PATH:$NCCL_DIR
    export CMAKE_INCLUDE_PATH=$NCCL_DIR/include${CMAKE_INCLUDE_PATH:+:$CMAKE_INCLUDE_PATH}
    export CMAKE_LIBRARY_PATH=$NCCL_DIR/lib${CMAKE_LIBRARY_PATH:+:$CMAKE_LIBRARY_PATH}
    [ "$NCCL_DIR" = /usr/local/cuda ] || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$NCCL_DIR/lib
  fi
}

# libcudnn.so.9 for --attention=cudnn (src/cuda/cudnn/sdpa_cudnn.cpp loads it at run
# time): PyTorch's environment brings it as the nvidia-cudnn wheel. LNS_CUDNN_LIB names
# it; its folder goes on the library path for the sub-libraries it opens itself.
find_cudnn() {
  if [ -z "${LNS_CUDNN_LIB:-}" ]; then
    LNS_CUDNN_LIB=$(python3 - 2>/dev/null <<'PY'
import glob, site, sys
dirs = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for d in dirs:
    for f in sorted(glob.glob(d + "/nvidia/cudnn/lib/libcudnn.so.9")) + sorted(glob.glob(d + "/nvidia/cu*/lib/libcudnn.so.9")):
        print(f)
        sys.exit()
PY
) || true
  fi
  if [ -n "${LNS_CUDNN_LIB:-}" ] && [ -f "$LNS_CUDNN_LIB" ]; then
    export LNS_CUDNN_LIB LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$LNS_CUDNN_LIB")
    log "cuDNN: $LNS_CUDNN_LIB"
  else
    log "cuDNN: no libcudnn.so.9 found in python3's packages: --attention=cudnn runs will say so"
  fi
}

write_env() {
  local gpu nvcc_v glibc git_rev
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
  nvcc_v=$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' | head -1)
  glibc=$(ldd --version 2>/dev/null | head -1 | grep -o '[0-9.]*$')
  # The commit the programs were built from. The kit's (pack.sh --binaries stamps it into
  # bin/COMMIT) where they are the kit's: the copy of the tree that travelled has other
  # git metadata (the device tool's copy kept the session's starting commit and so read
  # "62777b0+dirty"). LNS_COMMIT overrides both.
  if [ -n "${LNS_COMMIT:-}" ]; then
    git_rev=$LNS_COMMIT
  elif [ "$BIN_DIR" = "$KIT/bin" ]; then
    git_rev=$(cat "$KIT/bin/COMMIT" 2>/dev/null || xz -dc "$KIT/bin.tar.xz" 2>/dev/null | tar xOf - bin/COMMIT 2>/dev/null)
    [ -n "$git_rev" ] || git_rev="unknown (the kit's programs carry no bin/COMMIT: pack them again)"
  elif git_rev=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD 2>/dev/null || git_rev+="+dirty"
  else
    git_rev="(no git)"
  fi
  GPU="$gpu" NVCC="$nvcc_v" GLIBC="$glibc" GITREV="$git_rev" NCCL="$NCCL_DIR" \
  STAGES_RUN="$STAGES" LABEL="$TEST_LABEL" python3 - "$OUT/env.json" <<'EOF'
import datetime, json, os, platform, sys
e = os.environ
json.dump({"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "gpu": e["GPU"] or "no nvidia-smi", "nvcc": e["NVCC"], "glibc": e["GLIBC"],
           "git": e["GITREV"], "host": platform.node(), "nccl": e["NCCL"],
           "stages": e["STAGES_RUN"], "test_label": e["LABEL"], "cpus": os.cpu_count()},
          open(sys.argv[1], "w"), indent=1)
EOF
  log "GPU: ${gpu:-none found}; nvcc ${nvcc_v:-missing}; glibc ${glibc:-?}; git $git_rev"
}

# ---- main ------------------------------------------------------------------------------
[ "$DRY_RUN" = 1 ] || setup_deps
setup_env

BIN_DIR=${BIN_DIR:-$BUILD_DIR}
# Programs that travelled packed (tools/device/pack.sh --binaries: $KIT/bin.tar.xz)
# and token files (tools/device/pack_data.sh: .gpu-data/*.tar.xz): each unpacked once,
# where the next calls on this machine find them.
if [ -f "$KIT/bin.tar.xz" ] && [ "$DRY_RUN" != 1 ]; then
  sum=$(cksum < "$KIT/bin.tar.xz")
  if [ "$(cat "$KIT/.unpacked_bin" 2>/dev/null)" != "$sum" ] || [ ! -d "$KIT/bin" ]; then
    rm -rf "${KIT:?}/bin" && (cd "$KIT" && xz -dc bin.tar.xz | tar xf -) &&
      echo "$sum" > "$KIT/.unpacked_bin" && log "programs: unpacked $KIT/bin.tar.xz" ||
      { log "programs: cannot unpack $KIT/bin.tar.xz"; FAILED=1; }
  fi
fi
for a in "$ROOT"/.gpu-data/*.tar.xz; do
  if [ ! -f "$a" ] || [ "$DRY_RUN" = 1 ]; then continue; fi
  stamp=$ROOT/data/.unpacked_$(basename "$a" .tar.xz)
  sum=$(cksum < "$a")
  if [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
    mkdir -p "$ROOT/data" && (cd "$ROOT" && xz -dc "$a" | tar xf -) && echo "$sum" > "$stamp" &&
      log "data: unpacked $(basename "$a")" || { log "data: cannot unpack $a"; FAILED=1; }
  fi
done
# The kit's programs where there is no build here and none is made in this call.
if ! has_stage build && [ ! -x "$BIN_DIR/lns_train" ] && { [ -x "$KIT/bin/lns_train" ] || [ -f "$KIT/bin.tar.xz" ]; }; then
  BIN_DIR=$KIT/bin
fi

write_env
glibc_minor=$(ldd --version 2>/dev/null | head -1 | grep -o '[0-9]*$')
if [ -n "$glibc_minor" ] && [ "$glibc_minor" -lt 36 ]; then
  log "warning: glibc 2.$glibc_minor; the Debian 12 libraries need 2.36 (libevent, used by Open MPI)"
fi

if has_stage configure || has_stage build; then
  : > "$OUT/build.log"
  gen=()
  if command -v ninja >/dev/null && ! grep -qs '^CMAKE_GENERATOR:INTERNAL=Unix Makefiles' "$BUILD_DIR/CMakeCache.txt"; then
    gen=(-G Ninja)
  fi
  U=$PREFIX/usr
  hints=()
  if [ -x "$U/bin/mpicxx" ]; then
    hints=(-DMPI_CXX_COMPILER="$U/bin/mpicxx" -DMPIEXEC_EXECUTABLE="$U/bin/mpirun"
           -DCBLAS_INCLUDE_DIR="$U/include/$ARCH/openblas-pthread")
  fi
  # shellcheck disable=SC2086  # CMAKE_ARGS is a list of words
  step configure "$OUT/build.log" cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DLNS_CUDA="$LNS_CUDA" \
    -DCMAKE_BUILD_TYPE=Release "${hints[@]}" $CMAKE_ARGS
  cfg_rc=$?
  if has_stage build && [ $cfg_rc -eq 0 ]; then
    step build "$OUT/build.log" cmake --build "$BUILD_DIR" -j "$JOBS"
  fi
  grep -E '^### (step|done) ' "$OUT/build.log" >> "$RUNLOG"
fi

# A call cut off at its limit by SIGTERM (coreutils timeout's signal) ends its running
# step and rewrites its record with what finished since the last step (a kernel bench's
# figures so far); after a SIGKILL the record of the last finished step stays.
# shellcheck disable=SC2317  # run by the trap below
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
trap on_signal TERM INT

if has_stage bench; then
  RECORDING=1
  # shellcheck disable=SC2086  # BENCH_LAUNCHER is a command line
  if [ "${KERNELS:-1}" != 0 ]; then
    # shellcheck disable=SC2086
    step kernels "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_kernels" --flagfile=configs/1b_lns.flags \
      --json="$OUT/kernels.json"
    # 130M's GEMMs too (hidden 768: 1.65x their bound at 130M against 1.43x at 1B), pass
    # by pass with the heuristic's candidates and the fused shapes
    # shellcheck disable=SC2086
    step kernels_130m_lns "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_kernels" --flagfile=configs/130m_lns.flags \
      --sections=step_gemm --json="$OUT/kernels_130m_lns.json"
  fi
  if [ "${KERNELS_TORCH:-1}" != 0 ]; then
    step kernels_torch "$RUNLOG" "${TORCH_ENV[@]}" python3 tools/bench/bench_kernels_torch.py \
      --json "$OUT/kernels_torch.json"
  fi
  # Per config: lns (with the per-class profile; PROFILE=0 skips it), then the fair
  # PyTorch peer, torch.compile + fused AdamW + autocast, at the config's FFN and with
  # the FFN padded to a multiple of 64 as lns pads it (where that changes the shape;
  # seq 4096 is compared padded only, unless VARIANTS names its unpadded peer, torch,
  # to keep the call short: its compile alone took over two minutes on an H100, so it
  # wants a limit of its own, TIMEOUT_step_torch_padded_1b_lns_seq4k).
  for cfg in $CONFIGS; do
    prof=()
    [ "${PROFILE:-1}" = 0 ] || ! want "$cfg" profile || prof=(--profile)
    if want "$cfg" lns; then
      # shellcheck disable=SC2086
      step "step_$cfg" "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_step" --flagfile="configs/$cfg.flags" \
        --device=cuda --bench_steps="$LNS_STEPS" --bench_warmup=2 "${prof[@]}"
    fi
    if [ "${GRAPHS:-1}" != 0 ] && want "$cfg" graphs; then  # the same step with its micro-batches as CUDA graphs
      # shellcheck disable=SC2086
      step "step_graphs_$cfg" "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_step" --flagfile="configs/$cfg.flags" \
        --device=cuda --bench_steps="$LNS_STEPS" --bench_warmup=2 --cuda_graphs
    fi
    if [ "${CUDNN:-1}" != 0 ] && want "$cfg" cudnn; then  # with cuDNN's fused attention (profiled: the fastest bf16 step)
      # shellcheck disable=SC2086
      step "step_cudnn_$cfg" "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_step" --flagfile="configs/$cfg.flags" \
        --device=cuda --bench_steps="$LNS_STEPS" --bench_warmup=2 --attention="${CUDNN_ATTENTION:-cudnn}" \
        "${prof[@]}"
    fi
    # The FP8 steps take the fastest bf16 step's attention (cuDNN where its library is
    # here), so that their ratio to it is the linears' alone.
    fp8_attn=()
    [ "${CUDNN:-1}" != 0 ] && [ -n "${LNS_CUDNN_LIB:-}" ] && [ -f "$LNS_CUDNN_LIB" ] &&
      fp8_attn=(--attention="${CUDNN_ATTENTION:-cudnn}")
    if [ "${FP8:-1}" != 0 ] && want "$cfg" fp8; then  # FP8 linears (docs/fp8.md): issue 30's >= 1.3x
      # (profiled too: its FP8 casts are a row of their own)
      # shellcheck disable=SC2086
      step "step_fp8_$cfg" "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_step" --flagfile="configs/$cfg.flags" \
        --device=cuda --bench_steps="$LNS_STEPS" --bench_warmup=2 --fp8=delayed "${fp8_attn[@]}" "${prof[@]}"
    fi
    if [ "${FP8:-1}" != 0 ] && want "$cfg" fp8bw; then  # 1 x 128 / 128 x 128 tile scales (profiled:
      # on an H200 it was 1.31x slower than bf16, 2026-11-28, and where that goes is not known)
      # shellcheck disable=SC2086
      step "step_fp8bw_$cfg" "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_step" --flagfile="configs/$cfg.flags" \
        --device=cuda --bench_steps="$LNS_STEPS" --bench_warmup=2 --fp8=blockwise "${fp8_attn[@]}" "${prof[@]}"
    fi
    [ "${TORCH:-1}" = 0 ] && continue
    torch_args=(--flagfile="configs/$cfg.flags" --device cuda --autocast --compile --fused_adam
                --steps "$TORCH_STEPS" --warmup 2)
    if want "$cfg" torch && { [[ $cfg != *seq4k* ]] || named "$cfg" torch; }; then
      step "step_torch_$cfg" "$RUNLOG" "${TORCH_ENV[@]}" python3 tools/bench/bench_step_torch.py "${torch_args[@]}"
    fi
    ffn=$(sed -n 's/^--intermediate_size=\([0-9]*\).*/\1/p' "configs/$cfg.flags" | tail -1)
    if [ -n "$ffn" ] && [ $((ffn % 64)) -ne 0 ] && want "$cfg" torch_padded; then
      step "step_torch_padded_$cfg" "$RUNLOG" "${TORCH_ENV[@]}" python3 tools/bench/bench_step_torch.py \
        "${torch_args[@]}" --pad_ffn 64
    fi
  done
  # One record of the whole run, $OUT/<gpu>-<date>.json (rewritten after every step from
  # here on, the tests' verdicts too): commit it as docs/benchmarks/<gpu>-<date>.json
  # (tools/device/bench_record.py --tables then regenerates the BENCHMARKS tables).
fi

if has_stage test; then
  if [ -f "$BUILD_DIR/CTestTestfile.cmake" ]; then
    # shellcheck disable=SC2086  # CTEST_ARGS is a list of words
    step test "$RUNLOG" ctest --test-dir "$BUILD_DIR" -L "$TEST_LABEL" --output-on-failure $CTEST_ARGS
  else
    # No build here (pack.sh --binaries carried the programs): the single-GPU tests
    # from the carried test programs; the multi-rank ones need a build (ctest).
    # Each test in a process of its own (tools/device/gtest_each.sh): one that aborts
    # hides none of the others. GTEST_FILTER: a chosen subset, e.g. the kernels a change touched.
    if [ -n "${GTEST_FILTER:-}" ]; then
      step test_gpu "$RUNLOG" bash tools/device/gtest_each.sh "$BIN_DIR/lns_gpu_tests" "$GTEST_FILTER"
    else
      step test_gpu "$RUNLOG" bash tools/device/gtest_each.sh "$BIN_DIR/lns_gpu_tests" '*' \
        --gtest_also_run_disabled_tests
      step test_tiny_run "$RUNLOG" env LNS_TRAIN_BIN="$BIN_DIR/lns_train" PYTHONDONTWRITEBYTECODE=1 \
        python3 tests/gpu/test_tiny_run.py
    fi
  fi
fi

if has_stage multi; then
  step multi "$RUNLOG" env LNS_TRAIN_BIN="$BIN_DIR/lns_train" LNS_EVAL_BIN="$BIN_DIR/lns_eval" MPIRUN=mpirun \
    PYTHONDONTWRITEBYTECODE=1 python3 tests/gpu/test_layouts_one_gpu.py
  # NCCL for real at a world of one rank (the only NCCL a one-GPU machine can run)
  mpi_tests=$BIN_DIR/tests/lns_mpi_tests
  [ -x "$mpi_tests" ] || mpi_tests=$BIN_DIR/lns_mpi_tests
  step nccl_one_rank "$RUNLOG" mpirun -np 1 "$mpi_tests" --device=cuda --comm=nccl --gtest_filter='NcclOneRank.*'
fi

if has_stage fp8gap; then
  # Issue 30's loss gap (docs/fp8.md): the 130M model trained twice, bf16 and
  # --fp8=delayed, on the same real text (data/realtext.*: a call that carried .gpu-data
  # earlier on this machine, STAGES=data), seed and batches; the record comes back as
  # $OUT/fp8_gap.json. FP8_STEPS (2000) and FP8_BATCH (64 sequences of 256 tokens).
  if [ -f data/realtext.train.tok ]; then
    step fp8gap "$RUNLOG" python3 tools/experiments/fp8_gap.py --lns_train "$BIN_DIR/lns_train" \
      --flagfile configs/130m_lns.flags --out /tmp/lns-fp8gap --json "$OUT/fp8_gap.json" -- \
      --data=data/realtext.train.tok --val_data=data/realtext.val.tok --vocab_size=32768 --data_mode=packed \
      --global_batch_size="${FP8_BATCH:-64}" --micro_batch_size="${FP8_BATCH:-64}" --steps="${FP8_STEPS:-2000}" \
      --warmup_steps=200 --eval_every=0 --eval_tokens=262144 --log_every=100
  else
    log "fp8gap: no data/realtext.train.tok here: run STAGES=data with .gpu-data carried first"
    FAILED=1
  fi
fi

if has_stage crosscheck; then
  # Issue 31's CPU f32 cross-check (docs/depth_study_scale.md): one lns_train runs both
  # devices; the CPU run takes every core (about 4 x 150 s on 2 cores, 2026-11-28).
  if [ -f data/realtext.train.tok ]; then
    step crosscheck "$RUNLOG" env PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 python3 tools/experiments/scale_crosscheck.py \
      --cpu_bin "$BIN_DIR" --cuda_bin "$BIN_DIR" --steps "${CROSSCHECK_STEPS:-4}" --threads "$(nproc)" \
      --out /tmp/lns-crosscheck --record "$OUT/scale_crosscheck.json"
  else
    log "crosscheck: no data/realtext.train.tok here: run STAGES=data with .gpu-data carried first"
    FAILED=1
  fi
fi

if has_stage depth; then
  # The depth study's grid on the GPU (docs/depth_study.md): resumable, so a second call on
  # the same machine goes on; DEPTH_SECONDS stops it (SIGTERM: running trainings save a
  # checkpoint) in time to pack the records, which come back as one archive ($OUT keeps
  # few files). The records go to their own folder: bf16 GPU runs are a separate study.
  # The records that travelled (docs/depth_study_runs_cuda) say which cells are finished.
  # DEPTH_STUDY=scale runs issue 31's grid (width 512 on the real corpus, which travels
  # as .gpu-data: tools/device/pack_data.sh) instead of the width-64 one.
  # DEPTH_STUDY=fp8 runs issue 30's grid: its FP8 cells' records, and the width-64 bf16
  # cells it pairs them with (docs/depth_study_runs_cuda), both come back.
  DEPTH_STUDY=${DEPTH_STUDY:-width64}
  case $DEPTH_STUDY in
    scale) def_grid=scale; def_jobs=2; tag=_scale ;;
    fp8) def_grid=fp8; def_jobs=4; tag=_fp8 ;;
    *) def_grid=full; def_jobs=4; tag="" ;;
  esac
  DEPTH_OUT=${DEPTH_OUT:-/tmp/depth_study${tag}_cuda}
  DEPTH_RECORD=$ROOT/$(python3 tools/experiments/depth_study.py --study "$DEPTH_STUDY" --device cuda --print_record)
  BASE_RECORD=$ROOT/$(python3 tools/experiments/depth_study.py --study width64 --device cuda --print_record)
  mkdir -p "$DEPTH_OUT" "$DEPTH_RECORD" "$BASE_RECORD"
  RECORDS=("$(basename "$DEPTH_RECORD")")
  [ "$DEPTH_STUDY" = fp8 ] && RECORDS+=("$(basename "$BASE_RECORD")")
  step depth "$RUNLOG" timeout -s TERM "${DEPTH_SECONDS:-0}" env PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    python3 tools/experiments/depth_study.py --study "$DEPTH_STUDY" --grid "${DEPTH_GRID:-$def_grid}" --device cuda \
    --bin "$BIN_DIR" --jobs "${DEPTH_JOBS:-$def_jobs}" --threads 2 --out "$DEPTH_OUT" --record "$DEPTH_RECORD"
  # the records, and every run's logs (why one failed; its throughput)
  (cd "$DEPTH_OUT" && find . \( -name '*.log' -o -name result.json \) -print |
     tar czf "$OUT/depth_study${tag}_cuda.tgz" -C "$(dirname "$DEPTH_RECORD")" "${RECORDS[@]}" \
       -C "$DEPTH_OUT" -T -) || FAILED=1
fi

if [ "$DRY_RUN" = 1 ]; then  # what the call would run and how long that takes
  echo
  PYTHONDONTWRITEBYTECODE=1 python3 "$ROOT/tools/device/predict.py" "$PLAN"
  exit $?
fi
if [ "$RECORDING" = 1 ]; then
  rec=$(PYTHONDONTWRITEBYTECODE=1 python3 "$ROOT/tools/device/bench_record.py" "$OUT" --out "$OUT" --update) &&
    log "the run's record: $rec" || FAILED=1
fi
echo
PYTHONDONTWRITEBYTECODE=1 python3 "$ROOT/tools/device/summarize.py" "$OUT" | tee "$OUT/summary.md"
exit "$FAILED"
