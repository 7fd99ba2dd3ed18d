#!/usr/bin/env python3
"""tools/perf/profile_model.py: every kernel of the roofline model falls in one class of
the measured profile, the classes add up to the model's step, and they are the classes
the C++ profile prints (src/core/op_profile.cpp), so a measured row and its bound are
always the same work."""
import io
import json
import os
import re
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "perf"))
import profile_model  # noqa: E402


class ProfileModel(unittest.TestCase):
    def test_classes_are_the_cpp_profiles(self):
        src = open(os.path.join(ROOT, "src", "core", "op_profile.cpp")).read()
        order = re.search(r"order = \{(.*?)\};", src, re.S).group(1)
        cpp = re.findall(r'"([^"]+)"', order)
        py = [profile_model.GEMMS, profile_model.FP8_CASTS, profile_model.ATTENTION, profile_model.NORMS, profile_model.ELEMENTWISE,
              profile_model.EMBED, profile_model.OPTIM]
        self.assertEqual(cpp, py)

    def test_every_kernel_has_a_class_and_the_classes_add_up(self):
        for cfg in ("130m_lns", "1b_lns", "1b_lns_seq4k", "1b_pre", "tiny_lns"):
            m = profile_model.model_for(cfg, "h100")
            b = profile_model.bounds(m)  # raises on a kernel without a class
            want = m.num_micro() * m.micro_batch_time() + m.optimizer_time()
            self.assertAlmostEqual(sum(b.values()), want, delta=1e-9 * want, msg=cfg)
            self.assertGreater(b[profile_model.GEMMS], 0, cfg)
            self.assertGreater(b[profile_model.ATTENTION], 0, cfg)

    def test_fp8_casts_are_the_hand_count(self):
        # 130M (C = 768 = QD = KD, F = 2048, 12 layers, N = 32 x 256, 16 micro-batches).
        # Per layer and micro-batch, in bytes (bf16 read + 1-byte codes written):
        # forward x8: q/k/v's x, o's, gate/up's x, down's: 3NC + 3NC + 3NC + 3NF;
        # backward xT8 of the same four: 9NC + 3NF; each linear's dy (fo wide) 4N fo under
        # delayed (dy8 and dyT8 in one pass), 6N fo under blockwise (a row and a column
        # pass): o and down have fo = C, gate and up F, q, k, v C.
        # Per step each block weight once: 2 bytes read, 2 written.
        C, F, L, N, M = 768, 2048, 12, 32 * 256, 16
        weights = L * (4 * C * C + 3 * C * F) * 4
        for mode, dy in (("delayed", 4), ("blockwise", 6)):
            per_layer = (9 * N * C + 3 * N * F) * 2 + dy * (N * C + N * C + 2 * N * F + 3 * N * C)
            want = (M * L * per_layer + weights) / (3350.0 * 1e9)
            m = profile_model.model_for("130m_lns", "h100", mode)
            got = profile_model.bounds(m)[profile_model.FP8_CASTS]
            self.assertAlmostEqual(got, want, delta=1e-9 * want, msg=mode)
            # the block GEMMs at twice the bf16 rate, the LM head (bf16) as before
            bf16 = profile_model.bounds(profile_model.model_for("130m_lns", "h100"))
            head = sum(m.t(k) for k in m.kernels if k.name.startswith("lm_head")) * M
            self.assertLess(profile_model.bounds(m)[profile_model.GEMMS], bf16[profile_model.GEMMS])
            self.assertGreater(profile_model.bounds(m)[profile_model.GEMMS] - head,
                               0.45 * (bf16[profile_model.GEMMS] - head))
        self.assertEqual(profile_model.bounds(profile_model.model_for("130m_lns", "h100"))[profile_model.FP8_CASTS], 0)
        with self.assertRaises(ValueError):  # no FP8 tensor cores
            profile_model.bounds(profile_model.model_for("130m_lns", "a100", "delayed"))

    def test_prints_each_row_beside_its_bound(self):
        m = profile_model.model_for("130m_lns", "h100")
        b = profile_model.bounds(m)
        rows = [{"class": c, "ms": 2e3 * t, "ops": 1} for c, t in b.items()]  # measured = 2 x bound
        rec = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-27",
               "configs": {"130m_lns": {"lns": {"profile": {"step_ms": 2e3 * sum(b.values()), "rows": rows}}}}}
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(rec, f)
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(profile_model.main([f.name]), 0)
        os.unlink(f.name)
        text = out.getvalue()
        self.assertIn("GEMMs (cuBLASLt)", text)
        self.assertEqual(text.count("2.00x"), 7, text)  # six classes with a bound and the step


if __name__ == "__main__":
    unittest.main()
