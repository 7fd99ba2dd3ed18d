#!/usr/bin/env python3
"""tools/device/bench_record.py: a GPU run's results folder becomes one record of the
shape docs/BENCHMARKS.md's tables are made from, and bad input is one clear error.

The folder is written here as run_gpu.sh writes it (env.json, run.log with step
markers and RESULT/PROFILE lines, the carried test programs' verdicts), with figures
chosen so that every number in the record and the tables can be checked by hand.
A step variant's figure counts only where its GPU correctness test passed in the same
record (summarize.CORRECTNESS): synthetic records with that test passed, failed and
absent. A profile's bounds are stored in the record when it is made, and the tables
use them, not today's model.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TOOL = os.path.join(ROOT, "tools", "device", "bench_record.py")
sys.path.insert(0, os.path.join(ROOT, "tools", "perf"))
import profile_model  # noqa: E402  (the bounds a record stores, computed here independently of bench_record)

RUN_LOG = """### step kernels: lns_bench_kernels
### done kernels rc=0 seconds=20
### step step_1b_lns: lns_bench_step --profile
config: hidden 2048
PROFILE {"step_ms": 2000.0, "rows": [{"class": "GEMMs (cuBLASLt)", "ms": 1500.0, "ops": 1200}, {"class": "other device work and host gaps (the rest)", "ms": 500.0, "ops": 0}]}
RESULT {"impl": "lns", "device": "cuda", "median_ms": 1800.0, "min_ms": 1790.5, "max_ms": 1830.25, "steps": 10, "mfu": 0.58, "peak_mem_gib": 37.3, "startup_s": 9.5}
### done step_1b_lns rc=0 seconds=60
### step step_graphs_1b_lns: lns_bench_step --cuda_graphs
RESULT {"impl": "lns", "device": "cuda", "median_ms": 1755.0, "mfu": 0.59, "peak_mem_gib": 37.4}
### done step_graphs_1b_lns rc=0 seconds=50
### step step_cudnn_1b_lns: lns_bench_step --attention=cudnn --profile
PROFILE {"step_ms": 1650.0, "rows": [{"class": "GEMMs (cuBLASLt)", "ms": 1155.0, "ops": 1200}, {"class": "attention", "ms": 165.0, "ops": 48}, {"class": "other device work and host gaps (the rest)", "ms": 330.0, "ops": 0}]}
RESULT {"impl": "lns", "device": "cuda", "median_ms": 1620.0, "mfu": 0.64, "peak_mem_gib": 37.0}
### done step_cudnn_1b_lns rc=0 seconds=50
### step step_fp8_1b_lns: lns_bench_step --fp8=delayed --profile
PROFILE {"step_ms": 1400.0, "rows": [{"class": "GEMMs (cuBLASLt)", "ms": 700.0, "ops": 3000}, {"class": "FP8 casts (scale, amax, transpose)", "ms": 350.0, "ops": 900}, {"class": "other device work and host gaps (the rest)", "ms": 350.0, "ops": 0}]}
RESULT {"impl": "lns", "device": "cuda", "median_ms": 1300.0, "mfu": 0.8, "peak_mem_gib": 36.0}
### done step_fp8_1b_lns rc=0 seconds=50
### step step_fp8bw_1b_lns: lns_bench_step --fp8=blockwise --profile
PROFILE {"step_ms": 1500.0, "rows": [{"class": "GEMMs (cuBLASLt)", "ms": 900.0, "ops": 3000}, {"class": "FP8 casts (scale, amax, transpose)", "ms": 300.0, "ops": 1100}, {"class": "other device work and host gaps (the rest)", "ms": 300.0, "ops": 0}]}
RESULT {"impl": "lns", "device": "cuda", "median_ms": 1350.0, "mfu": 0.77, "peak_mem_gib": 36.2}
### done step_fp8bw_1b_lns rc=0 seconds=50
### step step_torch_1b_lns: bench_step_torch.py --compile
RESULT {"impl": "torch", "median_ms": 2241.0, "mfu": 0.46, "peak_mem_gib": 39.5, "intermediate_size": 5461}
### done step_torch_1b_lns rc=0 seconds=90
### step step_torch_padded_1b_lns: bench_step_torch.py --compile --pad_ffn 64
RESULT {"impl": "torch", "median_ms": 2106.0, "mfu": 0.49, "peak_mem_gib": 39.6, "intermediate_size": 5504}
### done step_torch_padded_1b_lns rc=0 seconds=90
### step step_1b_lns_seq4k: lns_bench_step
### done step_1b_lns_seq4k rc=1 seconds=3
### step test_gpu: bash tools/device/gtest_each.sh lns_gpu_tests *
[ RUN      ] CudnnModelStep.GpuStepMatchesCpuStep
gtest_each: passed CudnnModelStep.GpuStepMatchesCpuStep
gtest_each: passed ModelStep.Fp8GpuStepMatchesCpuFp8Step
gtest_each: passed ModelStep.Fp8BlockwiseGpuStepMatchesCpuStep
gtest_each: passed Schemes/CudaGraphs.GraphedStepsEqualUngraphedBitForBit/lns
gtest_each: passed Schemes/CudaGraphs.GraphedStepsEqualUngraphedBitForBit/routed
gtest_each: skipped Norm.Skipped
gtest_each: 5 of 6 tests passed; skipped: Norm.Skipped
### done test_gpu rc=0 seconds=40
"""


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


class BenchRecord(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="lns_bench_record_")
        self.res = os.path.join(self.dir, "results")
        os.makedirs(self.res)
        with open(os.path.join(self.res, "env.json"), "w") as f:
            json.dump({"gpu": "NVIDIA H100 80GB HBM3, 580.159.04", "date": "2026-11-27 21:40 UTC", "git": "abc1234"}, f)
        with open(os.path.join(self.res, "run.log"), "w") as f:
            f.write(RUN_LOG)

    def test_record_and_tables(self):
        out = os.path.join(self.dir, "records")
        r = run(self.res, "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        path = r.stdout.strip()
        self.assertEqual(path, os.path.join(out, "h100-2026-11-27.json"))
        rec = json.load(open(path))
        self.assertEqual((rec["gpu"], rec["driver"], rec["date"], rec["commit"]),
                         ("NVIDIA H100 80GB HBM3", "580.159.04", "2026-11-27", "abc1234"))
        c = rec["configs"]["1b_lns"]
        self.assertEqual(c["lns"]["step_ms"], 1800.0)
        self.assertEqual((c["lns"]["min_ms"], c["lns"]["max_ms"], c["lns"]["steps"]), (1790.5, 1830.25, 10))
        # the tests the run reported, and the status of the steps that are no config's
        self.assertEqual(rec["tests"]["CudnnModelStep.GpuStepMatchesCpuStep"], "passed")
        self.assertEqual(rec["tests"]["Norm.Skipped"], "skipped")
        self.assertEqual(len(rec["tests"]), 6)
        self.assertEqual(rec["steps"], {"kernels": "ok, 20 s", "test_gpu": "ok, 40 s"})
        # each profile keeps the bounds it is compared with: the model's for that config, GPU and mode
        for peer in ("lns", "lns_cudnn", "lns_fp8", "lns_fp8_blockwise"):
            want = {k: v * 1e3 for k, v in profile_model.bounds(profile_model.model_for(
                "1b_lns", "h100", profile_model.PROFILED[peer])).items()}
            self.assertEqual(set(c[peer]["profile"]["bounds_ms"]), set(want), peer)
            for k, v in want.items():
                self.assertAlmostEqual(c[peer]["profile"]["bounds_ms"][k], v, places=6, msg=f"{peer} {k}")
        self.assertEqual(c["lns"]["mfu"], 0.58)
        self.assertEqual(c["lns"]["peak_gib"], 37.3)
        self.assertEqual(c["lns"]["startup_s"], 9.5)
        self.assertEqual(c["lns"]["profile"]["rows"][0]["ops"], 1200)
        self.assertEqual(c["lns_graphs"]["step_ms"], 1755.0)
        self.assertNotIn("profile", c["lns_graphs"])
        self.assertEqual(c["lns_cudnn"]["step_ms"], 1620.0)
        self.assertEqual(c["lns_fp8"]["step_ms"], 1300.0)
        self.assertEqual(c["lns_fp8_blockwise"]["step_ms"], 1350.0)
        self.assertEqual(c["torch_compile"]["step_ms"], 2241.0)
        self.assertEqual(c["torch_compile_padded"]["step_ms"], 2106.0)
        self.assertNotIn("1b_lns_seq4k", rec["configs"])  # no figures: only its status
        self.assertEqual(rec["status"]["1b_lns_seq4k"]["lns"], "FAILED (rc 1), 3 s")
        # A second run the same day keeps the first record.
        r2 = run(self.res, "--out", out)
        self.assertEqual(r2.stdout.strip(), os.path.join(out, "h100-2026-11-27-2.json"))
        os.remove(r2.stdout.strip())
        # The tables: 2106 / 1620 = 1.30x, the fastest bf16 lns run against the padded peer
        # (the FP8 step has its own column and is not a bf16 comparison); the profile's shares.
        doc = os.path.join(self.dir, "BENCH.md")
        with open(doc, "w") as f:
            f.write("# B\n\nbefore\n<!-- bench_records:begin -->\nold\n<!-- bench_records:end -->\nafter\n")
        r = run("--tables", "--records", out, "--doc", doc)
        self.assertEqual(r.returncode, 0, r.stderr)
        text = open(doc).read()
        self.assertIn("before\n<!-- bench_records:begin -->\n", text)
        self.assertTrue(text.endswith("<!-- bench_records:end -->\nafter\n"))
        self.assertNotIn("\nold\n", text)
        self.assertIn("| NVIDIA H100 80GB HBM3, 2026-11-27 21:40, abc1234 | 1b_lns | 1,800.0 | 58.0% | 1,755.0 | 1,620.0 | "
                      "1,300.0 | 1,350.0 | 9.5 | 2,241.0 | 2,106.0 | 1.30x |", text)
        # A step without figures shows why.
        self.assertIn("| NVIDIA H100 80GB HBM3, 2026-11-27 21:40, abc1234 | 1b_lns_seq4k | FAILED (rc 1), 3 s |", text)
        # Each profile row beside the roofline model's bound for the same work.
        self.assertRegex(text, r"\| GEMMs \(cuBLASLt\) \| 1,500\.0 \| 75\.0% \| 1200 \| [0-9,]+\.[0-9] \| [0-9.]+x \|")
        self.assertIn("| other device work and host gaps (the rest) | 500.0 | 25.0% | 0 | 0.0 | — |", text)
        # The FP8 steps' profiles, their casts a row of their own, beside the model of that
        # mode (tools/perf/profile_model.py: 146.9 / 186.8 ms of casts at 1B on an H100).
        self.assertIn("Where the step goes, 1b_lns with --fp8=delayed on NVIDIA H100 80GB HBM3", text)
        self.assertIn("| FP8 casts (scale, amax, transpose) | 350.0 | 25.0% | 900 | 146.9 | 2.38x |", text)
        self.assertIn("Where the step goes, 1b_lns with --fp8=blockwise on NVIDIA H100 80GB HBM3", text)
        self.assertIn("Where the step goes, 1b_lns with --attention=cudnn on NVIDIA H100 80GB HBM3", text)
        self.assertRegex(text, r"\| attention \| 165\.0 \| 10\.0% \| 48 \| [0-9,]+\.[0-9] \| [0-9.]+x \|")
        self.assertIn("| FP8 casts (scale, amax, transpose) | 300.0 | 20.0% | 1100 | 186.8 | 1.61x |", text)
        # A later, shorter run without profiles (one variant measured) keeps this run's map.
        with open(os.path.join(out, "h100-2026-11-28.json"), "w") as f:
            json.dump({"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-28", "time": "09:00", "commit": "def5678",
                       "configs": {"1b_lns": {"lns_fp8_blockwise": {"step_ms": 1400.0}}}}, f)
        r = run("--tables", "--records", out, "--doc", doc)
        self.assertEqual(r.returncode, 0, r.stderr)
        text = open(doc).read()
        self.assertIn("| NVIDIA H100 80GB HBM3, 2026-11-28 09:00, def5678 | 1b_lns | — |", text)
        self.assertIn("Where the step goes, 1b_lns on NVIDIA H100 80GB HBM3 (2026-11-27)", text)
        self.assertIn("| FP8 casts (scale, amax, transpose) | 350.0 | 25.0% | 900 | 146.9 | 2.38x |", text)

    def test_kernels_keep_a_faster_gemm_candidate(self):
        # lns_bench_kernels --json: a GEMM that another of cuBLASLt's candidates ran faster
        # keeps that candidate in the record; one where none did (-1) keeps only its figure.
        with open(os.path.join(self.res, "kernels.json"), "w") as f:
            json.dump([{"name": "gemm_fwd_q_8192x2048x2048", "metric": "TFLOP/s", "value": 650.0, "ms": 0.106,
                        "best_candidate": 2, "best_candidate_ms": 0.098},
                       {"name": "gemm_wgrad_q_2048x2048x8192", "metric": "TFLOP/s", "value": 700.0, "ms": 0.098,
                        "best_candidate": -1, "best_candidate_ms": 0.098},
                       {"name": "copy_1024MiB", "metric": "GB/s", "value": 4215.0, "ms": 0.5}], f)
        with open(os.path.join(self.res, "kernels_130m_lns.json"), "w") as f:  # a second config's GEMMs
            json.dump({"results": [{"name": "gemm_fwd_q_8192x768x768", "metric": "TFLOP/s", "value": 400.0}]}, f)
        with open(os.path.join(self.res, "kernels_torch.json"), "w") as f:  # PyTorch's: not ours
            json.dump([{"name": "gemm_fwd_q_8192x768x768", "metric": "TFLOP/s", "value": 1.0}], f)
        out = os.path.join(self.dir, "records")
        r = run(self.res, "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        k = json.load(open(r.stdout.strip()))["kernels"]
        self.assertEqual(k["gemm_fwd_q_8192x2048x2048"],
                         {"value": 650.0, "metric": "TFLOP/s", "best_candidate": 2, "best_candidate_ms": 0.098})
        self.assertEqual(k["gemm_wgrad_q_2048x2048x8192"], {"value": 700.0, "metric": "TFLOP/s"})
        self.assertEqual(k["copy_1024MiB"], {"value": 4215.0, "metric": "GB/s"})
        self.assertEqual(k["gemm_fwd_q_8192x768x768"], {"value": 400.0, "metric": "TFLOP/s"})

    def tables_of(self, records):
        """The generated tables of RECORDS ({file name: record})."""
        recs = tempfile.mkdtemp(prefix="records_", dir=self.dir)
        for name, r in records.items():
            with open(os.path.join(recs, name), "w") as f:
                json.dump(r, f)
        doc = os.path.join(self.dir, "GATE.md")
        with open(doc, "w") as f:
            f.write("<!-- bench_records:begin -->\n<!-- bench_records:end -->\n")
        r = run("--tables", "--records", recs, "--doc", doc)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(doc) as f:
            return f.read()

    def test_a_gated_figure_counts_only_where_its_test_passed(self):
        # One config, the plain step 2,000 ms, cuDNN's 1,800 ms, the padded peer 2,160 ms:
        # with CudnnModelStep passed the speed-up is 2160 / 1800 = 1.20x, else 2160 / 2000 = 1.08x.
        def record(time, tests):
            r = {"gpu": "NVIDIA H200", "date": "2026-12-01", "time": time, "commit": "c" + time[:2],
                 "configs": {"1b_lns": {"lns": {"step_ms": 2000.0}, "lns_cudnn": {"step_ms": 1800.0},
                                        "torch_compile_padded": {"step_ms": 2160.0}}}}
            if tests is not None:
                r["tests"] = tests
            return r
        name = "CudnnModelStep.GpuStepMatchesCpuStep"
        text = self.tables_of({"a.json": record("10:00", {name: "passed", "Other.Test": "failed"}),
                               "b.json": record("11:00", {name: "failed"}),
                               "c.json": record("12:00", {"Other.Test": "passed"}),
                               "d.json": record("13:00", None),
                               "e.json": record("14:00", {name: "skipped"})})
        row = "| NVIDIA H200, 2026-12-01 {}, c{} | 1b_lns | 2,000.0 | — | — | {} | — | — | — | — | 2,160.0 | {} |"
        self.assertIn(row.format("10:00", "10", "1,800.0", "1.20x"), text)
        self.assertIn(row.format("11:00", "11", "1,800.0 (test failed)", "1.08x"), text)
        self.assertIn(row.format("12:00", "12", "1,800.0 (untested)", "1.08x"), text)
        self.assertIn(row.format("13:00", "13", "1,800.0 (untested)", "1.08x"), text)  # a record without tests
        self.assertIn(row.format("14:00", "14", "1,800.0 (test skipped)", "1.08x"), text)
        self.assertIn("`CudnnModelStep.GpuStepMatchesCpuStep`", text)  # the note says which test
        # A parameterised test (a pattern): every instance must pass.
        graphs = "Schemes/CudaGraphs.GraphedStepsEqualUngraphedBitForBit/"
        r = {"gpu": "NVIDIA H200", "date": "2026-12-02", "commit": "g",
             "configs": {"130m_lns": {"lns": {"step_ms": 300.0}, "lns_graphs": {"step_ms": 250.0},
                                      "torch_compile": {"step_ms": 330.0}}}}
        text = self.tables_of({"a.json": dict(r, time="10:00", tests={graphs + "lns": "passed", graphs + "routed": "passed"}),
                               "b.json": dict(r, time="11:00", tests={graphs + "lns": "passed", graphs + "routed": "failed"})})
        self.assertIn("| NVIDIA H200, 2026-12-02 10:00, g | 130m_lns | 300.0 | — | 250.0 | — | — | — | — | 330.0 | — | 1.32x |", text)
        self.assertIn("| NVIDIA H200, 2026-12-02 11:00, g | 130m_lns | 300.0 | — | 250.0 (test failed) | — | — | — | — | 330.0 | — | 1.10x |", text)

    def test_a_figure_of_few_steps_says_so(self):
        r = {"gpu": "NVIDIA H200", "date": "2026-12-01", "time": "10:00", "commit": "x",
             "configs": {"1b_lns": {"lns": {"step_ms": 2000.0, "steps": 5, "min_ms": 1990.0, "max_ms": 2050.0},
                                    "torch_compile_padded": {"step_ms": 2160.0, "steps": 10}}}}
        text = self.tables_of({"a.json": r})
        self.assertIn("| 1b_lns | 2,000.0 (5 steps) | — | — | — | — | — | — | — | 2,160.0 | 1.08x |", text)

    def test_the_tables_use_the_bounds_a_record_stored(self):
        # A record whose profile stored its bounds: the ratios are against those, whatever
        # the model says today (GEMMs 1,000 ms against a stored 500: 2.00x).
        prof = {"step_ms": 2000.0, "rows": [{"class": "GEMMs (cuBLASLt)", "ms": 1000.0, "ops": 10},
                                            {"class": "attention", "ms": 1000.0, "ops": 5}],
                "bounds_ms": {"GEMMs (cuBLASLt)": 500.0, "attention": 250.0}}
        r = {"gpu": "NVIDIA H200", "date": "2026-12-01", "time": "10:00", "commit": "x",
             "configs": {"1b_lns": {"lns": {"step_ms": 1990.0, "profile": prof}}}}
        text = self.tables_of({"a.json": r})
        self.assertIn("| GEMMs (cuBLASLt) | 1,000.0 | 50.0% | 10 | 500.0 | 2.00x |", text)
        self.assertIn("| attention | 1,000.0 | 50.0% | 5 | 250.0 | 4.00x |", text)
        # Without stored bounds (a record before 2026-12): today's model's.
        del prof["bounds_ms"]
        model = profile_model.bounds(profile_model.model_for("1b_lns", "h200", "none"))["GEMMs (cuBLASLt)"] * 1e3
        text = self.tables_of({"a.json": r})
        self.assertIn(f"| GEMMs (cuBLASLt) | 1,000.0 | 50.0% | 10 | {model:,.1f} | {1000.0 / model:.2f}x |", text)

    def test_bad_input_is_one_line(self):
        os.remove(os.path.join(self.res, "env.json"))
        r = run(self.res, "--out", self.dir)
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(r.stderr.strip().count("\n"), 0, r.stderr)
        self.assertIn("env.json: missing or without 'gpu' and 'date'", r.stderr)
        doc = os.path.join(self.dir, "nomarkers.md")
        open(doc, "w").write("# no markers\n")
        r = run("--tables", "--records", self.dir, "--doc", doc)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("needs one '<!-- bench_records:begin -->' line", r.stderr)
        self.assertEqual(open(doc).read(), "# no markers\n")  # untouched
        bad = os.path.join(self.dir, "recs")
        os.makedirs(bad)
        open(os.path.join(bad, "x.json"), "w").write("[1, 2]")
        open(doc, "w").write("<!-- bench_records:begin -->\n<!-- bench_records:end -->\n")
        r = run("--tables", "--records", bad, "--doc", doc)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("x.json: not a record", r.stderr)


if __name__ == "__main__":
    unittest.main()
