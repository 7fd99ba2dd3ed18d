#!/usr/bin/env python3
"""LN-free fine-tuning as a user runs it (docs/ln_free.md):

- a run killed mid-schedule (kill -9 during a save) resumes from its last complete
  checkpoint and continues bit for bit: the same losses, the same replacement events
  at the same steps with the same constants, the same final ln_free state (the loss
  window of a '~' trigger spans the checkpoint, so it must come back from it);
- the schedule under tp=2 x pp=2 gives the single-rank losses and constants (1e-5);
- lns_eval of the final LN-free checkpoint equals the run's own last validation loss
  (an lns_eval that left the norms live would not);
- lns_convert: export-hf refuses an LN-free checkpoint (HF LLaMA always normalises);
  remove-layers renumbers the fixed norms (and refuses a schedule with events left);
- bad flags and a resume under another schedule fail with one line naming the flag.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

TRAIN = os.environ.get("LNS_TRAIN_BIN")
EVAL = os.path.join(os.path.dirname(TRAIN or "."), "lns_eval")
CONVERT = os.path.join(os.path.dirname(TRAIN or "."), "lns_convert")
MPIRUN = os.environ.get("MPIRUN", "mpirun")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))  # eot_tokens, kept_folder
import eot_tokens  # noqa: E402
import kept_folder  # noqa: E402  (a failed test keeps the folder and shows its runs' logs)

MODEL = ["--vocab_size=64", "--hidden_size=32", "--intermediate_size=45", "--num_layers=4",
         "--num_heads=4", "--num_kv_heads=2", "--seq_len=16", "--micro_batch_size=2",
         "--global_batch_size=8", "--lr=3e-3", "--warmup_steps=2", "--log_every=1", "--norm_scheme=lns"]
# mlp fires before step 3; attn_qk waits for a full window of 3 losses (steps 3-5,
# across the step-4 checkpoint); then v with the end-of-text case, the final norm, drops.
SCHEDULE = "mlp@2,attn_qk@~10/6,attn_v:eot@+2,final@+1,drop_eot@+2,drop_pos0@+1"
LN_FREE = ["--ln_free=" + SCHEDULE, "--ln_free_eot_token=0", "--ln_free_calib_tokens=96",
           "--ln_free_loss_window=3"]


def records(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(l) for l in f]
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}
    events = [(r["step"], r["ln_free_event"]) for r in rows if "ln_free_event" in r]
    vals = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    return losses, events, vals


def manifest(ck):
    with open(os.path.join(ck, "manifest.json")) as f:
        return json.load(f)


class LnFreeRun(kept_folder.KeptFolderTest):
    @classmethod
    def setUpClass(cls):
        if not TRAIN:
            raise unittest.SkipTest("LNS_TRAIN_BIN not set (ctest sets it)")
        cls.dir = kept_folder.make("lns_lnfree_")
        cls.data = os.path.join(cls.dir, "data.tok")
        eot_tokens.write_eot_docs(cls.data, 300)
        cls.flags = MODEL + ["--data=" + cls.data, "--val_data=" + cls.data, "--eval_tokens=256"] + LN_FREE
        cls.ref_dir = os.path.join(cls.dir, "ref")
        r = subprocess.run([TRAIN, *cls.flags, "--steps=12", "--save_every=4", "--out_dir=" + cls.ref_dir],
                           capture_output=True, text=True)
        if r.returncode != 0:
            kept_folder.done(cls.dir, True, "LnFreeRun's reference run")
        assert r.returncode == 0, r.stderr[-3000:]
        cls.ref_log = r.stderr
        cls.ref, cls.ref_events, cls.ref_vals = records(cls.ref_dir)

    @classmethod
    def tearDownClass(cls):
        kept_folder.done(cls.dir, cls.failed_in_class, "a test of LnFreeRun")

    def run_train(self, out, *extra, np=1, tp=1, pp=1, check=True):
        cmd = [TRAIN, *self.flags, "--out_dir=" + out, "--tp=%d" % tp, "--pp=%d" % pp, *extra]
        if np > 1:
            cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", str(np)] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        if check:
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        return r

    def test_reference_runs_the_whole_schedule(self):
        steps = [s for s, _ in self.ref_events]
        self.assertEqual(steps, [3, 6, 8, 9, 11, 12])  # the first step trained after each event
        self.assertIn("mean loss", self.ref_events[1][1]["reason"])  # the '~' trigger, not its cap
        self.assertEqual(self.ref_events[0][1]["fixed_total"], 4)
        self.assertEqual(self.ref_events[-1][1]["fixed_total"], 13)
        self.assertFalse(self.ref_events[-1][1]["pos0_special"])
        self.assertTrue(all(n["eot"] for n in self.ref_events[2][1]["norms"]))
        st = manifest(os.path.join(self.ref_dir, "checkpoints", "step_0000012"))["ln_free"]
        self.assertEqual(len(st["norms"]), 13)
        self.assertEqual(st["schedule"]["next_event"], 6)
        self.assertFalse(any(n["eot"] for n in st["norms"]))  # dropped
        self.assertIn("ln_free: event 2/6 'attn_qk@~10/6' before step 6", self.ref_log)

    def test_kill_mid_schedule_resumes_exactly(self):
        out = os.path.join(self.dir, "killed")
        cmd = [TRAIN, *self.flags, "--steps=12", "--save_every=4", "--out_dir=" + out,
               "--checkpoint_test_pause_ms=1500"]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        second = os.path.join(out, "checkpoints", "step_0000008.tmp", "rank_00000.safetensors")
        deadline = time.time() + 120
        while not os.path.exists(second) and time.time() < deadline and p.poll() is None:
            time.sleep(0.02)
        self.assertTrue(os.path.exists(second), "the second save never started")
        p.send_signal(signal.SIGKILL)
        p.wait()
        ck4 = manifest(os.path.join(out, "checkpoints", "step_0000004"))["ln_free"]
        self.assertEqual(ck4["schedule"]["next_event"], 1)  # mid-schedule: mlp fixed, attn_qk waiting
        self.assertEqual(len(ck4["schedule"]["recent_losses"]), 2)  # steps 3 and 4
        r = self.run_train(out, "--steps=12", "--save_every=4", "--resume=auto")
        self.assertIn("at step 4", r.stderr)
        got, events, vals = records(out)
        for step in range(1, 13):
            self.assertEqual(got[step], self.ref[step], "step %d" % step)  # bit for bit
        self.assertEqual(events, self.ref_events)
        self.assertEqual(manifest(os.path.join(out, "checkpoints", "step_0000012"))["ln_free"],
                         manifest(os.path.join(self.ref_dir, "checkpoints", "step_0000012"))["ln_free"])

    def test_layout_equals_single_rank(self):
        out = os.path.join(self.dir, "tp2pp2")
        self.run_train(out, "--steps=12", np=4, tp=2, pp=2)
        got, events, _ = records(out)
        for step in range(1, 13):
            self.assertAlmostEqual(got[step], self.ref[step], delta=1e-5 * self.ref[step], msg="step %d" % step)
        self.assertEqual([s for s, _ in events], [s for s, _ in self.ref_events])
        a = manifest(os.path.join(out, "checkpoints", "step_0000012"))["ln_free"]["norms"]
        b = manifest(os.path.join(self.ref_dir, "checkpoints", "step_0000012"))["ln_free"]["norms"]
        self.assertEqual([(n["layer"], n["slot"]) for n in a], [(n["layer"], n["slot"]) for n in b])
        for x, y in zip(a, b):
            for k in ("pos0", "rest"):
                self.assertAlmostEqual(x[k], y[k], delta=1e-5 * y[k], msg="%s %s" % (x, k))

    def test_lns_eval_applies_the_fixed_divisors(self):
        ck = os.path.join(self.ref_dir, "checkpoints", "step_0000012")
        ev = ["--data=" + self.data, "--eval_tokens=256", "--seq_len=16", "--micro_batch_size=2"]
        prefix = os.path.join(self.dir, "eval_lnfree")
        r = subprocess.run([EVAL, "--checkpoint=" + ck, "--out=" + prefix, *ev], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        with open(prefix + ".json") as f:
            got = json.load(f)["loss"]
        self.assertAlmostEqual(got, self.ref_vals[12], delta=1e-6 * self.ref_vals[12])
        # (the run evaluated with its fixed divisors: an lns_eval that left the norms live
        # would compute another loss; the eval's own output says it applied them)
        self.assertIn("13 norms with constant divisors", r.stdout)

    def test_convert_keeps_or_refuses_the_constants(self):
        ck12 = os.path.join(self.ref_dir, "checkpoints", "step_0000012")
        r = subprocess.run([CONVERT, "export-hf", "--in=" + ck12, "--out=" + os.path.join(self.dir, "hf")],
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("13 norms divide by constants", r.stderr)
        self.assertIn("a Hugging Face LLaMA always normalises", r.stderr)
        out = os.path.join(self.dir, "removed")
        r = subprocess.run([CONVERT, "remove-layers", "--in=" + ck12, "--out=" + out, "--layers=1"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        old = manifest(ck12)["ln_free"]["norms"]
        new = manifest(out)["ln_free"]
        renum = {0: 0, 2: 1, 3: 2, 4: 3}  # layer 1 removed; the final norm is layer 3 now
        want = [dict(n, layer=renum[n["layer"]]) for n in old if n["layer"] != 1]
        self.assertEqual(new["norms"], want)
        self.assertEqual(new["schedule"]["text"], "")
        r = subprocess.run([EVAL, "--checkpoint=" + out, "--data=" + self.data, "--eval_tokens=256"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertIn("10 norms with constant divisors", r.stdout)
        r = subprocess.run([CONVERT, "remove-layers", "--in=" + os.path.join(self.ref_dir, "checkpoints", "step_0000004"),
                            "--out=" + os.path.join(self.dir, "removed4"), "--layers=1"], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("has events left (next: 2); finish it before removing layers", r.stderr)

    def test_bad_flags_and_schedule_change_fail_clearly(self):
        for extra, expect in ((["--ln_free=mlp@x"], "--ln_free: 'mlp@x': step 'x' is not an integer"),
                              (["--ln_free=attn_v:eot@3", "--ln_free_eot_token=-1"], "needs --ln_free_eot_token"),
                              (["--ln_free_calib_tokens=0"], "--ln_free_calib_tokens must be positive"),
                              (["--ln_free_eot_token=64"], "--ln_free_eot_token=64 is not below --vocab_size=64"),
                              (["--ln_free_loss_window=0"], "--ln_free_loss_window must be in")):
            r = self.run_train(os.path.join(self.dir, "bad"), "--steps=2", *extra, check=False)
            self.assertNotEqual(r.returncode, 0, extra)
            self.assertIn(expect, r.stderr, extra)
            self.assertNotIn("Traceback", r.stderr)
        # resuming the reference's step-12 checkpoint under another schedule
        other = os.path.join(self.dir, "other_schedule")
        shutil.copytree(self.ref_dir, other)
        r = self.run_train(other, "--steps=14", "--resume=auto", "--ln_free=mlp@2", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("ln_free.schedule.text is '%s' but --ln_free is 'mlp@2'" % SCHEDULE, r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
