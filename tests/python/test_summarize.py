#!/usr/bin/env python3
"""tools/device/summarize.py on a results folder as run_gpu.sh writes it: the tests run
as the carried test programs (step test_gpu, tools/device/gtest_each.sh) and through
ctest (step test) are counted as run, and a step variant whose correctness test did not
pass in the same run is marked and left without a ratio (summarize.CORRECTNESS).
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TOOL = os.path.join(ROOT, "tools", "device", "summarize.py")

STEPS = """### step step_1b_lns: lns_bench_step
RESULT {"median_ms": 2000.0, "min_ms": 1990.0, "max_ms": 2040.0, "steps": 10, "mfu": 0.5}
### done step_1b_lns rc=0 seconds=30
### step step_cudnn_1b_lns: lns_bench_step --attention=cudnn
RESULT {"median_ms": 1800.0, "min_ms": 1795.0, "max_ms": 1810.0, "steps": 10, "mfu": 0.56}
### done step_cudnn_1b_lns rc=0 seconds=28
### step step_torch_padded_1b_lns: bench_step_torch.py --pad_ffn 64
RESULT {"median_ms": 2160.0, "min_ms": 2150.0, "max_ms": 2200.0, "steps": 10, "mfu": 0.47}
### done step_torch_padded_1b_lns rc=0 seconds=110
"""
GTEST_EACH = """### step test_gpu: bash tools/device/gtest_each.sh lns_gpu_tests *
gtest_each: {cudnn} CudnnModelStep.GpuStepMatchesCpuStep
gtest_each: passed Norm.Backward
gtest_each: skipped Norm.Wide
gtest_each: FAILED Fp8.Casts (rc 134)
gtest_each: 2 of 4 tests passed; skipped: Norm.Wide; failed: Fp8.Casts
### done test_gpu rc=1 seconds=50
"""
CTEST = """### step test: ctest --test-dir build-gpu -L gpu
      Start  1: Norm.Forward
 1/3 Test  #1: Norm.Forward .....................   Passed    1.20 sec
 2/3 Test  #2: Norm.Big .........................***Failed    2.00 sec
 3/3 Test  #3: Attention.Long ...................***Timeout  300.00 sec

33% tests passed, 2 tests failed out of 3

The following tests FAILED:
\t  2 - Norm.Big (Failed)
\t  3 - Attention.Long (Timeout)
### done test rc=8 seconds=310
"""


def summarize(log):
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "env.json"), "w") as f:
            json.dump({"gpu": "NVIDIA H200, 580", "date": "2026-12-01 10:00 UTC", "git": "abc1234"}, f)
        with open(os.path.join(d, "run.log"), "w") as f:
            f.write(log)
        r = subprocess.run([sys.executable, TOOL, d], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


class Summarize(unittest.TestCase):
    def test_the_carried_programs_tests_count_as_run(self):
        out = summarize(STEPS + GTEST_EACH.format(cudnn="passed"))
        self.assertIn("| tests (ctest -L gpu, or the carried test programs) | 2/4 passed; skipped: Norm.Wide; "
                      "failed: Fp8.Casts |", out)
        out = summarize(CTEST)
        self.assertIn("| 1/3 passed; failed: Norm.Big (Failed), Attention.Long (Timeout) |", out)
        # a test stage cut off at its limit: what ran is counted, and it says so
        cut = GTEST_EACH.format(cudnn="passed").split("gtest_each: skipped")[0]
        out = summarize(STEPS + cut)
        self.assertIn("| 2/2 passed; cut off before the rest |", out)
        self.assertIn("| tests (ctest -L gpu, or the carried test programs) | not run |", summarize(STEPS))

    def test_a_step_whose_test_did_not_pass_has_no_ratio(self):
        # passed: cuDNN's 1,800 ms against the padded peer's 2,160: 0.83
        out = summarize(STEPS + GTEST_EACH.format(cudnn="passed"))
        self.assertIn("| 1b_lns (lns_cudnn): step, median ms (lower is better) | 1,800 (1,795-1,810, 10 steps) | "
                      "2,160 (2,150-2,200, 10 steps) | 0.83 |", out)
        self.assertIn("| 1b_lns: step, median ms (lower is better) | 2,000 (1,990-2,040, 10 steps) | "
                      "2,160 (2,150-2,200, 10 steps) | 0.93 |", out)  # the plain step is not gated
        for verdict, mark in (("FAILED", "(test failed)"), ("skipped", "(test skipped)")):
            out = summarize(STEPS + GTEST_EACH.format(cudnn=verdict))
            self.assertIn(f"| 1b_lns (lns_cudnn): step, median ms (lower is better) | 1,800 (1,795-1,810, 10 steps) "
                          f"{mark} | 2,160 (2,150-2,200, 10 steps) | — |", out)
        out = summarize(STEPS)  # no test ran
        self.assertIn("| 1b_lns (lns_cudnn): step, median ms (lower is better) | 1,800 (1,795-1,810, 10 steps) "
                      "(untested) | 2,160 (2,150-2,200, 10 steps) | — |", out)
        self.assertIn("| 1b_lns (lns_cudnn): MFU | 56.0% (untested) | 47.0% | — |", out)


if __name__ == "__main__":
    unittest.main()
