#!/usr/bin/env python3
"""The run directory (--out_dir) as users hit it (docs/training.md, "The run directory"):

- two runs on one directory: the second is refused with one line naming the holder
  (also under mpirun, on every rank, without hanging); the first finishes as if alone;
- a resume refused for a config mismatch, or a fresh start over another run's
  results, changes no file of the run directory;
- `latest` is the truth: after a rollback, newer step directories are ignored with a
  warning, the resumed run continues from `latest`, and the abandoned branch's
  checkpoints are moved aside when overwritten, never deleted;
- a `latest` that names a missing or malformed directory is an error naming `latest`;
- killed with SIGKILL past a checkpoint and resumed, metrics.jsonl holds every step
  exactly once, with the uninterrupted run's losses bit for bit.
"""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

TRAIN = os.environ.get("LNS_TRAIN_BIN")
MPIRUN = os.environ.get("MPIRUN", "mpirun")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import prepare_data  # noqa: E402

MODEL = ["--vocab_size=64", "--hidden_size=32", "--intermediate_size=45", "--num_layers=2",
         "--num_heads=4", "--num_kv_heads=2", "--seq_len=16", "--micro_batch_size=2",
         "--global_batch_size=4", "--lr=3e-3", "--log_every=1", "--val_data="]


def records(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f]


def train_losses(out_dir):
    return [(r["step"], r["loss"]) for r in records(out_dir) if "loss" in r]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def snapshot(d, skip=(".lock", "logs")):
    """Every file under d except `skip` (a refused start may record its pid in .lock and
    leave its own log file), path -> bytes."""
    out = {}
    for root, dirs, files in os.walk(d):
        rel = os.path.relpath(root, d)
        if rel.split(os.sep)[0] in skip:
            continue
        for name in files:
            if rel == "." and name in skip:
                continue
            out[os.path.join(rel, name)] = read(os.path.join(root, name))
    return out


