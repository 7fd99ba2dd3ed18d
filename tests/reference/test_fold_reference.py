#!/usr/bin/env python3
"""The folded model against an independent PyTorch implementation (docs/ln_free.md):

lns_train --ln_free until every norm is one constant (LNS, and scale_res_pre_norm with
its learned branch scales; RMSNorm), lns_convert fold-norms, export-folded; tools/reference/llama_nonorm.py's loss on a token file
equals lns_eval's on the folded checkpoint and on the LN-free one (1e-5 relative).
Exits 77 (ctest: skipped) without torch, like every check that needs PyTorch.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import torch  # noqa: F401
except ImportError:
    print("test_fold_reference: skipped: torch is not installed (pip install torch numpy)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))  # eot_tokens
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "reference"))
import eot_tokens  # noqa: E402
import prepare_data  # noqa: E402
import llama_nonorm  # noqa: E402

TRAIN = os.environ.get("LNS_TRAIN_BIN")
EVAL = os.environ.get("LNS_EVAL_BIN")
CONVERT = os.environ.get("LNS_CONVERT_BIN")
MODEL = ["--vocab_size=64", "--hidden_size=32", "--intermediate_size=45", "--num_layers=3", "--num_heads=4",
         "--num_kv_heads=2", "--seq_len=16", "--micro_batch_size=2", "--global_batch_size=4", "--lr=3e-3"]
SCHEMES = ("lns", "scale_res_pre_norm")


class FoldReference(unittest.TestCase):
    def setUp(self):
        if not (TRAIN and EVAL and CONVERT):
            self.skipTest("LNS_*_BIN not set (ctest sets them)")
        self.dir = tempfile.mkdtemp(prefix="lns_fold_ref_")
        self.data = os.path.join(self.dir, "data.tok")
        eot_tokens.write_eot_docs(self.data, 120)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_ok(self, *cmd):
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        return r

    def lns_eval(self, ck, tag):
        out = os.path.join(self.dir, "eval_" + tag)
        self.run_ok(EVAL, "--checkpoint=" + ck, "--data=" + self.data, "--seq_len=16", "--micro_batch_size=2",
                    "--eval_tokens=400", "--out=" + out)
        with open(out + ".json") as f:
            return json.load(f)["loss"]

    def test_reference_loss_equals_lns_eval(self):
        for scheme in SCHEMES:
            with self.subTest(scheme=scheme):
                self.check(scheme)

    def check(self, scheme):
        run = os.path.join(self.dir, "run_" + scheme)
        self.run_ok(TRAIN, *MODEL, "--norm_scheme=" + scheme, "--data=" + self.data, "--steps=6", "--out_dir=" + run,
                    "--ln_free=mlp@1,attn_qk@+1,attn_v@+1,final@+1,drop_pos0@+1", "--ln_free_calib_tokens=64")
        ck = os.path.join(run, "checkpoints", "step_0000006")
        folded, export = os.path.join(self.dir, "folded_" + scheme), os.path.join(self.dir, "export_" + scheme)
        self.run_ok(CONVERT, "fold-norms", "--in=" + ck, "--out=" + folded)
        self.run_ok(CONVERT, "export-folded", "--in=" + folded, "--out=" + export)
        cfg, W = llama_nonorm.load(export)
        tokens, _, _ = prepare_data.read_token_file(self.data)
        ref, n = llama_nonorm.eval_loss(cfg, W, tokens, 16, 400)
        self.assertEqual(n, 400)
        lf, fo = self.lns_eval(ck, "lnfree_" + scheme), self.lns_eval(folded, "folded_" + scheme)
        print(f"test_fold_reference: {scheme}: loss torch {ref:.9f}, lns_eval folded {fo:.9f}, LN-free {lf:.9f} "
              f"(rel {abs(ref - fo) / abs(fo):.2e}, {abs(fo - lf) / abs(lf):.2e})")
        self.assertAlmostEqual(fo, lf, delta=1e-5 * abs(lf))
        self.assertAlmostEqual(ref, fo, delta=1e-5 * abs(fo))
        # The reference is no copy of the answer: a changed weight moves its loss.
        W["lm_head.weight"] = W["lm_head.weight"] * 1.01
        self.assertGreater(abs(llama_nonorm.eval_loss(cfg, W, tokens, 16, 400)[0] - ref), 1e-4)


if __name__ == "__main__":
    unittest.main()
