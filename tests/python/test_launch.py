#!/usr/bin/env python3
"""The launchers in dry-run mode (rank count, GPU per rank, resume flag), the
local-rank check, and the pre-emption cycle: SIGUSR1 (what SLURM's --signal sends)
makes the trainer save and exit with the requeue status, and the next start resumes
exactly."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
TRAIN = os.environ.get("LNS_TRAIN_BIN")


def dry_run(script, env, *args):
    e = dict(os.environ, DRY_RUN="1", **env)
    r = subprocess.run(["bash", os.path.join(ROOT, script), *args], capture_output=True, text=True, env=e, cwd=ROOT)
    return r


def ranks(out):
    return [m.groups() for m in re.finditer(r"^rank (\d+) host (\S+) local_rank (\d+) CUDA_VISIBLE_DEVICES=(\d+) .*cmd: (.*)$",
                                             out, re.M)]


class Launch(unittest.TestCase):
    def test_slurm_one_and_four_nodes(self):
        for nodes in (1, 4):
            r = dry_run("launch/slurm/train.sbatch", {"SLURM_NNODES": str(nodes), "SLURM_JOB_ID": "1"},
                        "configs/1b_lns.flags", "--tp=8")
            self.assertEqual(r.returncode, 0, r.stderr)
            rows = ranks(r.stdout)
            self.assertEqual(len(rows), 8 * nodes)
            for rank, host, local, gpu, cmd in rows:
                self.assertEqual(int(local), int(rank) % 8)
                self.assertEqual(gpu, local)                       # one GPU per rank
                self.assertEqual(host, "node%d" % (int(rank) // 8))
                self.assertIn("--resume=auto", cmd)
                self.assertIn("--exit_code_on_signal=75", cmd)
                self.assertIn("--tp=8", cmd)
            self.assertIn("srun --ntasks=%d --ntasks-per-node=8" % (8 * nodes), r.stdout)

    def test_slurm_7b_and_13b_at_4_and_16_nodes(self):
        # The LLaMA-2-shaped flagfiles as a user submits them: one rank per GPU, the
        # flagfile (which holds --tp, --pp, --recompute) passed through, and a layout
        # that divides the world (tp x pp x dp).
        for name in ("7b_lns", "13b_lns"):
            flags = {}
            with open(os.path.join(ROOT, "configs", name + ".flags")) as f:
                for line in f:
                    if line.startswith("--") and "=" in line:
                        k, v = line.strip()[2:].split("=", 1)
                        flags[k] = v
            for nodes in (4, 16):
                r = dry_run("launch/slurm/train.sbatch", {"SLURM_NNODES": str(nodes), "SLURM_JOB_ID": "7"},
                            "configs/%s.flags" % name)
                self.assertEqual(r.returncode, 0, r.stderr)
                world = 8 * nodes
                self.assertIn("nodes %d x 8 GPUs = %d ranks; out_dir runs/%s" % (nodes, world, name), r.stdout)
                self.assertIn("srun --ntasks=%d --ntasks-per-node=8" % world, r.stdout)
                rows = ranks(r.stdout)
                self.assertEqual(len(rows), world)
                self.assertEqual({h for _, h, _, _, _ in rows}, {"node%d" % n for n in range(nodes)})
                for rank, host, local, gpu, cmd in rows:
                    self.assertEqual(gpu, str(int(rank) % 8))
                    self.assertIn("--flagfile=configs/%s.flags" % name, cmd)
                    self.assertIn("--resume=auto", cmd)
                self.assertEqual(world % (int(flags["tp"]) * int(flags["pp"])), 0)

    def test_mpirun_multinode(self):
        d = tempfile.mkdtemp()
        hosts = os.path.join(d, "hosts")
        with open(hosts, "w") as f:
            f.write("# nodes\na01 slots=8\na02 slots=8\na03 slots=8\na04 slots=8\n")
        r = dry_run("launch/mpirun_multinode.sh", {"HOSTFILE": hosts}, "configs/1b_lns.flags")
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = ranks(r.stdout)
        self.assertEqual(len(rows), 32)
        self.assertEqual({h for _, h, _, _, _ in rows}, {"a01", "a02", "a03", "a04"})
        self.assertTrue(all(g == str(int(rk) % 8) and "--resume=auto" in c for rk, _, _, g, c in rows))
        self.assertIn("mpirun -np 32 --hostfile %s --map-by ppr:8:node" % hosts, r.stdout)
        r = dry_run("launch/mpirun_multinode.sh", {"HOSTFILE": os.path.join(d, "none")}, "configs/1b_lns.flags")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("not found", r.stderr)

    def test_local_rank_sources_and_too_many_ranks(self):
        bind = os.path.join(ROOT, "launch/bind_rank.sh")
        for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"):
            env = {k: v for k, v in os.environ.items() if k not in ("OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK")}
            env.update({var: "3", "GPUS_PER_NODE": "8", "DRY_RUN": "1"})
            r = subprocess.run([bind, "true"], capture_output=True, text=True, env=env)
            self.assertIn("CUDA_VISIBLE_DEVICES=3", r.stdout, var)
        env = dict(os.environ, LOCAL_RANK="8", GPUS_PER_NODE="8")
        r = subprocess.run([bind, "true"], capture_output=True, text=True, env=env)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("local rank 8 on", r.stderr)
        self.assertIn("only 8 GPUs there", r.stderr)

    @unittest.skipUnless(TRAIN, "LNS_TRAIN_BIN not set (ctest sets it)")
    def test_preemption_saves_exits_for_requeue_and_resumes(self):
        d = tempfile.mkdtemp()
        flags = [TRAIN, "--vocab_size=64", "--hidden_size=32", "--intermediate_size=64", "--num_layers=3",
                 "--num_heads=4", "--num_kv_heads=2", "--seq_len=16", "--micro_batch_size=4",
                 "--global_batch_size=8", "--data=random", "--steps=40"]
        ref = os.path.join(d, "ref")
        subprocess.run(flags + ["--out_dir=" + ref], check=True, capture_output=True)
        out = os.path.join(d, "preempted")
        env = dict(os.environ, LOCAL_RANK="0", GPUS_PER_NODE="8")
        p = subprocess.Popen([os.path.join(ROOT, "launch/bind_rank.sh")] + flags +
                             ["--out_dir=" + out, "--resume=auto", "--exit_code_on_signal=75"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        metrics = os.path.join(out, "metrics.jsonl")
        deadline = time.time() + 60
        while time.time() < deadline and p.poll() is None and not (os.path.exists(metrics) and os.path.getsize(metrics)):
            time.sleep(0.01)
        p.send_signal(signal.SIGUSR1)
        _, err = p.communicate(timeout=60)
        def losses(run):
            with open(os.path.join(run, "metrics.jsonl")) as f:
                return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}
        stopped = max(losses(out))
        if p.returncode == 0 and stopped == 40:
            self.skipTest("the run finished before the signal arrived")
        self.assertEqual(p.returncode, 75, err[-2000:])  # the status train.sbatch requeues on
        self.assertTrue(os.path.isdir(os.path.join(out, "checkpoints", "step_%07d" % stopped)))
        r = subprocess.run(flags + ["--out_dir=" + out, "--resume=auto", "--exit_code_on_signal=75"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        want, got = losses(ref), losses(out)
        for step in range(stopped + 1, 41):
            self.assertEqual(got[step], want[step], "step %d" % step)

    @unittest.skipUnless(TRAIN, "LNS_TRAIN_BIN not set (ctest sets it)")
    def test_mpirun_launcher_turns_sigterm_into_a_save(self):
        # mpirun answers SIGTERM by killing the job 1 s later with status 1; the launcher
        # hands it on as SIGUSR1, which mpirun forwards: every rank saves and the job ends
        # with --exit_code_on_signal.
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "hosts"), "w") as f:
            f.write("localhost slots=1\n")
        with open(os.path.join(d, "tiny.flags"), "w") as f:
            f.write("\n".join(["--vocab_size=64", "--hidden_size=16", "--intermediate_size=24", "--num_layers=2",
                               "--num_heads=2", "--num_kv_heads=1", "--seq_len=8", "--micro_batch_size=2",
                               "--global_batch_size=4", "--steps=1000000", "--data=random", "--log_every=1"]) + "\n")
        out = os.path.join(d, "out")
        env = dict(os.environ, HOSTFILE=os.path.join(d, "hosts"), GPUS_PER_NODE="1", OUT_DIR=out,
                   LNS_TRAIN_BIN=TRAIN, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        p = subprocess.Popen(["bash", os.path.join(ROOT, "launch/mpirun_multinode.sh"), os.path.join(d, "tiny.flags"),
                              "--exit_code_on_signal=75"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        metrics = os.path.join(out, "metrics.jsonl")
        deadline = time.time() + 60
        while time.time() < deadline and p.poll() is None and not (os.path.exists(metrics) and os.path.getsize(metrics)):
            time.sleep(0.02)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 75, err[-2000:])
        self.assertIn("mpirun_multinode: SIGTERM: asking every rank to save and stop", err)
        with open(os.path.join(out, "checkpoints", "latest")) as f:
            latest = f.read().strip()
        with open(metrics) as f:
            last = max(json.loads(l)["step"] for l in f)
        self.assertEqual(latest, "step_%07d" % last)  # saved at the step it stopped


if __name__ == "__main__":
    unittest.main(verbosity=2)