class RunDir(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not TRAIN:
            raise unittest.SkipTest("LNS_TRAIN_BIN not set (ctest sets it)")
        cls.dir = tempfile.mkdtemp(prefix="lns_rundir_")
        data = os.path.join(cls.dir, "data.tok")
        w = prepare_data.TokenFileWriter(data, 2, 64)
        for d in range(200):
            w.add_doc([(d * 11 + i * 3) % 64 for i in range(4 + d % 19)])
        w.close()
        cls.flags = MODEL + ["--data=" + data]
        cls.ref_dir = os.path.join(cls.dir, "ref")
        subprocess.run([TRAIN, *cls.flags, "--steps=12", "--out_dir=" + cls.ref_dir], check=True,
                       capture_output=True)
        cls.ref = dict(train_losses(cls.ref_dir))

    def train(self, out, *extra, check=True, timeout=120):
        r = subprocess.run([TRAIN, *self.flags, "--out_dir=" + out, *extra], capture_output=True, text=True,
                           timeout=timeout)
        if check:
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        return r

    def assert_one_line_error(self, r, needle):
        self.assertNotEqual(r.returncode, 0)
        errors = [l for l in r.stderr.splitlines() if "lns_train: error:" in l]
        self.assertEqual(len(errors), 1, r.stderr[-3000:])
        self.assertIn(needle, errors[0])
        self.assertNotIn("terminate called", r.stderr)  # std::terminate

    def assert_each_step_once(self, out, last=12):
        steps = [s for s, _ in train_losses(out)]
        self.assertEqual(steps, list(range(1, last + 1)))
        for step, loss in train_losses(out):
            self.assertEqual(loss, self.ref[step], "step %d" % step)  # bit for bit

    def test_second_run_on_a_directory_is_refused(self):
        out = os.path.join(self.dir, "shared")
        # The first run pauses 2 s inside each save (steps 4, 8, 12); the others try meanwhile.
        first = subprocess.Popen([TRAIN, *self.flags, "--out_dir=" + out, "--steps=12", "--save_every=4",
                                  "--checkpoint_test_pause_ms=2000"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        marker = os.path.join(out, "checkpoints", "step_0000004.tmp", "rank_00000.safetensors")
        deadline = time.time() + 60
        while not os.path.exists(marker) and time.time() < deadline and first.poll() is None:
            time.sleep(0.02)
        if not os.path.exists(marker):
            first.kill()
            first.communicate()
            self.fail("the first run never reached its save")
        r = self.train(out, "--steps=12", "--resume=auto", check=False)
        self.assert_one_line_error(r, "--out_dir=%s: another run is using this directory (pid %d on host "
                                   % (out, first.pid))
        # Under mpirun every rank stops, quickly, with the one line.
        t0 = time.time()
        r = subprocess.run([MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", "2", TRAIN, *self.flags,
                            "--out_dir=" + out, "--steps=12", "--resume=auto"],
                           capture_output=True, text=True, timeout=60)
        self.assertLess(time.time() - t0, 30)
        self.assert_one_line_error(r, "another run is using this directory (pid %d" % first.pid)
        _, err = first.communicate(timeout=120)
        self.assertEqual(first.returncode, 0, err[-2000:])
        self.assert_each_step_once(out)
        # Once it has ended, the directory is free again.
        self.assertIn("nothing to do: resumed at step 12", self.train(out, "--steps=12", "--resume=auto").stderr)

    def test_refused_starts_change_nothing(self):
        out = os.path.join(self.dir, "refused")
        self.train(out, "--steps=4")
        before = snapshot(out)
        logs = set(os.listdir(os.path.join(out, "logs")))
        r = self.train(out, "--steps=8", "--resume=auto", "--num_layers=3", check=False)
        self.assert_one_line_error(r, "/checkpoints/step_0000004/manifest.json: the checkpoint's num_layers is 2 "
                                   "but the flags say 3")
        r = self.train(out, "--steps=8", check=False)
        self.assert_one_line_error(r, "--out_dir=%s already holds the checkpoints of a run (newest: step_0000004); "
                                   "continue it with --resume=auto, or choose another --out_dir" % out)
        r = self.train(out, "--steps=8", "--resume=auto", "--lr=nan", check=False)
        self.assert_one_line_error(r, "--lr must be a positive number")
        self.assertEqual(snapshot(out), before)
        for name in logs:  # earlier logs untouched; a refused start only adds its own
            self.assertIn(name, os.listdir(os.path.join(out, "logs")))

    def test_latest_is_the_truth(self):
        out = os.path.join(self.dir, "rollback")
        self.train(out, "--steps=12", "--save_every=4")
        ck = os.path.join(out, "checkpoints")
        old = {s: read(os.path.join(ck, s, "manifest.json")) for s in ("step_0000008", "step_0000012")}
        with open(os.path.join(ck, "latest"), "w") as f:  # roll back to step 4
            f.write("step_0000004\n")
        r = self.train(out, "--steps=12", "--save_every=4", "--resume=auto")
        self.assertIn("resumed from %s/step_0000004 at step 4" % ck, r.stderr)
        self.assertIn("ignoring %s/step_0000012: newer than step_0000004, which `latest` names" % ck, r.stderr)
        self.assertIn("%s/step_0000008 existed (not the checkpoint `latest` named); moved it to %s/"
                      "step_0000008.superseded-" % (ck, ck), r.stderr)
        with open(os.path.join(ck, "latest")) as f:
            self.assertEqual(f.read().strip(), "step_0000012")
        for s, manifest in old.items():  # the abandoned branch, kept whole
            aside = glob.glob(os.path.join(ck, s + ".superseded-*"))
            self.assertEqual(len(aside), 1, os.listdir(ck))
            self.assertEqual(read(os.path.join(aside[0], "manifest.json")), manifest)
        self.assert_each_step_once(out)
        # A latest that names nothing usable is an error naming it, not a silent fallback.
        for bad, needle in (("step_0000099", "names step_0000099, but %s/step_0000099 does not exist" % ck),
                            ("../../etc", "names '../../etc', expected a checkpoint directory name like step_0000300")):
            with open(os.path.join(ck, "latest"), "w") as f:
                f.write(bad + "\n")
            r = self.train(out, "--steps=16", "--resume=auto", check=False)
            self.assert_one_line_error(r, "%s/latest: %s" % (ck, needle))

    def test_kill_after_a_checkpoint_leaves_one_record_per_step(self):
        out = os.path.join(self.dir, "killed")
        # Killed in the step-8 save: metrics hold steps 1..8, the checkpoint is step 4.
        p = subprocess.Popen([TRAIN, *self.flags, "--out_dir=" + out, "--steps=12", "--save_every=4",
                              "--checkpoint_test_pause_ms=2000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        marker = os.path.join(out, "checkpoints", "step_0000008.tmp", "rank_00000.safetensors")
        deadline = time.time() + 60
        while not os.path.exists(marker) and time.time() < deadline and p.poll() is None:
            time.sleep(0.02)
        p.send_signal(signal.SIGKILL)
        p.wait()
        self.assertEqual([s for s, _ in train_losses(out)], list(range(1, 9)))
        r = self.train(out, "--steps=12", "--save_every=4", "--resume=auto")
        self.assertIn("metrics.jsonl: dropped 4 record(s) after step 4", r.stderr)
        self.assert_each_step_once(out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
