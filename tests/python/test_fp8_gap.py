#!/usr/bin/env python3
"""The FP8 loss-gap driver (tools/experiments/fp8_gap.py, issue 30) end to end on the CPU:
a tiny model trained with --fp8=none and --fp8=delayed on the same byte-level text, the
record's figures read back from each run's metrics.jsonl, and a run that fails named."""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import kept_folder  # noqa: E402  (a failed test keeps its folder and shows its runs' logs)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
DRIVER = os.path.join(ROOT, "tools", "experiments", "fp8_gap.py")
TINY = ["--vocab_size=257", "--hidden_size=32", "--intermediate_size=64", "--num_layers=2", "--num_heads=4",
        "--num_kv_heads=2", "--seq_len=16", "--global_batch_size=4", "--micro_batch_size=4", "--steps=4",
        "--eval_tokens=128", "--eval_every=0", "--log_every=1", "--device=cpu"]


class Fp8Gap(kept_folder.KeptFolderTest):
    def setUp(self):
        self.train = os.environ.get("LNS_TRAIN_BIN", os.path.join(ROOT, "build", "lns_train"))
        self.dir = self.work
        text = os.path.join(self.dir, "text.txt")
        with open(text, "w") as f:
            for i in range(200):
                f.write(f"line {i} of a small text that the tiny model reads, {i * 7 % 13} times.\n\n")
        prefix = os.path.join(self.dir, "corpus")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare_data.py"), "--input", text, "--out",
                        prefix, "--val_fraction", "0.2", "--no_progress"], check=True, capture_output=True)
        self.flags = os.path.join(self.dir, "tiny.flags")
        with open(self.flags, "w") as f:
            f.write(f"--data={prefix}.train.tok\n--val_data={prefix}.val.tok\n")

    def run_driver(self, *extra):
        return subprocess.run([sys.executable, DRIVER, "--lns_train", self.train, "--flagfile", self.flags,
                               "--out", os.path.join(self.dir, "runs"), "--json", os.path.join(self.dir, "r.json"),
                               "--", *TINY, *extra], capture_output=True, text=True)

    def test_the_record_is_the_two_runs_metrics(self):
        r = self.run_driver()
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        rec = json.load(open(os.path.join(self.dir, "r.json")))
        for mode, key in (("none", "bf16"), ("delayed", "fp8")):
            rows = [json.loads(l) for l in open(os.path.join(self.dir, "runs", mode, "metrics.jsonl")) if l.strip()]
            val = [x for x in rows if "val_loss" in x]
            self.assertEqual(rec[key]["val_loss"], val[-1]["val_loss"])
            self.assertEqual(rec[key]["steps"], 4)
            health = [x for x in rows if "fp8" in x]
            self.assertEqual(bool(health), mode == "delayed")
        self.assertNotEqual(rec["bf16"]["val_loss"], rec["fp8"]["val_loss"], "the FP8 run must be a different run")
        self.assertAlmostEqual(rec["val_loss_gap"], (rec["fp8"]["val_loss"] - rec["bf16"]["val_loss"]) /
                               rec["bf16"]["val_loss"])
        worst = [json.loads(l) for l in open(os.path.join(self.dir, "runs", "delayed", "metrics.jsonl"))
                 if '"fp8"' in l][-1]["fp8"]  # the last health record
        self.assertEqual(rec["fp8"]["most_flushed"]["fraction"], max(h["flushed"] for h in worst))
        self.assertIn("(gap ", r.stdout)

    def test_a_failing_run_is_named(self):
        r = self.run_driver("--hidden_size=33")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("fp8_gap: the --fp8=none run failed", r.stderr)


if __name__ == "__main__":
    unittest.main()
