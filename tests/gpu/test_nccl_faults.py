#!/usr/bin/env python3
"""The NCCL side of fault handling, under the emulator's NCCL stand-in (docs/resilience.md).

Two ranks train over NCCL (--device=cuda --comm=nccl, data parallel). The stand-in's
fault hook (LNS_SIM_NCCL_FAULT) makes one collective of rank 1 never finish, as a
wedged GPU or a dead link would:

- hang: nothing reports an error; the watchdog's step timeout expires, it calls
  ncclCommAbort from its own thread, the stuck collectives return, and the main thread
  ends the job with status 76, saying the communicator was aborted (the proof that the
  abort freed the collective instead of the process being killed inside it);
- fail: the collective also reports ncclRemoteError through ncclCommGetAsyncError, as
  NCCL does when a peer or the network fails; the watchdog's probe finds it within a
  second and the job ends with status 77, long before any timeout.

Exit 77 (skip) outside an emulation build: a real GPU run cannot inject these faults.
"""
import os
import subprocess
import sys
import tempfile
import time

TRAIN = os.environ.get("LNS_TRAIN_BIN")
MPIRUN = os.environ.get("MPIRUN", "mpirun")
SIM = os.environ.get("LNS_CUDA_SIM") == "1"

FLAGS = ["--vocab_size=64", "--hidden_size=64", "--intermediate_size=128", "--num_layers=2", "--num_heads=2",
         "--num_kv_heads=1", "--seq_len=16", "--micro_batch_size=2", "--global_batch_size=4", "--steps=8",
         "--data=random", "--val_data=", "--log_every=1", "--device=cuda", "--comm=nccl",
         "--straggler_every=0", "--heartbeat_s=0.5", "--timeout_step_auto_factor=0", "--timeout_step_s=20"]


def run(out, fault):
    env = dict(os.environ, LNS_SIM_NCCL_FAULT=fault, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    t0 = time.time()
    r = subprocess.run([MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", "2", TRAIN, *FLAGS, "--out_dir=" + out],
                       capture_output=True, text=True, timeout=600, env=env)
    return r, time.time() - t0


def main():
    if not TRAIN or not SIM:
        print("skipped: needs an emulation build (LNS_CUDA_SIM=1) and LNS_TRAIN_BIN")
        return 77
    d = tempfile.mkdtemp(prefix="lns_nccl_faults_")
    failures = []
    # The 12th collective a rank runs: the warm-up one at start-up, then the steps' sums
    # (a bucket reduce and the ZeRO all-gather per step): inside step 3 or later, after
    # the first step (which has the set-up timeout).
    r, took = run(os.path.join(d, "hang"), "hang@12:rank=1")
    if r.returncode != 76:
        failures.append("hang: exit status %d, expected 76" % r.returncode)
    if "made no progress in step" not in r.stderr:
        failures.append("hang: no watchdog report")
    if "NCCL: the watchdog aborted the communicator" not in r.stderr:
        failures.append("hang: no rank's main thread came back from the aborted collective")
    print("hang: exit %d after %.1f s" % (r.returncode, took))
    hang_err = r.stderr
    r, took = run(os.path.join(d, "fail"), "fail@12:rank=1")
    if r.returncode != 77:
        failures.append("fail: exit status %d, expected 77" % r.returncode)
    if "NCCL reports remote process exited or there was a network error" not in r.stderr:
        failures.append("fail: the report does not give NCCL's error")
    print("fail: exit %d after %.1f s" % (r.returncode, took))
    if failures:
        print("\n".join(failures))
        print("---- hang run, stderr tail ----\n" + hang_err[-4000:])
        print("---- fail run, stderr tail ----\n" + r.stderr[-4000:])
        print("kept: " + d)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
