#!/usr/bin/env python3
"""A data- and pipeline-parallel job across two "hosts" on one machine, the way a
cluster would see them: Open MPI starts one daemon per host through its remote-shell
agent, here a script that gives each daemon its own UTS namespace and hostname
(node-127-0-0-11, node-127-0-0-12; the hostfile names loopback addresses). Ranks then
see different hostnames and per-host local ranks, talk over TCP, and the job must
still compute the single-process losses: nothing may assume one node (local rank
from the global rank, a hostname, node-local state)."""
import json
import os
import shutil
import stat
import subprocess
import tempfile
import unittest

TRAIN = os.environ.get("LNS_TRAIN_BIN")
MPIRUN = os.environ.get("MPIRUN", "mpirun")
HERE = os.path.dirname(os.path.abspath(__file__))
BIND = os.path.join(HERE, "..", "..", "launch", "bind_rank.sh")
MODEL = ["--vocab_size=64", "--hidden_size=32", "--intermediate_size=64", "--num_layers=3", "--num_heads=4",
         "--num_kv_heads=2", "--seq_len=16", "--micro_batch_size=2", "--global_batch_size=8", "--data=random",
         "--steps=4", "--log_every=1"]
AGENT = """#!/usr/bin/env bash
while [[ "$1" == -* ]]; do shift; done
host=$1; shift
# The command is a shell string ("PATH=...; export PATH; orted ..."): run it as one.
exec unshare --uts bash -c "hostname node-${host//./-} && $*"
"""


def can_fake_hosts():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0


@unittest.skipUnless(TRAIN, "LNS_TRAIN_BIN not set (ctest sets it)")
@unittest.skipUnless(can_fake_hosts(), "needs root and unshare --uts to give each fake host its own hostname")
class MultiHost(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="lns_multihost_")
        cls.agent = os.path.join(cls.dir, "fake_ssh.sh")
        with open(cls.agent, "w") as f:
            f.write(AGENT)
        os.chmod(cls.agent, os.stat(cls.agent).st_mode | stat.S_IEXEC)
        cls.hostfile = os.path.join(cls.dir, "hosts")
        with open(cls.hostfile, "w") as f:
            f.write("127.0.0.11 slots=2\n127.0.0.12 slots=2\n")
        ref = os.path.join(cls.dir, "single")
        subprocess.run([TRAIN, *MODEL, "--out_dir=" + ref], check=True, capture_output=True)
        cls.ref = cls.losses(ref)

    @staticmethod
    def losses(run):
        with open(os.path.join(run, "metrics.jsonl")) as f:
            return [r["loss"] for r in map(json.loads, f) if "loss" in r]

    def mpirun(self, mapping, *cmd, env=None):
        full = [MPIRUN, "--mca", "plm_rsh_agent", self.agent, "--hostfile", self.hostfile, "--map-by", mapping,
                "-np", "4", "-x", "OMP_NUM_THREADS=1", *cmd]
        return subprocess.run(full, capture_output=True, text=True, timeout=120, env=env)

    def test_local_ranks_are_per_host(self):
        env = dict(os.environ, DRY_RUN="1", GPUS_PER_NODE="2")
        r = self.mpirun("slot", "-x", "DRY_RUN", "-x", "GPUS_PER_NODE", BIND, "true", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        seen = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            seen.setdefault(parts[3], []).append(int(parts[5]))  # host -> local ranks
        self.assertEqual(sorted(seen), ["node-127-0-0-11", "node-127-0-0-12"])
        self.assertTrue(all(sorted(v) == [0, 1] for v in seen.values()), seen)

    def test_dp_and_pp_across_hosts_equal_one_process(self):
        # by slot: the two stages sit on different hosts (activations cross);
        # by node: the two data-parallel replicas do (gradient sums cross).
        for mapping in ("slot", "node"):
            out = os.path.join(self.dir, "run_" + mapping)
            r = self.mpirun(mapping, TRAIN, *MODEL, "--pp=2", "--out_dir=" + out)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            with open(os.path.join(out, "run.json")) as f:
                self.assertEqual(len(set(json.load(f)["hosts"])), 2)
            for a, b in zip(self.losses(out), self.ref):
                self.assertAlmostEqual(a, b, delta=1e-5 * b, msg=mapping)


if __name__ == "__main__":
    unittest.main(verbosity=2)
