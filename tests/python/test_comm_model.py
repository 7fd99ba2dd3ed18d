#!/usr/bin/env python3
"""tools/perf/comm_model.py against the bytes the communicator counted on the CPU.

The expected values are what CommCounter.StepBytesMatchTheModelCountedByHand printed
(tests/mpi/test_parallel.cpp; `[ comm ]` lines) for its model: vocabulary 53, hidden
32, FFN 45, 7 layers, LNS, untied, micro-batch 2 x 8 tokens, global batch 8, f32. That
test holds the counter equal to its own count; this one holds the projection tool to
the same numbers, so the 7B figures of docs/parallelism.md come from a model that
agrees with the code where it can be measured.
"""
import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "perf"))

from comm_model import Layout, split_region_bytes, step_bytes  # noqa: E402
from memory_model import activation_account  # noqa: E402
from step_model import ModelShape  # noqa: E402

SMALL = ModelShape(V=53, C=32, L=7, Hq=4, Hkv=2, F=45, T=8, B=2, global_batch=8, scheme="lns")


def tp_pp(b):
    return ({k: v for k, v in b.items() if k.startswith("tp.")}, b.get("pp.send", 0.0))


class MeasuredOnTheCpu(unittest.TestCase):
    def check(self, lay, stage, tp, pp):
        got_tp, got_pp = tp_pp(step_bytes(SMALL, lay, stage))
        self.assertEqual(got_tp, tp)
        self.assertEqual(got_pp, pp)

    def test_tp2(self):
        self.check(Layout(tp=2), 0, {"tp.all_reduce": 246528}, 0)
        self.check(Layout(tp=2, sp=True), 0,
                   {"tp.all_reduce": 2688, "tp.all_gather": 184320, "tp.reduce_scatter": 122880}, 0)

    def test_tp4_pp2(self):
        self.check(Layout(tp=4, pp=2), 0, {"tp.all_reduce": 208896}, 8192)
        self.check(Layout(tp=4, pp=2), 1, {"tp.all_reduce": 160896}, 8192)
        self.check(Layout(tp=4, pp=2, sp=True), 0,
                   {"tp.all_reduce": 1536, "tp.all_gather": 153600, "tp.reduce_scatter": 104448}, 2048)
        self.check(Layout(tp=4, pp=2, sp=True), 1,
                   {"tp.all_reduce": 2496, "tp.all_gather": 122880, "tp.reduce_scatter": 79872}, 2048)

    def test_tp2_pp2_dp2(self):  # dp = 2 halves the micro-batches of each rank
        self.check(Layout(tp=2, pp=2, dp=2), 0, {"tp.all_reduce": 69632}, 4096)
        self.check(Layout(tp=2, pp=2, dp=2), 1, {"tp.all_reduce": 53632}, 4096)
        self.check(Layout(tp=2, pp=2, dp=2, sp=True), 1,
                   {"tp.all_reduce": 1280, "tp.all_gather": 40960, "tp.reduce_scatter": 26624}, 2048)

    def test_split_region_divides_by_tp(self):
        # LNS: per sublayer u, f, r of [N, C] f32 and one rstd [N]: 2 * (3*16*32*4 + 16*4)
        self.assertEqual(split_region_bytes(SMALL, Layout(tp=2), 3)[0], 2 * (3 * 16 * 32 * 4 + 16 * 4))
        self.assertEqual(split_region_bytes(SMALL, Layout(tp=2, sp=True), 3)[0], 2 * (3 * 8 * 32 * 4 + 8 * 4))

    def test_split_regions_are_the_activation_accounts(self):
        # the two regions add up to what the activation account (memory_model.py, itself
        # held to lns_train's) says a layer keeps under --recompute=none, with and without SP
        for sp in (False, True):
            for act_bytes, dev in ((4, "cpu"), (2, "cuda")):
                split, tp_region = split_region_bytes(SMALL, Layout(tp=2, sp=sp, act_bytes=act_bytes), 3)
                acc = activation_account(SMALL, 2, 0, 7, True, True, 1, dev=dev, sp=sp)
                self.assertEqual(split + tp_region, acc.layers[3][2], (sp, dev))

    def test_cli_refuses_seq_len_not_divisible(self):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "perf", "comm_model.py"), "--tp=4",
                            "--seq_len=10", "--sequence_parallel=true"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--sequence_parallel needs --seq_len divisible by --tp, got 10 and 4", r.stderr)


if __name__ == "__main__":
    unittest.main()
