#!/usr/bin/env python3
"""TensorBoard event files from lns_train (docs/training.md, "TensorBoard"), read back with
TensorBoard's own loaders (the `tensorboard` PyPI package):

- every scalar TensorBoard loads equals the field of metrics.jsonl it comes from, at the
  same step, to float32 (what TensorBoard stores), and nothing else is there; the expected
  tags are worked out here from the table in docs/training.md, independently of the C++;
  the runs cover every record kind: steps, evaluations, depth diagnostics, FP8 health,
  straggler windows, checkpoints, LN-free events and re-runs of a suspicious step;
- a run killed after a checkpoint and resumed with --resume=auto continues the same
  curves: every step once (in the files themselves, and as TensorBoard loads them), with
  the uninterrupted run's values; and TensorBoard's SessionLog START handling drops the
  stale steps on its own, as a TensorBoard watching the run while it resumed would;
- --tensorboard_dir=none writes nothing, another directory is used as given, and one that
  cannot be created stops the run with one line naming the flag.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

TRAIN = os.environ.get("LNS_TRAIN_BIN")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import prepare_data  # noqa: E402

try:
    from tensorboard.backend.event_processing import event_accumulator, event_file_loader
except ImportError:  # tools/install_deps.sh installs it
    event_accumulator = None

MODEL = ["--vocab_size=64", "--hidden_size=32", "--intermediate_size=48", "--num_layers=2",
         "--num_heads=4", "--num_kv_heads=2", "--seq_len=16", "--micro_batch_size=2",
         "--global_batch_size=4", "--lr=3e-3"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


# ---- the table of docs/training.md, written out again here -------------------------------
PERF = {"tokens_per_s", "step_time_s", "elapsed_s", "mfu", "peak_memory_bytes"}


def is_scalar(v):
    return isinstance(v, (bool, int, float))


def leaves(prefix, v):
    """(tag, value) of a field: numbers and booleans; objects add /key; lists of numbers
    add /index; lists of rows add /<field>/<row> with the row named layer_NN plus its
    string fields (in the order of their names), or rank_N, or its index."""
    if is_scalar(v):
        return [(prefix, float(v))]
    if isinstance(v, dict):
        return [x for k in v for x in leaves(prefix + "/" + k, v[k])]
    out = []
    if isinstance(v, list):
        for i, e in enumerate(v):
            if not isinstance(e, dict):
                out += leaves("%s/%d" % (prefix, i), e)
                continue
            if isinstance(e.get("layer"), int):
                name = "layer_%02d" % e["layer"] + "".join(
                    "." + e[k] for k in sorted(e) if isinstance(e[k], str))
            elif isinstance(e.get("rank"), int):
                name = "rank_%d" % e["rank"]
            else:
                name = str(i)
            out += [("%s/%s/%s" % (prefix, k, name), float(x)) for k, x in e.items()
                    if k not in ("layer", "rank") and is_scalar(x)]
    return out


def expected_scalars(r):
    """The (tag, value) pairs one metrics.jsonl record becomes."""
    rest = {k: v for k, v in r.items() if k != "step"}
    if "diag" in r:
        return [(t, v) for t, v in leaves("diag", r["diag"])
                if not (t.startswith("diag/grad_norm/") and v < 0)]
    if "fp8" in r:
        rows = r["fp8"]
        return leaves("fp8", rows) + [
            ("fp8/saturated_max", max([0.0] + [x["saturated"] for x in rows])),
            ("fp8/flushed_max", max([0.0] + [x["flushed"] for x in rows])),
            ("fp8/nonfinite_total", float(sum(x["nonfinite"] for x in rows)))]
    if "ln_free_event" in r:
        return leaves("ln_free_event", r["ln_free_event"])
    if "rerun" in r:
        out = [("rerun/reproduced", 1.0 if r["rerun"] == "reproduced" else 0.0)]
        if "ranks" in r:
            out.append(("rerun/ranks_differing", float(len(r["ranks"]))))
        return out + [x for k, v in rest.items() if k not in ("rerun", "ranks", "samples")
                      for x in leaves("rerun/" + k, v)]
    if "checkpoint" in r or "checkpoint_committed" in r:
        return [x for k, v in rest.items() for x in leaves("checkpoint/" + k, v)]
    if "compute_s" in r:
        out = [x for k, v in rest.items() if k != "stragglers" for x in leaves("straggler/" + k, v)]
        return out + [("straggler/stragglers_named", float(len(r["stragglers"])))] + \
            leaves("straggler", r["stragglers"])
    if "val_loss" in r:
        return [x for k, v in rest.items()
                for x in leaves("eval/" + (k[4:] if k.startswith("val_") else k), v)]
    if "loss" in r:
        def group(k, v):
            if k in PERF:
                return "perf/" + k
            if k.startswith("ln_free_"):
                return "ln_free/" + k[len("ln_free_"):]
            return k if isinstance(v, dict) else "train/" + k
        return [x for k, v in rest.items() for x in leaves(group(k, v), v)]
    return [x for k, v in rest.items() for x in leaves("metrics/" + k, v)]


# ---- reading ---------------------------------------------------------------------------------
def records(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f]


def expected(out_dir):
    """{(tag, step): [values]} from metrics.jsonl, as float32."""
    out = {}
    for r in records(out_dir):
        for tag, v in expected_scalars(r):
            out.setdefault((tag, r["step"]), []).append(np.float32(v))
    return out


def accumulated(tb_dir):
    """{(tag, step): [values]} as TensorBoard's EventAccumulator loads the directory (every
    event kept, orphaned data purged as TensorBoard does)."""
    acc = event_accumulator.EventAccumulator(tb_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            out.setdefault((tag, e.step), []).append(np.float32(e.value))
    return out


def raw_events(tb_dir):
    """Every event of every file in name order, as TensorBoard's file loader reads them (no
    purging): [(file, event)]."""
    out = []
    for path in sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))):
        for ev in event_file_loader.LegacyEventFileLoader(path).Load():
            out.append((os.path.basename(path), ev))
    return out


def raw_scalars(tb_dir):
    out = {}
    for _, ev in raw_events(tb_dir):
        if ev.HasField("summary"):
            for v in ev.summary.value:
                out.setdefault((v.tag, ev.step), []).append(np.float32(v.simple_value))
    return out


class TensorBoard(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not TRAIN:
            raise unittest.SkipTest("LNS_TRAIN_BIN not set (ctest sets it)")
        if event_accumulator is None:
            raise unittest.SkipTest("the tensorboard Python package is missing (bash tools/install_deps.sh)")
        cls.dir = tempfile.mkdtemp(prefix="lns_tensorboard_")
        cls.data = os.path.join(cls.dir, "data.tok")
        w = prepare_data.TokenFileWriter(cls.data, 2, 64)
        for d in range(200):
            w.add_doc([(d * 11 + i * 3) % 64 for i in range(4 + d % 19)])
        w.close()
        cls.flags = MODEL + ["--data=" + cls.data]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def train(self, out, *extra, check=True):
        p = subprocess.run([TRAIN, *self.flags, "--out_dir=" + out, *extra], capture_output=True,
                           text=True, env=ENV)
        if check and p.returncode != 0:
            self.fail("lns_train %s failed (%d):\n%s" % (" ".join(extra), p.returncode, p.stderr[-3000:]))
        return p

    def assert_same(self, want, got, what):
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        self.assertFalse(missing, "%s: in metrics.jsonl, not in TensorBoard: %s" % (what, missing[:20]))
        self.assertFalse(extra, "%s: in TensorBoard, not in metrics.jsonl: %s" % (what, extra[:20]))
        wrong = [(k, want[k], got[k]) for k in sorted(want) if want[k] != got[k]]
        self.assertFalse(wrong, "%s: values differ (tag/step, metrics.jsonl, TensorBoard): %s"
                         % (what, wrong[:10]))

    def test_every_record_kind(self):
        # FP8 health, diagnostics, evaluation, stragglers, checkpoints, an LN-free event
        rich = os.path.join(self.dir, "rich")
        # (an async save's commit record, checkpoint/save_write_s, comes when the write
        # ends: compared whenever it is there, not required)
        self.train(rich, "--steps=8", "--log_every=2", "--fp8=delayed", "--diag_every=3",
                   "--val_data=" + self.data, "--eval_every=4", "--eval_tokens=64",
                   "--straggler_every=2", "--save_every=4", "--async_save", "--peak_tflops=1",
                   "--ln_free=mlp@4", "--ln_free_calib_tokens=64")
        # a re-run of a suspicious step (FP8 runs do not re-run)
        spike = os.path.join(self.dir, "spike")
        self.train(spike, "--steps=6", "--log_every=1", "--val_data=", "--spike_window=2",
                   "--inject_fault=spike@4")
        kinds = set()
        for out in (rich, spike):
            want, got = expected(os.path.join(out)), accumulated(os.path.join(out, "tensorboard"))
            self.assert_same(want, got, out)
            self.assertEqual(want, raw_scalars(os.path.join(out, "tensorboard")))
            kinds |= {t.split("/")[0] for t, _ in got}
            # the named curves of docs/training.md, at every step
            steps = [r["step"] for r in records(out) if "loss" in r and "rerun" not in r]
            for tag in ("train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s"):
                self.assertEqual(sorted(s for t, s in got if t == tag), steps, tag)
        self.assertEqual(kinds, {"train", "perf", "startup_s", "eval", "diag", "fp8", "straggler",
                                 "checkpoint", "ln_free", "ln_free_event", "rerun"})
        got = accumulated(os.path.join(rich, "tensorboard"))
        for tag in ("perf/mfu", "perf/peak_memory_bytes", "eval/loss", "eval/ppl", "diag/variance/layer_01",
                    "diag/angular_distance/layer_00", "fp8/saturated/layer_01.down_proj.dy",
                    "fp8/saturated_max", "straggler/compute_s/max", "checkpoint/save_stall_s",
                    "ln_free_event/norms/pos0/layer_00.mlp"):
            self.assertTrue(any(t == tag for t, _ in got), "no %s among %s" % (tag, sorted({t for t, _ in got})[:40]))
        rr = accumulated(os.path.join(spike, "tensorboard"))
        self.assertEqual([k for k in rr if k[0] == "rerun/reproduced"], [("rerun/reproduced", 4)])

    def test_resume_continues_the_curves(self):
        common = ["--steps=10", "--log_every=1", "--save_every=4", "--val_data=" + self.data,
                  "--eval_every=3", "--eval_tokens=64", "--diag_every=2"]
        ref = os.path.join(self.dir, "ref")
        self.train(ref, *common)
        out = os.path.join(self.dir, "resumed")
        p = self.train(out, *common, "--inject_fault=exit@7", check=False)  # SIGKILL at step 7
        self.assertNotEqual(p.returncode, 0)
        tb = os.path.join(out, "tensorboard")
        before = raw_scalars(tb)
        self.assertIn(("train/loss", 6), before)  # the steps past the checkpoint at 4 were logged
        stale = tempfile.mkdtemp(dir=self.dir)
        for f in glob.glob(os.path.join(tb, "*")):
            shutil.copy(f, stale)
        p = self.train(out, *common, "--resume=auto")
        self.assertIn("tensorboard: dropped", p.stderr)

        files = sorted(os.listdir(tb))
        self.assertEqual(len(files), 2, files)
        # in the files themselves: every (tag, step) once, the old file cut at step 4
        raw = raw_scalars(tb)
        twice = [k for k, v in raw.items() if len(v) > 1]
        self.assertFalse(twice, "written twice: %s" % twice[:10])
        old_steps = {ev.step for f, ev in raw_events(tb) if f == files[0] and ev.HasField("summary")}
        self.assertEqual(max(old_steps), 4)
        # as TensorBoard loads them: metrics.jsonl, and the uninterrupted run's curves
        got = accumulated(tb)
        self.assert_same(expected(out), got, "resumed run")
        ref_got = accumulated(os.path.join(ref, "tensorboard"))
        for tag in ("train/loss", "train/grad_norm", "train/lr", "eval/loss", "diag/variance/layer_01"):
            a = sorted((s, v) for (t, s), v in got.items() if t == tag)
            b = sorted((s, v) for (t, s), v in ref_got.items() if t == tag)
            self.assertEqual(a, b, tag)
        self.assertEqual(sorted(s for t, s in got if t == "train/loss"), list(range(1, 11)))

        # A TensorBoard that read the killed run's file before the resume cut it: the new
        # file's SessionLog START at step 5 makes it drop its stale steps 5 and 6.
        shutil.copy(os.path.join(tb, files[1]), stale)
        self.assertIn(("train/loss", 6), raw_scalars(stale))
        self.assertEqual(len(raw_scalars(stale)[("train/loss", 6)]), 2)  # stale and redone
        self.assert_same(expected(out), accumulated(stale), "stale file + resumed file")

    def test_dir_flag(self):
        off = os.path.join(self.dir, "off")
        self.train(off, "--steps=2", "--val_data=", "--tensorboard_dir=none")
        self.assertFalse(os.path.exists(os.path.join(off, "tensorboard")))
        elsewhere = os.path.join(self.dir, "tb_elsewhere", "run1")
        run = os.path.join(self.dir, "elsewhere")
        self.train(run, "--steps=2", "--val_data=", "--tensorboard_dir=" + elsewhere)
        self.assertFalse(os.path.exists(os.path.join(run, "tensorboard")))
        self.assert_same(expected(run), accumulated(elsewhere), "--tensorboard_dir")
        blocker = os.path.join(self.dir, "a_file")
        open(blocker, "w").close()
        p = self.train(os.path.join(self.dir, "bad"), "--steps=2", "--val_data=",
                       "--tensorboard_dir=" + blocker + "/tb", check=False)
        self.assertNotEqual(p.returncode, 0)
        err = [l for l in p.stderr.splitlines() if "error" in l]
        self.assertEqual(len(err), 1, p.stderr[-2000:])
        self.assertIn("--tensorboard_dir=" + blocker + "/tb", err[0])
        self.assertNotIn("terminate", p.stderr)


if __name__ == "__main__":
    unittest.main()
