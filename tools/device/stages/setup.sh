# shellcheck shell=bash
# The set-up every call runs, whatever its stages (the `data` stage is this alone:
# a call that carries .gpu-data unpacks its token files into the tree, where later calls
# on the machine find them): dependencies, environment, the kit's programs, env.json.
# Sourced by tools/device/run_gpu.sh in its own shell: it reads and sets the driver's
# variables (settings.sh) and calls its functions (common.sh, deps.sh).

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
