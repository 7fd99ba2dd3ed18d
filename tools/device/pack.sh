#!/usr/bin/env bash
# Prepares what an OFFLINE GPU node needs to build and run lns: downloads the
# Debian packages of the build dependencies (Open MPI, glog, gflags, Abseil,
# OpenBLAS, GoogleTest, nlohmann-json) and the runtime libraries they pull in
# into .gpu-deps/debs/ at the repo root. tools/device/run_gpu.sh, on the GPU
# node, unpacks them with `dpkg -x` into a private prefix (never into /).
#
# Why: the GPU node has CUDA, CMake, ninja, a compiler and PyTorch but no
# package registry; the working tree that travels there is limited to 64 MiB,
# so only the libraries are packed, not the compiler or the base system.
#
#   bash tools/device/pack.sh                      # download (idempotent)
#   bash tools/device/pack.sh --list               # print the package set only
#   bash tools/device/pack.sh --binaries build-dir # also copy built lns_* programs
#   bash tools/device/pack.sh --binaries build-dir --no-debs   # the programs only
#
# The programs' commit (git HEAD of the source folder the build was configured from, with
# "+dirty" where its tracked files differ) goes into the kit as bin/COMMIT; run_gpu.sh
# records that one, never the git metadata of the tree that travelled with it.
#
# Run on a Debian 12 (bookworm) machine with network access to its apt mirror.
# The set is resolved by apt itself (a simulated install on an empty system,
# so every alternative is decided the way apt would), then filtered: the
# toolchain (gcc, binutils, libc6-dev, libstdc++, libgomp), the base system
# (libc6, perl, dpkg, PAM, zlib, ...), ssh, X11 and documentation are left
# out, as the GPU node has its own. Files already downloaded with the right
# size are kept; .debs of packages no longer in the set are removed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEST=${LNS_GPU_DEPS:-$ROOT/.gpu-deps}
DEBS=$DEST/debs
MAX_MIB=${MAX_MIB:-50}          # the working tree travels with a 64 MiB limit

# What the build needs (the same list as tools/install_deps.sh, minus tools the
# GPU node already has).
PKGS=(libopenmpi-dev openmpi-bin libgoogle-glog-dev libgflags-dev libabsl-dev
      libopenblas-dev libgtest-dev nlohmann-json3-dev)
# Small base libraries that the filter below drops but that a minimal image may
# lack (libgfortran5 needs libquadmath0, libhwloc15 libudev1, libfabric1
# libatomic1, libunwind8 liblzma5, Open MPI zlib1g). run_gpu.sh deletes each
# where the node has its own copy, so they never shadow the system's.
EXTRA=(libquadmath0 libudev1 libatomic1 liblzma5 zlib1g)

# Packages (extended regexes) of the resolved set that are NOT packed.
EXCLUDE=(
  # compiler toolchain and its runtime: the GPU node's own gcc/g++ must be used
  '^(gcc|cpp|g\+\+|gfortran)(-[0-9]+)?$' '^gcc-[0-9]+-base$' '^(lib)?binutils' '^libctf'
  '^libgprofng' '^libgcc-' '^libgfortran-[0-9]+-dev$' '^libstdc\+\+'
  '^lib(asan|tsan|lsan|ubsan|itm|atomic|cc1-|gomp|gcc-s|quadmath)[0-9]'
  '^lib(isl|mpc|mpfr|gmp)[0-9]' '^libc6' '^libc-dev-bin$' '^linux-libc-dev$'
  '^lib(crypt|nsl|tirpc)' '^rpcsvc-proto$'
  # base system
  '^(adduser|debconf|debianutils|dpkg|tar|passwd|perl|perl-base|perl-modules-.*|libperl.*)$'
  '^libpam' '^lib(selinux|semanage|sepol|audit|cap-ng|acl)'
  '^lib(bz2|lzma|zstd|md|bsd|db|gdbm|tinfo|uuid|udev|pcre2|com-err|krb5|k5crypto|gssapi-krb5|keyutils|ssl|ffi)'
  '^zlib1g'
  # autotools (pulled in by libltdl-dev), ssh (remote launch only), docs, X11,
  # hwloc's optional plugins (libxml2 + 9 MiB of ICU), GoogleTest's sources
  '^(autoconf|automake|autotools-dev|m4|libltdl-dev)$'
  '^(openssh-client|libedit2|libcbor.*|libfido2-.*)$' '^libjs-'
  '^lib(x11|xau|xcb|xdmcp|xext|xnvctrl|xml2|icu|pciaccess)'
  '^(libhwloc-plugins|ocl-icd-libopencl1|googletest)$'
  # headers of Open MPI's own dependencies: only needed to link Open MPI statically
  '^lib(event|hwloc|ibverbs|nl-3|nl-route-3|numa|pmix)-dev$'
)

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
LIST_ONLY=0
NO_DEBS=0
BIN_DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --list) LIST_ONLY=1 ;;
    --no-debs) NO_DEBS=1 ;;
    --binaries) BIN_DIR=${2:?--binaries needs a build directory}; shift ;;
    --binaries=*) BIN_DIR=${1#*=} ;;
    -h|--help) usage 0 ;;
    *) echo "pack.sh: unknown argument $1" >&2; usage 2 >&2 ;;
  esac
  shift
