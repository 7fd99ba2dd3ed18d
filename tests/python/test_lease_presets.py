#!/usr/bin/env python3
"""The prepared GPU calls (tools/device/lease.env, lease_next.env) fit a lease: a dry run
of each (DRY_RUN=1 run_gpu.sh: nothing runs, the plan is written) is predicted from the
measured costs (tools/device/costs.json and the records it names) to take at most the
8-minute budget; each runs its bench stage first and the correctness test of every step
variant it measures. The predictor fires on a plan that does not fit or has a step with
no cost and no limit, its arithmetic is checked against the record by hand, and the
device README's list of costs is the one costs.json gives.
"""
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEVICE = os.path.join(ROOT, "tools", "device")
SCRIPT = os.path.join(DEVICE, "run_gpu.sh")
sys.path.insert(0, DEVICE)
import predict  # noqa: E402
import summarize  # noqa: E402  (CORRECTNESS, peer_of)

BUDGET_S = 8 * 60


def dry_run(tmp, **settings):
    env = dict(os.environ, DRY_RUN="1", OUT=os.path.join(tmp, "out"), LNS_DEBS=os.path.join(tmp, "no-debs"),
               LNS_DEPS_PREFIX=os.path.join(tmp, "deps"), LNS_GPU_DEPS=os.path.join(tmp, "no-kit"),
               PYTHONDONTWRITEBYTECODE="1")
    for k in list(env):
        if k in ("STAGES", "CONFIGS", "VARIANTS", "GTEST_FILTER", "STEP_TIMEOUT", "KERNELS", "KERNELS_TORCH",
                 "TORCH", "LNS_STEPS", "TORCH_STEPS", "BIN_DIR", "LNS_LAYOUTS") or k.startswith("TIMEOUT_"):
            del env[k]
    env.update(settings)
    r = subprocess.run(["bash", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    plan = []
    if os.path.exists(os.path.join(tmp, "out", "plan.tsv")):
        with open(os.path.join(tmp, "out", "plan.tsv")) as f:
            plan = [l.split("\t") for l in f.read().splitlines()]
    m = re.search(r"^predicted: (\d+) s", r.stdout, re.M)
    return r, plan, int(m.group(1)) if m else None


def preset_value(preset, name):
    return subprocess.run(["bash", "-c", f'. "{preset}"; echo "${name}"'], capture_output=True, text=True,
                          check=True).stdout.strip()


class Presets(unittest.TestCase):
    def check_preset(self, name):
        preset = os.path.join(DEVICE, name)
        with tempfile.TemporaryDirectory() as tmp:
            r, plan, seconds = dry_run(tmp, PRESET=preset)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIsNotNone(seconds, r.stdout)
        self.assertLessEqual(seconds, BUDGET_S, r.stdout)
        self.assertIn(": fits", r.stdout)
        print(f"{name}: predicted {seconds} s of {BUDGET_S}")
        names = [p[0] for p in plan]
        # the bench stage first: a call cut off keeps its figures
        tests = [i for i, n in enumerate(names) if n.startswith("test")]
        benches = [i for i, n in enumerate(names) if n.startswith(("step_", "kernels"))]
        self.assertTrue(tests and benches, names)
        self.assertLess(max(benches), min(tests), names)
        # every step figure a median of at least 10 timed steps
        for n, _, cmd in plan:
            m = re.search(r"--bench_steps=(\d+)|--steps (\d+)", cmd)
            if n.startswith("step_"):
                self.assertGreaterEqual(int(m.group(1) or m.group(2)), 10, cmd)
        # every gated variant's correctness test is in the test stage's filter
        gtest_filter = preset_value(preset, "GTEST_FILTER").split("-")[0].split(":")
        for n in names:
            got = summarize.peer_of(n)
            test = summarize.CORRECTNESS.get(got[1]) if got else None
            if test:
                self.assertTrue(any(fnmatch.fnmatchcase(test.replace("*", "x"), p) for p in gtest_filter),
                                f"{n}: its test {test} is not in GTEST_FILTER")
        return plan, r.stdout

    def test_the_lease_fits_and_measures_what_issue_44_asks_first(self):
        plan, out = self.check_preset("lease.env")
        steps = {p[0]: p for p in plan}
        for n in ("kernels", "kernels_130m_lns", "step_cudnn_1b_lns", "step_fp8_1b_lns", "step_fp8bw_1b_lns",
                  "test_gpu"):
            self.assertIn(n, steps)
        for n in ("step_cudnn_1b_lns", "step_fp8_1b_lns", "step_fp8bw_1b_lns"):  # profiled
            self.assertIn("--profile", steps[n][2])
        self.assertIn("--sections=step_gemm", steps["kernels_130m_lns"][2])

    def test_the_next_call_fits_and_gives_the_seq4k_peer_its_own_limit(self):
        plan, out = self.check_preset("lease_next.env")
        steps = {p[0]: p for p in plan}
        self.assertIn("--pad_ffn 64", steps["step_torch_padded_1b_lns_seq4k"][2])
        self.assertGreater(int(steps["step_torch_padded_1b_lns_seq4k"][1]), int(preset_value(
            os.path.join(DEVICE, "lease_next.env"), "STEP_TIMEOUT")))
        self.assertIn("step_cudnn_1b_lns_seq4k", steps)

    def test_the_prediction_of_a_measured_step(self):
        # 1B with cuDNN on the H200: 18 s for 7 steps (5 timed, 2 warm-up) of 1,863.138 ms
        # leave 4.96 s of start-up and exit; 10 timed + 2 warm-up + 1 profiled step then
        # cost 4.96 + 13 x 1.863 = 29.2 s, plus the record's rewrite (0.5 s).
        with open(os.path.join(ROOT, "docs", "benchmarks", "h200-2026-11-28.json")) as f:
            rec = json.load(f)
        step_s = rec["configs"]["1b_lns"]["lns_cudnn"]["step_ms"] / 1e3
        self.assertEqual(rec["status"]["1b_lns"]["lns_cudnn"], "ok, 18 s")
        want = (18 - 7 * step_s) + 13 * step_s + 0.5
        costs = predict.Costs(predict.load_costs())
        p = predict.predict([("step_cudnn_1b_lns", 150, "lns_bench_step --bench_steps=10 --bench_warmup=2 --profile")],
                            costs, env={})
        self.assertAlmostEqual(p["rows"][1][1], want, places=6)
        self.assertAlmostEqual(p["total_s"], want + 20, places=6)  # with the set-up
        # a limit below the measured cost bounds it
        p = predict.predict([("step_cudnn_1b_lns", 5, "lns_bench_step --bench_steps=10 --bench_warmup=2")], costs, env={})
        self.assertEqual(p["rows"][1][1], 5 + 10 + 0.5)

    def test_the_predictor_fires(self):
        with tempfile.TemporaryDirectory() as tmp:  # a step never measured and without a limit
            r, plan, seconds = dry_run(tmp, STAGES="bench", CONFIGS="1b_lns", VARIANTS="1b_lns=cudnn")
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("| kernels | unbounded | unbounded: not measured and no limit (TIMEOUT_kernels or STEP_TIMEOUT) |",
                      r.stdout)
        self.assertIn("predicted: unbounded", r.stdout)
        with tempfile.TemporaryDirectory() as tmp:  # limits that do not fit
            r, plan, seconds = dry_run(tmp, PRESET=os.path.join(DEVICE, "lease.env"), TIMEOUT_kernels="400")
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertGreater(seconds, BUDGET_S)
        self.assertIn("DOES NOT FIT", r.stdout)
        with tempfile.TemporaryDirectory() as tmp:  # the stages in their fixed order
            r, plan, seconds = dry_run(tmp, STAGES="test bench", STEP_TIMEOUT="60", CONFIGS="130m_lns",
                                       VARIANTS="130m_lns=lns", KERNELS="0", KERNELS_TORCH="0",
                                       GTEST_FILTER="Norm.*")
        self.assertEqual([p[0] for p in plan], ["step_130m_lns", "test_gpu"])

    def test_the_readme_lists_the_costs_the_predictor_uses(self):
        with open(os.path.join(DEVICE, "README.md")) as f:
            text = f.read()
        block = predict.readme_block(predict.Costs(predict.load_costs()))
        self.assertIn(predict.BEGIN + "\n" + block + "\n" + predict.END, text,
                      "run: python3 tools/device/predict.py --readme")


if __name__ == "__main__":
    unittest.main()
