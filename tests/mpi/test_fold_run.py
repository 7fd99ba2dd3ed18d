#!/usr/bin/env python3
"""A folded model (lns_convert fold-norms, docs/ln_free.md) under parallel layouts, as a
user runs the tools:

- lns_train --ln_free takes a small LNS model until every norm is one constant, and
  fold-norms writes it without norms, once merged and once as a tp=2 x pp=2 checkpoint;
- lns_eval of the folded model under tp=2 x pp=2 (mpirun -np 4) equals lns_eval of it on
  one rank, and both equal lns_eval of the LN-free checkpoint (1e-5 relative);
- lns_train --folded_norms fine-tunes it under tp=2 x pp=2 with the single-rank losses
  (1e-5), and refuses it without --folded_norms on every rank with one line.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

TRAIN = os.environ.get("LNS_TRAIN_BIN")
EVAL = os.path.join(os.path.dirname(TRAIN or "."), "lns_eval")
CONVERT = os.path.join(os.path.dirname(TRAIN or "."), "lns_convert")
MPIRUN = os.environ.get("MPIRUN", "mpirun")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))  # eot_tokens
import eot_tokens  # noqa: E402

MODEL = ["--vocab_size=64", "--hidden_size=32", "--intermediate_size=45", "--num_layers=4", "--num_heads=4",
         "--num_kv_heads=2", "--seq_len=16", "--micro_batch_size=2", "--global_batch_size=8",
         "--norm_scheme=lns", "--log_every=1"]


def mpi(np, cmd):
    return [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", str(np)] + cmd if np > 1 else cmd


class FoldRun(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not TRAIN:
            raise unittest.SkipTest("LNS_TRAIN_BIN not set (ctest sets it)")
        cls.dir = tempfile.mkdtemp(prefix="lns_fold_run_")
        cls.data = os.path.join(cls.dir, "data.tok")
        eot_tokens.write_eot_docs(cls.data, 300)
        run = os.path.join(cls.dir, "lnfree")
        cls.check(subprocess.run([TRAIN, *MODEL, "--data=" + cls.data, "--steps=7", "--lr=1e-3",
                                  "--ln_free=mlp@1,attn_qk@+1,attn_v:eot@+1,final@+1,drop_eot@+1,drop_pos0@+1",
                                  "--ln_free_eot_token=0", "--ln_free_calib_tokens=64", "--out_dir=" + run],
                                 capture_output=True, text=True, timeout=240))
        cls.lnfree = os.path.join(run, "checkpoints", "step_0000007")
        cls.folded = os.path.join(cls.dir, "folded")
        cls.folded4 = os.path.join(cls.dir, "folded_tp2_pp2")
        cls.check(subprocess.run([CONVERT, "fold-norms", "--in=" + cls.lnfree, "--out=" + cls.folded],
                                 capture_output=True, text=True))
        cls.check(subprocess.run([CONVERT, "fold-norms", "--in=" + cls.lnfree, "--out=" + cls.folded4, "--tp=2",
                                  "--pp=2"], capture_output=True, text=True))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @staticmethod
    def check(r):
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        return r

    def lns_eval(self, ck, np=1, tp=1, pp=1):
        out = os.path.join(self.dir, "eval_%s_%d" % (os.path.basename(ck), np))
        self.check(subprocess.run(mpi(np, [EVAL, "--checkpoint=" + ck, "--data=" + self.data, "--seq_len=16",
                                           "--micro_batch_size=2", "--eval_tokens=512", "--tp=%d" % tp,
                                           "--pp=%d" % pp, "--out=" + out]),
                                  capture_output=True, text=True, timeout=240))
        with open(out + ".json") as f:
            return json.load(f)["loss"]

    def test_eval_under_layouts(self):
        with open(os.path.join(self.folded4, "manifest.json")) as f:
            self.assertEqual(json.load(f)["layout"]["tp"], 2)
        want = self.lns_eval(self.lnfree)
        one = self.lns_eval(self.folded)
        four = self.lns_eval(self.folded4, np=4, tp=2, pp=2)
        self.assertAlmostEqual(one, want, delta=1e-5 * abs(want))
        self.assertAlmostEqual(four, one, delta=1e-5 * abs(one))

    def fine_tune(self, out, np=1, tp=1, pp=1, folded_flag=True):
        cmd = [TRAIN, *MODEL, "--data=" + self.data, "--steps=3", "--lr=1e-3", "--resume=" + self.folded4,
               "--out_dir=" + os.path.join(self.dir, out), "--tp=%d" % tp, "--pp=%d" % pp]
        if folded_flag:
            cmd.append("--folded_norms")
        return subprocess.run(mpi(np, cmd), capture_output=True, text=True, timeout=240)

    def test_fine_tune_under_layouts(self):
        def losses(out):
            with open(os.path.join(self.dir, out, "metrics.jsonl")) as f:
                return [json.loads(l)["loss"] for l in f if '"loss"' in l]
        self.check(self.fine_tune("ft1"))
        self.check(self.fine_tune("ft4", np=4, tp=2, pp=2))
        a, b = losses("ft1"), losses("ft4")
        self.assertEqual(len(a), 3)
        for x, y in zip(a, b):
            self.assertAlmostEqual(x, y, delta=1e-5 * abs(x))
        r = self.fine_tune("ft_bad", np=2, pp=2, folded_flag=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("folded_norms is true but the flags say --folded_norms=false", r.stderr)
        self.assertNotIn("Traceback", r.stderr)


if __name__ == "__main__":
    unittest.main()
