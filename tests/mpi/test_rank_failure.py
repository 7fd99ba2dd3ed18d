#!/usr/bin/env python3
"""One rank failing ends every rank quickly, with one clear error and a non-zero exit.

mpirun's MPMD form gives rank 1 different flags from rank 0:
  - at start-up (rank 1's data file is missing): every rank exits 1 and rank 0 prints
    the error naming the file and the rank;
  - mid-run (rank 1's data holds a token outside the vocabulary): the job aborts.
Each must finish within 30 seconds, not hang."""
import os
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import prepare_data  # noqa: E402

TRAIN = os.environ.get("LNS_TRAIN_BIN")
MPIRUN = os.environ.get("MPIRUN", "mpirun")
FLAGS = ["--vocab_size=257", "--hidden_size=16", "--intermediate_size=24", "--num_layers=2",
         "--num_heads=2", "--num_kv_heads=1", "--seq_len=8", "--micro_batch_size=2",
         "--global_batch_size=4", "--steps=3", "--log_every=1"]


def token_file(path, tokens):
    w = prepare_data.TokenFileWriter(path, 2, 0)
    w.add_doc(tokens)
    w.close()


class RankFailure(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not TRAIN:
            raise unittest.SkipTest("LNS_TRAIN_BIN not set (ctest sets it)")
        cls.dir = tempfile.mkdtemp(prefix="lns_fail_")
        cls.good = os.path.join(cls.dir, "good.tok")
        token_file(cls.good, [(i * 7) % 200 for i in range(400)])

    def mpmd(self, rank0_flags, rank1_flags):
        cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none",
               "-np", "1", TRAIN, *FLAGS, *rank0_flags, ":", "-np", "1", TRAIN, *FLAGS, *rank1_flags]
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return r, time.time() - t0

    def test_startup_failure_on_one_rank(self):
        missing = os.path.join(self.dir, "missing.tok")
        r, secs = self.mpmd(["--data=" + self.good], ["--data=" + missing])
        self.assertNotEqual(r.returncode, 0)
        self.assertLess(secs, 30)
        errors = [l for l in r.stderr.splitlines() if "lns_train: error:" in l]
        self.assertEqual(len(errors), 1, r.stderr)
        self.assertIn(missing + ": data file not found", errors[0])
        self.assertIn("(rank 1)", errors[0])

    def test_layouts_that_do_not_fit(self):
        cases = [(["--tp=3"], "the world of 2 ranks is not divisible by --tp=3 x --pp=1"),
                 (["--tp=2", "--num_heads=3", "--num_kv_heads=1", "--hidden_size=18"],
                  "--num_heads=3 must be divisible by --tp=2"),
                 (["--tp=2", "--num_heads=2", "--num_kv_heads=1"], "--num_kv_heads=1 must be divisible by --tp=2"),
                 (["--pp=2", "--num_layers=1"], "--pp=2 stages for --num_layers=1"),
                 (["--pp=2", "--pp_layers=2,1", "--num_layers=2"], "--pp_layers=2,1 adds up to 3 layers"),
                 # interleaved pipeline (--virtual_stages)
                 (["--virtual_stages=2"], "--virtual_stages=2 interleaves pipeline stages: it needs --pp > 1"),
                 (["--pp=2", "--virtual_stages=0"], "--virtual_stages must be >= 1, got 0"),
                 (["--pp=2", "--virtual_stages=2"],
                  "--pp=2 x --virtual_stages=2 = 4 model chunks for 2 layers: every chunk needs at least one layer"),
                 (["--pp=2", "--virtual_stages=2", "--num_layers=4", "--pp_layers=2,2"],
                  "--pp_layers=2,2 names 2 model chunks but --pp=2 x --virtual_stages=2 = 4 model chunks"),
                 (["--pp=2", "--virtual_stages=2", "--num_layers=4", "--global_batch_size=6"],
                  "--virtual_stages=2 (interleaved pipeline) needs the micro-batches per step, --global_batch_size"
                  " / (--micro_batch_size x data-parallel size) = 3, to be a multiple of --pp=2")]
        for flags, needle in cases:
            cmd = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", "2", TRAIN, *FLAGS,
                   "--data=" + self.good, *flags]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0, flags)
            errors = [l for l in r.stderr.splitlines() if "lns_train: error:" in l]
            self.assertEqual(len(errors), 1, r.stderr)
            self.assertIn(needle, errors[0])

    def test_midrun_failure_on_one_rank(self):
        bad = os.path.join(self.dir, "bad.tok")
        toks = [(i * 7) % 200 for i in range(400)]
        toks[5] = 300  # outside --vocab_size=257; read by the first samples
        token_file(bad, toks)
        r, secs = self.mpmd(["--data=" + self.good], ["--data=" + bad, "--data_mode=document"])
        self.assertNotEqual(r.returncode, 0)
        self.assertLess(secs, 30)
        self.assertIn("token id 300 at position 5 is outside the model's vocabulary", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
