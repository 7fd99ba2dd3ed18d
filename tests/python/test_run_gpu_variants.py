#!/usr/bin/env python3
"""tools/device/run_gpu.sh's VARIANTS: which bench runs each config gets.

A lent GPU has 15 minutes, so a call names the runs it can afford per config
("1b_lns_seq4k=cudnn"). The bench stage is run here with stand-in programs that
print their arguments, and the steps it ran are read back from its run.log.
"""
import os
import re
import stat
import subprocess
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "tools", "device", "run_gpu.sh")
STANDIN = "#!/bin/sh\necho \"stand-in $0 $*\"\n"


def run_bench(tmp, configs, variants, **extra):
    bin_dir = os.path.join(tmp, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    for name in ("lns_bench_step", "lns_bench_kernels", "lns_train"):
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write(STANDIN)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    out = os.path.join(tmp, "out")
    env = dict(os.environ, STAGES="bench", TORCH="0", KERNELS_TORCH="0", BIN_DIR=bin_dir, OUT=out,
               LNS_DEBS=os.path.join(tmp, "no-debs"), LNS_DEPS_PREFIX=os.path.join(tmp, "deps"),
               PYTHONDONTWRITEBYTECODE="1", **extra)
    for name, value in (("CONFIGS", configs), ("VARIANTS", variants)):  # None: unset (a preset's)
        env.pop(name, None)
        if value is not None:
            env[name] = value
    subprocess.run(["bash", SCRIPT], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120)
    with open(os.path.join(out, "run.log")) as f:
        log = f.read()
    # step name -> its command line
    return dict(re.findall(r"^### step (\S+): (.*)$", log, re.M))


class Variants(unittest.TestCase):
    def test_named_configs_get_their_variants_and_the_rest_get_all(self):
        with tempfile.TemporaryDirectory() as tmp:
            steps = run_bench(tmp, "130m_lns 1b_lns_seq4k 1b_lns",
                              "130m_lns=lns,profile,fp8 1b_lns_seq4k=cudnn")
        self.assertEqual(sorted(s for s in steps if s.startswith("step_") and s.endswith("_130m_lns")),
                         ["step_130m_lns", "step_fp8_130m_lns"])
        self.assertIn("--profile", steps["step_130m_lns"])
        self.assertIn("--profile", steps["step_fp8_130m_lns"])
        self.assertEqual([s for s in steps if s.endswith("_1b_lns_seq4k")], ["step_cudnn_1b_lns_seq4k"])
        self.assertEqual(sorted(s for s in steps if s.endswith("_1b_lns")),
                         ["step_1b_lns", "step_cudnn_1b_lns", "step_fp8_1b_lns",
                          "step_fp8bw_1b_lns", "step_graphs_1b_lns"])
        self.assertIn("--profile", steps["step_1b_lns"])
        self.assertIn("kernels", steps)
        self.assertIn("--flagfile=configs/130m_lns.flags --sections=step_gemm", steps["kernels_130m_lns"])

    def test_fp8_steps_take_cudnn_attention_where_the_library_is(self):
        with tempfile.TemporaryDirectory() as tmp:
            lib = os.path.join(tmp, "libcudnn.so.9")
            open(lib, "w").close()
            steps = run_bench(tmp, "1b_lns", "1b_lns=fp8,fp8bw,cudnn", KERNELS="0", LNS_CUDNN_LIB=lib)
            self.assertIn("--attention=cudnn", steps["step_fp8_1b_lns"])
            self.assertIn("--attention=cudnn", steps["step_fp8bw_1b_lns"])
            steps = run_bench(tmp, "1b_lns", "1b_lns=fp8,fp8bw", KERNELS="0", LNS_CUDNN_LIB=lib, CUDNN="0")
            self.assertNotIn("--attention", steps["step_fp8_1b_lns"])
            steps = run_bench(tmp, "1b_lns", "1b_lns=fp8", KERNELS="0", LNS_CUDNN_LIB=os.path.join(tmp, "none.so"))
            self.assertNotIn("--attention", steps["step_fp8_1b_lns"])

    def test_the_lease_preset_is_defaults_the_call_overrides(self):
        preset = os.path.join(ROOT, "tools", "device", "lease.env")
        with tempfile.TemporaryDirectory() as tmp:
            # the preset's own configs and variants (its stages but the bench overridden)
            steps = run_bench(tmp, None, None, PRESET=preset, KERNELS="0")
        want = set()
        for entry in subprocess.run(["bash", "-c", f'. "{preset}"; echo "$VARIANTS"'], capture_output=True,
                                    text=True, check=True).stdout.split():
            cfg, variants = entry.split("=")
            names = {"lns": "step_", "cudnn": "step_cudnn_", "graphs": "step_graphs_", "fp8": "step_fp8_",
                     "fp8bw": "step_fp8bw_"}
            want |= {names[v] + cfg for v in variants.split(",") if v in names}
        self.assertTrue(want)
        self.assertEqual(set(steps), want)
        with tempfile.TemporaryDirectory() as tmp:  # the call's environment wins
            steps = run_bench(tmp, "130m_lns", "130m_lns=fp8", PRESET=preset, KERNELS="0")
        self.assertEqual(sorted(steps), ["step_fp8_130m_lns"])

    def test_a_missing_preset_is_one_line(self):
        r = subprocess.run(["bash", SCRIPT], env=dict(os.environ, PRESET="/nonexistent/lease.env"),
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr.strip(), "run_gpu.sh: PRESET=/nonexistent/lease.env: no such file")

    def test_kernels_can_be_left_out(self):
        with tempfile.TemporaryDirectory() as tmp:
            steps = run_bench(tmp, "130m_lns", "130m_lns=fp8", KERNELS="0")
        self.assertEqual(sorted(steps), ["step_fp8_130m_lns"])


if __name__ == "__main__":
    unittest.main()
