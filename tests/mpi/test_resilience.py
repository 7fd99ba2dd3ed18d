#!/usr/bin/env python3
"""Faults as a cluster produces them, injected on CPU ranks over MPI (docs/resilience.md).

Every test runs a 4-rank job (tp 2 x dp 2) of a tiny model and ends with the same
losses, step for step, and the same final checkpoint bytes (the manifest's CRC32 of
every rank file) as the uninterrupted run, unless the fault is one that changes the
data (a skipped batch):

- a rank that hangs (its main thread stuck in a computation) is named by every rank's
  watchdog, the job ends with status 76, and the launcher restarts it from the last
  checkpoint; run.json records the restart and its cause;
- a rank that is frozen whole (SIGSTOP) is named from its stale heartbeat;
- a rank that dies ends the job, and the launcher restarts it;
- a rank that computes 4x slower is named as a straggler, with its host;
- a flipped bit in one rank's gradients is caught by the re-run of the step, which
  names that rank and goes on with the clean result;
- a batch that makes the loss non-finite is reproduced, its samples logged, skipped
  with --skip_bad_batches (and fails the run without it); a batch whose loss spikes is
  reproduced and training goes on;
- asynchronous checkpoints write the same bytes as synchronous ones, resume exactly,
  and a kill during the background write leaves the previous checkpoint valid;
- a save that hangs is caught by the save section's timeout;
- exit statuses: the C++ header and the launchers' shell file agree, and a
  configuration error is never restarted.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

TRAIN = os.environ.get("LNS_TRAIN_BIN")
MPIRUN = os.environ.get("MPIRUN", "mpirun")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "tests", "common"))
import prepare_data  # noqa: E402

MODEL = ["--vocab_size=64", "--hidden_size=32", "--intermediate_size=48", "--num_layers=4",
         "--num_heads=4", "--num_kv_heads=2", "--seq_len=16", "--micro_batch_size=2",
         "--global_batch_size=8", "--lr=3e-3", "--warmup_steps=2", "--log_every=1", "--val_data=",
         "--tp=2", "--save_every=4", "--steps=12",
         # Fast detection for tests: heartbeats twice a second (stale after 2.5 s), and a
         # step timeout of 10 x the median step after 2 steps, at least 4 s (a step here
         # takes ~0.05-0.5 s).
         "--heartbeat_s=0.5", "--timeout_step_warmup=2", "--timeout_step_auto_factor=10",
         "--timeout_step_floor_s=4"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")


FIGURES = {}  # measured here; written to $LNS_RESILIENCE_RECORD for docs/resilience.md


def records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f]


def losses(out):
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in records(out) if "loss" in r}


def final_files(out, step=12):
    with open(os.path.join(out, "checkpoints", "step_%07d" % step, "manifest.json")) as f:
        return [(x["name"], x["crc32"]) for x in json.load(f)["files"]]


class Resilience(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not TRAIN:
            raise unittest.SkipTest("LNS_TRAIN_BIN not set (ctest sets it)")
        cls.dir = tempfile.mkdtemp(prefix="lns_resilience_")
        cls.failed = False
        data = os.path.join(cls.dir, "data.tok")
        w = prepare_data.TokenFileWriter(data, 2, 64)
        for d in range(400):
            w.add_doc([(d * 13 + i * 5) % 64 for i in range(5 + d % 23)])
        w.close()
        cls.flags = MODEL + ["--data=" + data]
        with open(os.path.join(cls.dir, "model.flags"), "w") as f:
            f.write("\n".join(cls.flags) + "\n")
        cls.ref_dir = os.path.join(cls.dir, "ref")
        r = cls.mpi(cls.ref_dir)
        if r.returncode != 0:
            raise RuntimeError("the uninterrupted run failed:\n" + r.stderr[-3000:])
        cls.ref = losses(cls.ref_dir)
        cls.ref_files = final_files(cls.ref_dir)

    @classmethod
    def tearDownClass(cls):
        path = os.environ.get("LNS_RESILIENCE_RECORD")
        if path and not cls.failed:
            rec = {"what": "fault handling on 4 CPU ranks (tp 2 x dp 2), tests/mpi/test_resilience.py",
                   "date": time.strftime("%Y-%m-%d"), "host_cpus": os.cpu_count(),
                   "flags": MODEL, "figures": FIGURES}
            with open(path, "w") as f:
                json.dump(rec, f, indent=1)
                f.write("\n")
        if cls.failed:
            print("kept for inspection: " + cls.dir, file=sys.stderr)
        else:
            shutil.rmtree(cls.dir, ignore_errors=True)

    def run(self, result=None):  # keeps the folder when any test fails
        r = super().run(result)
        if result is not None and (result.failures or result.errors):
            type(self).failed = True
        return r

    @classmethod
    def mpi(cls, out, *extra, timeout=240):
        cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", "4", TRAIN, *cls.flags,
               "--out_dir=" + out, *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)

    def launcher(self, out, *extra, env=None, timeout=300):
        hosts = os.path.join(self.dir, "hosts")
        with open(hosts, "w") as f:
            f.write("localhost slots=4\n")
        e = dict(ENV, HOSTFILE=hosts, GPUS_PER_NODE="4", OUT_DIR=out, LNS_TRAIN_BIN=TRAIN,
                 LNS_RESTART_BACKOFF_S="0", **(env or {}))
        return subprocess.run(["bash", os.path.join(ROOT, "launch/mpirun_multinode.sh"),
                               os.path.join(self.dir, "model.flags"), *extra],
                              capture_output=True, text=True, timeout=timeout, env=e, cwd=ROOT)

    def assert_like_reference(self, out, why):
        got = losses(out)
        self.assertEqual(sorted(got), list(range(1, 13)), why)
        for step in range(1, 13):
            self.assertEqual(got[step], self.ref[step], "%s: step %d" % (why, step))
        self.assertEqual(final_files(out), self.ref_files, why + ": final checkpoint bytes")

    # ---- hangs ------------------------------------------------------------------------
    def test_hang_is_named_and_the_launcher_restarts_the_job(self):
        out = os.path.join(self.dir, "hang")
        t0 = time.time()
        r = self.launcher(out, "--inject_fault=hang@6:rank=1")
        took = time.time() - t0
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        lines = [l for l in r.stderr.splitlines() if "watchdog: rank" in l]
        self.assertTrue(lines, r.stderr[-4000:])
        for l in lines:  # every rank's report names rank 1, stuck computing in step 6
            self.assertIn("made no progress in step (step 6)", l)
            self.assertIn("rank 1 (host ", l)
            self.assertIn("computing in step, step 6", l)
        waiting = [l for l in lines if re.search(r"watchdog: rank [023] ", l) and "waiting in " in l]
        self.assertTrue(waiting, "no rank said which call it waited in:\n" + "\n".join(lines))
        self.assertIn("launch: hang: the watchdog found no progress (exit status 76); restart 1 of 3", r.stderr)
        with open(os.path.join(out, "run.json")) as f:
            run = json.load(f)
        self.assertEqual(len(run["restarts"]), 1, run)
        rs = run["restarts"][0]
        self.assertEqual(rs["exit_status"], 76)
        self.assertIn("hang", rs["cause"])
        self.assertTrue(rs["faults"], rs)
        for rep in rs["faults"]:
            self.assertEqual(rep["cause"], "hang")
            self.assertEqual(rep["step"], 6)
        # Detection latency: the section's time at expiry against its timeout.
        latency = max(rep["for_s"] for rep in rs["faults"])
        print("hang: detected after %.1f s in the section (whole job incl. restart %.1f s)" % (latency, took),
              file=sys.stderr)
        self.assertLess(latency, 60)
        FIGURES["hang"] = {"detected_after_s": latency, "reports": len(rs["faults"]), "job_with_restart_s": took,
                           "fault_step": 6, "resumed_from_step": 4, "steps_redone": 1}
        self.assert_like_reference(out, "hang, restarted")

    def test_sbatch_restarts_then_requeues_and_the_requeued_job_finishes(self):
        # SLURM stand-ins: `srun` runs the ranks with mpirun, `scontrol` notes its call.
        # One restart is allowed: the first hang restarts the job step, the second uses
        # the restarts up and the script requeues the job; the requeued job finishes.
        shims = os.path.join(self.dir, "slurm_bin")
        os.makedirs(shims, exist_ok=True)
        calls = os.path.join(self.dir, "scontrol_calls")
        with open(os.path.join(shims, "srun"), "w") as f:
            f.write('#!/usr/bin/env bash\nn=1\nwhile [[ "$1" == --* ]]; do [[ "$1" == --ntasks=* ]] && n=${1#--ntasks=}; '
                    'shift; done\nexec %s --oversubscribe --bind-to none -np "$n" -x LNS_RESTART_COUNT '
                    '-x LNS_RESTART_CAUSE -x LNS_RESTART_STATUS "$@"\n' % MPIRUN)
        with open(os.path.join(shims, "scontrol"), "w") as f:
            f.write('#!/usr/bin/env bash\necho "$@" >> %s\n' % calls)
        for n in ("srun", "scontrol"):
            os.chmod(os.path.join(shims, n), 0o755)
        out = os.path.join(self.dir, "sbatch")
        env = dict(ENV, PATH=shims + os.pathsep + os.environ["PATH"], SLURM_SUBMIT_DIR=ROOT, SLURM_NNODES="1",
                   SLURM_JOB_ID="4242", GPUS_PER_NODE="4", OUT_DIR=out, LNS_TRAIN_BIN=TRAIN,
                   LNS_RESTART_BACKOFF_S="0", LNS_MAX_RESTARTS="1")
        cmd = ["bash", os.path.join(ROOT, "launch/slurm/train.sbatch"), os.path.join(self.dir, "model.flags"),
               "--inject_fault=hang@6:rank=1,hang@10:rank=2"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
        self.assertEqual(r.returncode, 76, r.stderr[-4000:])
        self.assertIn("restart 1 of 1", r.stderr)
        self.assertIn("no restarts left in this allocation; requeueing job 4242", r.stdout + r.stderr)
        with open(calls) as f:
            self.assertEqual(f.read().split(), ["requeue", "4242"])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)  # the requeued job
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        self.assert_like_reference(out, "sbatch: restarted, requeued")

    def test_frozen_rank_is_named_by_its_stale_heartbeat(self):
        out = os.path.join(self.dir, "frozen")
        r = self.mpi(out, "--inject_fault=stop@5:rank=2", timeout=180)
        self.assertEqual(r.returncode, 76, r.stderr[-4000:])
        lines = [l for l in r.stderr.splitlines() if "watchdog: rank" in l]
        self.assertTrue(lines, r.stderr[-4000:])
        self.assertTrue(any(re.search(r"rank 2 \(host [^)]*\): no heartbeat for [0-9.]+ s \(process stopped or dead\)", l)
                            for l in lines), "\n".join(lines))
        reports = []
        for n in os.listdir(os.path.join(out, "faults")):
            if n.startswith("rank_"):
                with open(os.path.join(out, "faults", n)) as f:
                    reports.append(json.load(f))
        FIGURES["frozen"] = {"detected_after_s": max(x["for_s"] for x in reports), "reports": len(reports)}

    def test_dead_rank_ends_the_job_and_the_launcher_restarts_it(self):
        out = os.path.join(self.dir, "dead")
        r = self.launcher(out, "--inject_fault=exit@7:rank=3")
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        self.assertIn("launch: a rank was killed by signal 9", r.stderr)
        with open(os.path.join(out, "run.json")) as f:
            self.assertEqual(json.load(f)["restarts"][0]["exit_status"], 137)
        self.assert_like_reference(out, "dead rank, restarted")

    def test_dead_rank_ends_the_job_within_seconds(self):
        out = os.path.join(self.dir, "dead_direct")
        p = subprocess.Popen([MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", "4", TRAIN, *self.flags,
                              "--out_dir=" + out, "--inject_fault=exit@5:rank=2"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
        _, err = p.communicate(timeout=180)
        ended = time.time()
        self.assertEqual(p.returncode, 137, err[-3000:])
        marker = [n for n in os.listdir(os.path.join(out, "faults")) if n.startswith("injected_")]
        self.assertEqual(len(marker), 1, marker)
        died = os.path.getmtime(os.path.join(out, "faults", marker[0]))  # written just before the SIGKILL
        FIGURES["dead"] = {"job_ended_after_s": ended - died, "exit_status": 137}
        self.assertLess(ended - died, 30)

    def test_save_that_hangs_is_caught_by_the_save_timeout(self):
        out = os.path.join(self.dir, "save_hang")
        r = self.mpi(out, "--inject_fault=hang_save@8:rank=0", "--timeout_save_s=3", timeout=180)
        self.assertEqual(r.returncode, 76, r.stderr[-4000:])
        self.assertRegex(r.stderr, r"made no progress in checkpoint save \(step 8\)")
        with open(os.path.join(out, "checkpoints", "latest")) as f:
            self.assertEqual(f.read().strip(), "step_0000004")  # the one before stays valid
        with open(os.path.join(out, "faults", "rank_00000.json")) as f:
            FIGURES["hung_save"] = {"detected_after_s": json.load(f)["for_s"], "timeout_s": 3}

    # ---- stragglers ---------------------------------------------------------------------
    def test_slow_rank_is_named_with_its_host(self):
        out = os.path.join(self.dir, "slow")
        r = self.mpi(out, "--inject_fault=slow@2:rank=3:factor=6", "--straggler_every=2", "--straggler_windows=2")
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        named = [x for rec in records(out) if "stragglers" in rec for x in rec["stragglers"]]
        self.assertTrue(named, r.stderr[-3000:])
        self.assertEqual({x["rank"] for x in named}, {3}, named)
        self.assertGreater(min(x["slowdown"] for x in named), 1.2)
        self.assertTrue(all(x["host"] for x in named))
        self.assertRegex(r.stderr, r"straggler: rank 3 \(host \S+\) computes [0-9.]+x the median")
        first = min(rec["step"] for rec in records(out) if rec.get("stragglers"))
        FIGURES["slow"] = {"factor": 6, "named_at_step": first, "slow_from_step": 2, "window_steps": 2,
                           "windows_needed": 2, "slowdown_measured": [x["slowdown"] for x in named][:3]}
        # Slowness is not a fault: the numbers are the uninterrupted run's.
        self.assert_like_reference(out, "slow rank")

    # ---- suspicious steps -----------------------------------------------------------------
    def test_flipped_bit_is_transient_names_its_rank_and_training_goes_on(self):
        out = os.path.join(self.dir, "bitflip")
        r = self.mpi(out, "--inject_fault=bitflip@5:rank=2", "--spike_window=3")
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        reruns = [x for x in records(out) if "rerun" in x]
        self.assertEqual(len(reruns), 1, reruns)
        self.assertEqual(reruns[0]["rerun"], "transient")
        self.assertEqual(reruns[0]["ranks"], [2])
        self.assertEqual(reruns[0]["step"], 5)
        self.assertIn("the gradients of rank(s) 2 differed between the two runs", r.stderr)
        FIGURES["bitflip"] = {"why": reruns[0]["why"], "steps_rerun": 1, "rank_named": reruns[0]["ranks"]}
        self.assert_like_reference(out, "bit flip")

    def test_bad_batch_is_reproduced_logged_and_skipped(self):
        out = os.path.join(self.dir, "nan_skip")
        r = self.mpi(out, "--inject_fault=nan@4", "--skip_bad_batches")
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        reruns = [x for x in records(out) if "rerun" in x]
        self.assertEqual(len(reruns), 1, reruns)
        rec = reruns[0]
        self.assertEqual((rec["rerun"], rec["step"], rec["skipped"]), ("reproduced", 4, True))
        self.assertEqual(rec["stream_index"], 24)  # step 4 draws samples 24..31
        self.assertEqual(len(rec["samples"]), 8)
        self.assertIn("the batch is the cause", r.stderr)
        got = losses(out)
        for step in range(1, 4):
            self.assertEqual(got[step], self.ref[step])
        self.assertNotEqual(got[4], self.ref[4])  # step 4 took the next batch
        # The skip is in the checkpoints' state: stopping at step 8 and resuming gives
        # the same run.
        part = os.path.join(self.dir, "nan_skip_resumed")
        a = self.mpi(part, "--inject_fault=nan@4", "--skip_bad_batches", "--steps=12", "--save_every=4")
        self.assertEqual(a.returncode, 0, a.stderr[-3000:])
        shutil.rmtree(os.path.join(part, "checkpoints", "step_0000012"))
        with open(os.path.join(part, "checkpoints", "latest"), "w") as f:
            f.write("step_0000008\n")
        b = self.mpi(part, "--inject_fault=nan@4", "--skip_bad_batches", "--resume=auto")
        self.assertEqual(b.returncode, 0, b.stderr[-3000:])
        self.assertEqual(losses(part), got)
        self.assertEqual(final_files(part), final_files(out))

    def test_bad_batch_without_skip_fails_after_the_rerun(self):
        out = os.path.join(self.dir, "nan_fail")
        r = self.mpi(out, "--inject_fault=nan@4")
        self.assertEqual(r.returncode, 1, r.stderr[-4000:])
        self.assertIn("the re-run reproduced it bit for bit", r.stderr)
        self.assertIn("--skip_bad_batches would skip it", r.stderr)
        self.assertIn("training diverged at step 4", r.stderr)

    def test_reproduced_spike_goes_on(self):
        out = os.path.join(self.dir, "spike")
        r = self.mpi(out, "--inject_fault=spike@6", "--spike_window=3")
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        reruns = [x for x in records(out) if "rerun" in x]
        self.assertEqual([(x["rerun"], x["step"], x["skipped"]) for x in reruns], [("reproduced", 6, False)])
        self.assertIn("loss spike", reruns[0]["why"])
        got = losses(out)
        self.assertAlmostEqual(got[6][0], 20 * self.ref[6][0], places=9)  # the injected factor, reported
        self.assertEqual(final_files(out), self.ref_files)  # the gradients were the clean ones

    # ---- asynchronous checkpoints -------------------------------------------------------
    def test_async_saves_write_the_same_bytes_and_resume_exactly(self):
        out = os.path.join(self.dir, "async")
        r = self.mpi(out, "--async_save")
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        self.assertIn("writing it in the background", r.stderr)
        for step in (4, 8, 12):
            self.assertEqual(final_files(out, step), final_files(self.ref_dir, step), "step %d" % step)
        committed = [x for x in records(out) if "checkpoint_committed" in x]
        self.assertEqual(len(committed), 2, committed)  # steps 4 and 8; step 12, the last, is synchronous
        self.assertTrue(4 < committed[0]["step"] <= 8 < committed[1]["step"] <= 12, committed)
        stalls = [x["save_stall_s"] for x in records(out) if "save_stall_s" in x]
        self.assertEqual(len(stalls), 2)
        FIGURES["async_tiny"] = {"stall_s": stalls,
                                 "sync_stall_s": [x["save_stall_s"] for x in records(self.ref_dir) if "save_stall_s" in x]}
        # Resume from the asynchronous step-8 checkpoint under another layout (dp 4).
        shutil.rmtree(os.path.join(out, "checkpoints", "step_0000012"))
        with open(os.path.join(out, "checkpoints", "latest"), "w") as f:
            f.write("step_0000008\n")
        b = subprocess.run([MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", "4", TRAIN, *self.flags,
                            "--tp=1", "--out_dir=" + out, "--resume=auto", "--async_save"],
                           capture_output=True, text=True, timeout=240, env=ENV)
        self.assertEqual(b.returncode, 0, b.stderr[-3000:])
        got = losses(out)
        for step in range(9, 13):  # another layout: the same model within f32 rounding
            self.assertAlmostEqual(got[step][0], self.ref[step][0], delta=1e-5 * abs(self.ref[step][0]))

    def test_kill_during_a_background_write_leaves_the_previous_checkpoint(self):
        out = os.path.join(self.dir, "async_kill")
        # Each writer pauses 4 s after its file (a test hook): the kill lands while the
        # step-8 save is written and training has gone on past it (the step-12 save,
        # synchronous, first waits for it).
        p = subprocess.Popen([MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", "4", TRAIN, *self.flags,
                              "--out_dir=" + out, "--async_save", "--checkpoint_test_pause_ms=4000"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
        deadline = time.time() + 120
        latest = os.path.join(out, "checkpoints", "latest")
        tmp8 = os.path.join(out, "checkpoints", "step_0000008.tmp")
        while time.time() < deadline and p.poll() is None:
            try:
                with open(latest) as f:
                    at4 = f.read().strip() == "step_0000004"
                if at4 and any(n.startswith("rank_") for n in os.listdir(tmp8)):
                    break
            except OSError:
                pass
            time.sleep(0.05)
        # kill -9 every rank (their pids are in their heartbeat files), as a lost node would.
        for n in os.listdir(os.path.join(out, "heartbeats")):
            if n.endswith(".json"):
                with open(os.path.join(out, "heartbeats", n)) as f:
                    try:
                        os.kill(json.load(f)["pid"], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        p.communicate(timeout=60)
        with open(latest) as f:
            self.assertEqual(f.read().strip(), "step_0000004")
        self.assertFalse(os.path.exists(os.path.join(out, "checkpoints", "step_0000008")))
        r = self.mpi(out, "--resume=auto", "--async_save")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertIn("resumed from", r.stderr)
        self.assert_like_reference(out, "killed during an async write")

    # ---- exit statuses ------------------------------------------------------------------
    def test_exit_statuses_agree_and_configuration_errors_are_not_restarted(self):
        with open(os.path.join(ROOT, "include/lns/core/exit_status.h")) as f:
            header = dict((k, int(v)) for k, v in re.findall(r"(kExit\w+) = (\d+)", f.read()))
        with open(os.path.join(ROOT, "launch/restart_policy.sh")) as f:
            shell = dict((k, int(v)) for k, v in re.findall(r"^(LNS_EXIT_\w+)=(\d+)", f.read(), re.M))
        def snake(name):  # kExitSignalStop -> LNS_EXIT_SIGNAL_STOP
            return "LNS_EXIT" + re.sub(r"([A-Z])", r"_\1", name[len("kExit"):]).upper()
        self.assertEqual({snake(k): v for k, v in header.items()}, shell)
        out = os.path.join(self.dir, "bad_flag")
        r = self.launcher(out, "--inject_fault=boom@3")
        self.assertEqual(r.returncode, 1, r.stderr[-3000:])
        self.assertIn("--inject_fault: 'boom@3': unknown kind 'boom'", r.stderr)
        self.assertNotIn("restart 1", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
