#!/usr/bin/env python3
"""Crash-safe checkpoints and exact resume, as a user would hit them.

- kill -9 while a checkpoint is being written (the writer pauses on a test hook so
  the kill lands mid-save): the restart resumes from the last complete checkpoint
  and the following losses equal an uninterrupted run bit for bit;
- SIGTERM: the trainer saves and exits 0; resuming continues exactly;
- a checkpoint saved under (tp=2, pp=2, dp=2) resumes under (1,1,1) and (1,4,2)
  with the uninterrupted run's losses within 1e-5 relative;
- the interleaved pipeline's checkpoints are layout-free too: saved with
  --virtual_stages=2 they resume with 1 and vice versa, equal to the uninterrupted run;
- a weighted blend (--data=0.7:A,0.3:B) saved under (tp=1, pp=2, dp=2) resumes under the
  same layout bit for bit and under (1,1,1) with the same samples of each source at every
  step and the uninterrupted run's losses within 1e-5 relative.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

TRAIN = os.environ.get("LNS_TRAIN_BIN")
CONVERT = os.path.join(os.path.dirname(TRAIN or "."), "lns_convert")
MPIRUN = os.environ.get("MPIRUN", "mpirun")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import prepare_data  # noqa: E402

MODEL = ["--vocab_size=64", "--hidden_size=32", "--intermediate_size=45", "--num_layers=4",
         "--num_heads=4", "--num_kv_heads=2", "--seq_len=16", "--micro_batch_size=2",
         "--global_batch_size=8", "--lr=3e-3", "--warmup_steps=2", "--log_every=1", "--val_data="]


def losses(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(l) for l in f]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


class Resume(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not TRAIN:
            raise unittest.SkipTest("LNS_TRAIN_BIN not set (ctest sets it)")
        cls.dir = tempfile.mkdtemp(prefix="lns_resume_")
        data = os.path.join(cls.dir, "data.tok")
        w = prepare_data.TokenFileWriter(data, 2, 64)
        for d in range(300):
            w.add_doc([(d * 13 + i * 5) % 64 for i in range(5 + d % 23)])
        w.close()
        cls.flags = MODEL + ["--data=" + data]
        # The uninterrupted reference: 12 steps on one process.
        cls.ref_dir = os.path.join(cls.dir, "ref")
        subprocess.run([TRAIN, *cls.flags, "--steps=12", "--out_dir=" + cls.ref_dir],
                       check=True, capture_output=True)
        cls.ref = losses(cls.ref_dir)

    def run_train(self, out, *extra, np=1, tp=1, pp=1, check=True):
        cmd = [TRAIN, *self.flags, "--out_dir=" + out, "--tp=%d" % tp, "--pp=%d" % pp, *extra]
        if np > 1:
            cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", str(np)] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        if check:
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        return r

    def test_startup_is_accounted(self):
        # Where the time to the first step went: one log line and the first record's
        # "startup_s", parts that add up to the total; the first step is timed.
        out = os.path.join(self.dir, "startup")
        r = self.run_train(out, "--steps=2")
        line = [l for l in r.stderr.splitlines() if "start-up " in l]
        self.assertEqual(len(line), 1, r.stderr[-2000:])
        self.assertIn("to the end of the first step: process ", line[0])
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rows = [json.loads(l) for l in f]
        self.assertIn("startup_s", rows[0])
        self.assertNotIn("startup_s", rows[1])
        u = rows[0]["startup_s"]
        parts = ["process", "data", "buffers", "weights", "setup", "first_step"]
        self.assertTrue(all(u[p] >= 0 for p in parts), u)
        self.assertGreater(u["first_step"], 0)
        self.assertAlmostEqual(u["total"], sum(u[p] for p in parts), places=6)
        self.assertAlmostEqual(u["first_step"], rows[0]["step_time_s"], places=6)

    def test_kill_during_save_resumes_from_last_complete(self):
        out = os.path.join(self.dir, "killed")
        cmd = [TRAIN, *self.flags, "--steps=12", "--save_every=4", "--out_dir=" + out,
               "--checkpoint_test_pause_ms=1500"]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        second = os.path.join(out, "checkpoints", "step_0000008.tmp", "rank_00000.safetensors")
        deadline = time.time() + 120
        while not os.path.exists(second) and time.time() < deadline and p.poll() is None:
            time.sleep(0.02)
        self.assertTrue(os.path.exists(second), "the second save never started")
        p.send_signal(signal.SIGKILL)  # mid-save: the shard is written, the rename is not
        p.wait()
        ck = os.path.join(out, "checkpoints")
        self.assertTrue(os.path.isdir(os.path.join(ck, "step_0000004")))
        self.assertFalse(os.path.exists(os.path.join(ck, "step_0000008")))
        with open(os.path.join(ck, "latest")) as f:
            self.assertEqual(f.read().strip(), "step_0000004")
        r = self.run_train(out, "--steps=12", "--save_every=4", "--resume=auto")
        self.assertIn("resumed from %s/step_0000004 at step 4" % ck, r.stderr)
        got = losses(out)
        for step in range(5, 13):
            self.assertEqual(got[step], self.ref[step], "step %d" % step)  # bit for bit

    def test_sigterm_saves_and_resumes_exactly(self):
        out = os.path.join(self.dir, "sigterm")
        p = subprocess.Popen([TRAIN, *self.flags, "--steps=12", "--out_dir=" + out,
                              "--checkpoint_test_pause_ms=0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        metrics = os.path.join(out, "metrics.jsonl")
        deadline = time.time() + 60
        while time.time() < deadline and p.poll() is None:
            if os.path.exists(metrics) and os.path.getsize(metrics) > 0:
                break
            time.sleep(0.01)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err[-2000:])
        stopped = max(losses(out))
        if stopped == 12:
            self.skipTest("the run finished before the signal arrived")
        self.assertIn("received signal %d" % signal.SIGTERM, err)
        self.assertTrue(os.path.isdir(os.path.join(out, "checkpoints", "step_%07d" % stopped)))
        self.run_train(out, "--steps=12", "--resume=auto")
        got = losses(out)
        for step in range(stopped + 1, 13):
            self.assertEqual(got[step], self.ref[step], "step %d" % step)

    def test_layout_change_on_resume(self):
        # Same schedule as the reference (--steps=12); keep only the step-4 checkpoint.
        saved = os.path.join(self.dir, "layout_222")
        self.run_train(saved, "--steps=12", "--save_every=4", np=8, tp=2, pp=2)
        for late in ("step_0000008", "step_0000012"):
            shutil.rmtree(os.path.join(saved, "checkpoints", late))
        with open(os.path.join(saved, "checkpoints", "latest"), "w") as f:  # a rollback names its step
            f.write("step_0000004\n")
        for name, np, tp, pp in (("111", 1, 1, 1), ("142", 8, 1, 4)):
            out = os.path.join(self.dir, "layout_to_" + name)
            shutil.copytree(saved, out)
            r = self.run_train(out, "--steps=12", "--resume=auto", np=np, tp=tp, pp=pp)
            self.assertIn("at step 4 (saved under layout tp=2 pp=2 dp=2 zero)", r.stderr)
            got = losses(out)  # steps 5..12 of the resumed run replace the saved run's
            for step in range(1, 13):
                self.assertAlmostEqual(got[step], self.ref[step], delta=1e-5 * self.ref[step],
                                       msg="%s step %d" % (name, step))
        # lns_convert merge, then resume from the merged checkpoint on one process.
        merged = os.path.join(self.dir, "merged_run")
        os.makedirs(os.path.join(merged, "checkpoints"))
        shutil.copy(os.path.join(saved, "metrics.jsonl"), merged)
        r = subprocess.run([CONVERT, "merge", "--in=" + os.path.join(saved, "checkpoints", "step_0000004"),
                            "--out=" + os.path.join(merged, "checkpoints", "step_0000004")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("(tp=1 pp=1 dp=1, step 4)", r.stdout)
        self.run_train(merged, "--steps=12", "--resume=auto")
        got = losses(merged)
        for step in range(5, 13):
            self.assertAlmostEqual(got[step], self.ref[step], delta=1e-5 * self.ref[step], msg="merged step %d" % step)

    def test_virtual_stages_change_on_resume(self):
        # pp=2 with 2 model chunks per stage (layers 0,2 | 1,3), then 1 (0-1 | 2-3), then 2
        # again: saved at step 4 under vp=2, resumed under vp=1 and saved at step 8,
        # resumed under vp=2; every loss that of the uninterrupted single-rank run.
        out = os.path.join(self.dir, "vp")
        ck = os.path.join(out, "checkpoints")

        def roll_back_to(step):
            for name in os.listdir(ck):
                if name.startswith("step_") and int(name[5:]) > step:
                    shutil.rmtree(os.path.join(ck, name))
            with open(os.path.join(ck, "latest"), "w") as f:
                f.write("step_%07d\n" % step)

        def layout_of(step):
            with open(os.path.join(ck, "step_%07d" % step, "manifest.json")) as f:
                return json.load(f)["layout"]

        self.run_train(out, "--steps=12", "--save_every=4", "--virtual_stages=2", np=2, pp=2)
        self.assertEqual(layout_of(4)["virtual_stages"], 2)
        self.assertEqual(layout_of(4)["stage_layers"], [[0, 1], [1, 2], [2, 3], [3, 4]])
        roll_back_to(4)
        r = self.run_train(out, "--steps=12", "--save_every=4", "--resume=auto", "--virtual_stages=1", np=2, pp=2)
        self.assertIn("at step 4 (saved under layout tp=1 pp=2 dp=1 vp=2)", r.stderr)
        self.assertNotIn("virtual_stages", layout_of(8))
        roll_back_to(8)
        r = self.run_train(out, "--steps=12", "--resume=auto", "--virtual_stages=2", np=2, pp=2)
        self.assertIn("at step 8 (saved under layout tp=1 pp=2 dp=1)", r.stderr)
        got = losses(out)
        for step in range(1, 13):
            self.assertAlmostEqual(got[step], self.ref[step], delta=1e-5 * self.ref[step], msg="step %d" % step)

    def test_blend_resumes_under_any_layout(self):
        # A second corpus with other token patterns; 70% of the samples from the first.
        other = os.path.join(self.dir, "other.tok")
        w = prepare_data.TokenFileWriter(other, 2, 64)
        for d in range(200):
            w.add_doc([(d * 7 + i * 3 + 1) % 64 for i in range(4 + d % 17)])
        w.close()
        first = [f for f in self.flags if f.startswith("--data=")][0][len("--data="):]
        blend = ["--data=0.7:%s,0.3:%s" % (first, other)]

        def records(out):
            with open(os.path.join(out, "metrics.jsonl")) as f:
                return {r["step"]: r for r in map(json.loads, f) if "loss" in r}

        ref_dir = os.path.join(self.dir, "blend_ref")
        self.run_train(ref_dir, *blend, "--steps=12")
        ref = records(ref_dir)
        self.assertNotIn("samples_by_source", records(self.ref_dir)[1])  # unweighted data: no counts
        self.assertEqual(ref[12]["samples_by_source"], {first: 67, other: 29})  # 96 samples: 67.2 and 28.8
        self.assertNotEqual(ref[12]["loss"], self.ref[12])  # the blend changes what is learned
        saved = os.path.join(self.dir, "blend_122")
        self.run_train(saved, *blend, "--steps=12", "--save_every=4", np=4, pp=2)
        uninterrupted = records(saved)  # the same layout's own run, before the rollback rewrites it
        ck = os.path.join(saved, "checkpoints")
        for late in ("step_0000008", "step_0000012"):
            shutil.rmtree(os.path.join(ck, late))
        with open(os.path.join(ck, "latest"), "w") as f:
            f.write("step_0000004\n")
        moved = os.path.join(self.dir, "blend_to_111")
        shutil.copytree(saved, moved)
        r = self.run_train(saved, *blend, "--steps=12", "--resume=auto", np=4, pp=2)
        self.assertIn("at step 4 (saved under layout tp=1 pp=2 dp=2", r.stderr)
        got = records(saved)
        for step in range(5, 13):  # the same layout: bit for bit
            self.assertEqual(got[step]["loss"], uninterrupted[step]["loss"], "step %d" % step)
            self.assertEqual(got[step]["samples_by_source"], ref[step]["samples_by_source"], "step %d" % step)
        self.run_train(moved, *blend, "--steps=12", "--resume=auto")
        got = records(moved)
        for step in range(1, 13):  # another layout: the same samples, the losses to rounding
            self.assertEqual(got[step]["samples_by_source"], ref[step]["samples_by_source"], "step %d" % step)
            self.assertAlmostEqual(got[step]["loss"], ref[step]["loss"], delta=1e-5 * ref[step]["loss"],
                                   msg="step %d" % step)


if __name__ == "__main__":
    unittest.main(verbosity=2)
