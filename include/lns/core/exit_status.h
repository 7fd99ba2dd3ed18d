// The exit statuses of lns_train, said once. The launchers (launch/restart_policy.sh)
// restart a job from --resume=auto after a fault and never after an error of the
// configuration or the input, so each cause has a status of its own;
// tests/mpi/test_resilience.py checks that the shell file and this header agree.
#pragma once

namespace lns {

enum ExitStatus : int {
  kExitDone = 0,       // the run finished (or had nothing left to do)
  kExitError = 1,      // bad flags, data, files or a diverged run: restarting would fail again
  kExitSignalStop = 75,  // default of --exit_code_on_signal under SLURM: saved after SIGTERM/SIGUSR1
  kExitHang = 76,      // the watchdog found no progress within a section's timeout (parallel/watchdog.h)
  kExitCommFault = 77,  // a communicator failed: a peer died or a link broke (NCCL's async error)
  kExitSaveFault = 78,  // a checkpoint write failed (disk full or slow past its timeout); the
                        // previous checkpoint is intact
};
// A process killed by signal N ends mpirun or srun with 128 + N (137 for SIGKILL):
// a crash, the OOM killer or a lost node, also a fault the launchers restart.

}  // namespace lns