done

# Optional: prebuilt programs (top-level lns_* executables of a build directory),
# for a node that should not build; they still need the libraries below. Only what a
# GPU runs (the CPU-only suites lns_tests and lns_format_tests stay here), stripped, and
# as one xz archive, bin.tar.xz, that run_gpu.sh unpacks: each program links the whole
# core library (with cuDNN's frontend, about 5 MB), and ten of them as they are would
# not fit the 64 MiB a call carries. bin/COMMIT: the commit they were built from.
pack_binaries() {
  case "$BIN_DIR" in /*) ;; *) BIN_DIR=$ROOT/$BIN_DIR ;; esac
  [ -d "$BIN_DIR" ] || { echo "pack.sh: no build directory $BIN_DIR" >&2; exit 1; }
  local src commit n=0 f
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BIN_DIR/CMakeCache.txt" 2>/dev/null || true)
  [ -n "$src" ] || { echo "pack.sh: $BIN_DIR/CMakeCache.txt does not name its source folder (CMAKE_HOME_DIRECTORY)" >&2; exit 1; }
  commit=$(git -C "$src" rev-parse --short HEAD 2>/dev/null) ||
    { echo "pack.sh: $src (the source of $BIN_DIR) is not a git checkout: no commit to stamp" >&2; exit 1; }
  git -C "$src" diff --quiet HEAD 2>/dev/null || commit+="+dirty"
  rm -rf "${DEST:?}/bin" "$DEST/bin.tar.xz"; mkdir -p "$DEST/bin"
  for f in "$BIN_DIR"/lns_* "$BIN_DIR"/tests/lns_*; do
    [ -f "$f" ] && [ -x "$f" ] || continue
    case "$(basename "$f")" in lns_tests|lns_format_tests) continue ;; esac
    cp -p "$f" "$DEST/bin/"; n=$((n + 1))
    if command -v strip >/dev/null; then strip --strip-unneeded "$DEST/bin/$(basename "$f")" 2>/dev/null || true; fi
  done
  echo "$commit" > "$DEST/bin/COMMIT"
  (cd "$DEST" && tar cf - bin | xz -T0 -6 > bin.tar.xz) && rm -rf "${DEST:?}/bin"
  log "packed $n programs of commit $commit from $BIN_DIR into $DEST/bin.tar.xz ($(( $(stat -c %s "$DEST/bin.tar.xz") / 1048576 )) MiB)"
}

log() { echo "[pack] $*"; }
if [ "$NO_DEBS" = 1 ]; then
  [ -n "$BIN_DIR" ] || { echo "pack.sh: --no-debs packs the programs only: give --binaries BUILD_DIR" >&2; exit 2; }
  pack_binaries
  exit 0
fi
command -v apt-get >/dev/null || { echo "pack.sh: needs apt-get (Debian 12)" >&2; exit 1; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# The GPU node is x86-64. On another architecture, apt is pointed at private
# amd64 package lists (as the device README does for its own .debs).
APT_OPTS=(-o APT::Install-Recommends=false)
# As root, apt would warn that its _apt user cannot write into the download folder.
[ "$(id -u)" -ne 0 ] || APT_OPTS+=(-o APT::Sandbox::User=root)
if [ "$(dpkg --print-architecture)" != amd64 ]; then
  mkdir -p /tmp/lns-apt-amd64/partial
  APT_OPTS+=(-o APT::Architecture=amd64 -o APT::Architectures=amd64
             -o Dir::State::Lists=/tmp/lns-apt-amd64)
  [ -n "$(ls /tmp/lns-apt-amd64/*Packages* 2>/dev/null)" ] || $SUDO apt-get "${APT_OPTS[@]}" update -qq
fi

# Resolve: simulate installing PKGS on a system with nothing installed.
WORK=$(mktemp -d)
EMPTY_STATUS=$WORK/status
: > "$EMPTY_STATUS"
trap 'rm -rf "$WORK"' EXIT
resolve() {
  apt-get -s "${APT_OPTS[@]}" -o Dir::State::status="$EMPTY_STATUS" install "${PKGS[@]}" "${EXTRA[@]}" \
    2>/dev/null | awk '/^Inst /{print $2}' | sort -u
}
ALL=$(resolve || true)
if [ -z "$ALL" ]; then
  log "apt cannot resolve the packages; running apt-get update"
  $SUDO apt-get "${APT_OPTS[@]}" update -qq
  ALL=$(resolve)
fi
EXCL_RE=$(IFS='|'; echo "${EXCLUDE[*]}")
mapfile -t SELECTED < <(grep -v -E "$EXCL_RE" <<<"$ALL" || true)
mapfile -t SKIPPED < <(grep -E "$EXCL_RE" <<<"$ALL" || true)
# EXTRA packages are wanted even where a pattern above matches them.
for p in "${EXTRA[@]}"; do
  printf '%s\n' "${SELECTED[@]}" | grep -qx "$p" || SELECTED+=("$p")
done
mapfile -t SELECTED < <(printf '%s\n' "${SELECTED[@]}" | sort -u)
mapfile -t SKIPPED < <(printf '%s\n' "${SKIPPED[@]}" | grep -vxF -f <(printf '%s\n' "${EXTRA[@]}") || true)
log "${#SELECTED[@]} packages to pack, ${#SKIPPED[@]} left to the GPU node's system"
if [ "$LIST_ONLY" = 1 ]; then
  printf '%s\n' "${SELECTED[@]}"
  echo "# left out: ${SKIPPED[*]}"
  exit 0
fi

# Download what is missing. --print-uris gives 'URI' FILE SIZE HASH per package
# (run in an empty folder: apt leaves out files already in the current one).
URIS=$(cd "$WORK" && apt-get download "${APT_OPTS[@]}" --print-uris "${SELECTED[@]}")
[ -n "$URIS" ] || { echo "pack.sh: apt-get download --print-uris printed nothing" >&2; exit 1; }
mkdir -p "$DEBS"
cd "$DEBS"
declare -A WANT=()
missing=()
while read -r _uri file size _hash; do
  [ -n "${file:-}" ] || continue
  WANT[$file]=1
  if [ -f "$file" ] && [ "$(stat -c %s "$file")" = "$size" ]; then continue; fi
  rm -f "$file"
  missing+=("${file%%_*}")
done <<<"$URIS"
for f in *.deb; do                       # stale versions / packages no longer needed
  [ -e "$f" ] || continue
  [ -n "${WANT[$f]:-}" ] || { log "removing stale $f"; rm -f "$f"; }
done
if [ ${#missing[@]} -gt 0 ]; then
  log "downloading ${#missing[@]} packages"
  apt-get download "${APT_OPTS[@]}" -q "${missing[@]}" 2>&1 | grep -v '^Get:' || true
else
  log "all ${#WANT[@]} packages already downloaded"
fi
for f in "${!WANT[@]}"; do
  [ -f "$f" ] || { echo "pack.sh: $f was not downloaded" >&2; exit 1; }
done

# A manifest for run_gpu.sh and for people: package, version, file.
{
  echo "# written by tools/device/pack.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) ($(. /etc/os-release; echo "$PRETTY_NAME"))"
  for f in *.deb; do
    echo "$(dpkg-deb -W --showformat='${Package} ${Version}' "$f") $f"
  done
} > MANIFEST

if [ -n "$BIN_DIR" ]; then
  pack_binaries
elif [ -f "$DEST/bin.tar.xz" ]; then
  log "note: $DEST/bin.tar.xz holds programs of an earlier --binaries run (rm it if stale)"
fi

# The folder must be ignored by git (it is carried explicitly) and small.
grep -qx '/.gpu-deps/' "$ROOT/.gitignore" 2>/dev/null || log "warning: add /.gpu-deps/ to .gitignore"
total_kib=$(du -sk "$DEST" | cut -f1)
log "$(ls "$DEBS"/*.deb | wc -l) .debs; $DEST holds $((total_kib / 1024)) MiB ($total_kib KiB)"
if [ "$total_kib" -gt $((MAX_MIB * 1024)) ]; then
  echo "pack.sh: $DEST is over $MAX_MIB MiB; the working tree travels with a 64 MiB limit" >&2
  exit 1
fi
log "carry it to the GPU node with the repo (the run tool: carry [\".gpu-deps\"]),"
log "then there: bash tools/device/run_gpu.sh"
