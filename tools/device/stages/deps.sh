# shellcheck shell=bash
# The node's set-up, as functions: the packed Debian dependencies unpacked into a private
# prefix, NCCL and cuDNN found, the environment pointed there, env.json written (setup.sh
# calls them).
# The commit recorded (env.json, the record) is LNS_COMMIT where set; else, where the
# programs are the kit's (pack.sh --binaries), the one pack.sh stamped into the kit
# (bin/COMMIT), never the travelled tree's git; else the tree's.
# Sourced by tools/device/run_gpu.sh in its own shell: it reads and sets the driver's
# variables (settings.sh) and calls its functions (common.sh, deps.sh).

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
