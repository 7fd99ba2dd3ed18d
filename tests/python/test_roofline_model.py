#!/usr/bin/env python3
"""tools/perf roofline model against values computed by hand from the 1B config.

Every expected number below is written out from the shapes (configs/1b_lns.flags:
V=32000, C=2048, L=24, 32/32 heads, F=5461, T=256, global batch 512; the hand values
take micro-batch 8 -> N=2048 tokens) and the H100's data-sheet peaks, not taken from
the model.
"""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "perf"))

from devices import device  # noqa: E402
from flags import read_flagfile  # noqa: E402
from step_model import (BEFORE, Impl, StepModel, chosen_micro_batch,  # noqa: E402
                        largest_micro_batch, shape_from_flags)

FLAGS_1B = os.path.join(ROOT, "configs", "1b_lns.flags")
H100 = device("h100")
V, C, L, F, T, B = 32000, 2048, 24, 5461, 256, 8
N = B * T
# q, k, v, o: 4 C^2; gate, up, down: 3 C F; plus the LM head V C
MATMUL = L * (4 * C * C + 3 * C * F) + V * C
assert MATMUL == 1_273_446_400
# + embedding, + 2 RMSNorm gains a layer, + the final norm
PARAMS = 2 * V * C + L * (4 * C * C + 3 * C * F + 2 * C) + C
assert PARAMS == 1_339_082_752


def model(impl=BEFORE, dp=8, micro=B, eff=1.0):
    return StepModel(shape_from_flags(read_flagfile(FLAGS_1B), micro), impl, H100, dp, eff)


class RooflineModel(unittest.TestCase):
    def test_gemm_flops(self):
        m = model()
        # 6 N per matmul parameter; attention: forward QK^T, PV (2 x 2NTC), backward
        # recomputed QK^T, dP, dV, dQ, dK (5 x 2NTC) per layer
        want = 6 * N * MATMUL + 14 * L * N * T * C
        self.assertEqual(m.gemm_flops(), want)
        self.assertAlmostEqual(want / 1e12, 16.009, places=3)
        # MFU counts the trainer's figure: 6 x matmul + 12 L C T per token
        self.assertEqual(m.model_flops_micro_batch(), N * (6 * MATMUL + 12 * L * C * T))

    def test_kernel_bytes_and_time(self):
        m = model()
        first_norm = next(k for k in m.kernels if k.name == "norm")
        self.assertEqual(first_norm.bytes, 2 * 2 * N * C + 4 * N)  # x in, u out (bf16), rstd f32
        head = next(k for k in m.kernels if k.name == "lm_head")
        self.assertEqual(head.flops, 2 * N * V * C)
        self.assertEqual(head.bytes, 2 * (N * C + V * C + N * V))
        self.assertAlmostEqual(m.t(head), 2 * N * V * C / 989e12, delta=1e-12)  # compute-bound
        dw = next(k for k in m.kernels if k.name == "down_proj.dw")
        self.assertEqual(dw.bytes, 2 * (C * N + N * F) + 2 * 4 * C * F)  # f32 gradient read + written
        swiglu = next(k for k in m.kernels if k.name == "swiglu")
        self.assertAlmostEqual(m.t(swiglu), 3 * 2 * N * F / 3350e9, delta=1e-12)  # memory-bound
        # the micro-batch bound is the sum of per-kernel rooflines
        total = sum(max(k.flops / 989e12, k.bytes / 3350e9) for k in m.kernels)
        self.assertAlmostEqual(m.micro_batch_time(), total, delta=1e-12)

    def test_unaligned_pitch(self):
        mis = {k.name for k in model().kernels if k.misaligned}
        # 5461 x 2 bytes is not a multiple of 16: exactly the GEMMs that touch F
        self.assertEqual(mis, {"gate_proj", "up_proj", "down_proj", "gate_proj.dx", "gate_proj.dw",
                               "up_proj.dx", "up_proj.dw", "down_proj.dx", "down_proj.dw"})
        padded = model(Impl(pad_ld=True))
        self.assertFalse(any(k.misaligned for k in padded.kernels))
        gate = next(k for k in padded.kernels if k.name == "gate_proj")
        self.assertEqual(gate.flops, 2 * N * 5504 * C)  # padded columns are computed
        # with a penalty on unaligned GEMMs, 3 x 3 x 24 GEMMs of 2NCF FLOPs slow down
        slow, fast = model(eff=0.6), model(eff=1.0)
        extra = 9 * L * 2 * N * C * F / 989e12 * (1 / 0.6 - 1)
        self.assertAlmostEqual(slow.micro_batch_time() - fast.micro_batch_time(), extra, delta=1e-9)

    def test_fused_residual_saves_three_passes(self):
        # pre-norm: copy (2 passes) + axpby (3) + norm (2) -> fused add + norm (4), per sublayer
        saved = model().other_bytes() - model(Impl(fused_residual=True)).other_bytes()
        self.assertEqual(saved, 2 * L * 3 * 2 * N * C)

    def test_causal_softmax_backward(self):
        saved = model().other_bytes() - model(Impl(causal_softmax_bwd=True)).other_bytes()
        masked = T * T - T * (T + 1) // 2
        self.assertEqual(saved, L * 2 * 4 * B * 32 * masked)  # S and dP (f32) above the diagonal

    def test_step(self):
        m = model()
        self.assertEqual(m.num_micro(), 512 // (8 * 8))
        self.assertEqual(m.optimizer_bytes(), 38 * PARAMS)
        ar = 2 * 7 / 8 * 4 * PARAMS / 450e9
        self.assertAlmostEqual(m.comm_time()[0], ar, delta=1e-12)
        want = 8 * m.micro_batch_time() + 38 * PARAMS / 3350e9 + max(0.0, ar - m.backward_time())
        self.assertAlmostEqual(m.step_time(), want, delta=1e-12)
        sharded = model(Impl(sharded_adamw=True))
        self.assertAlmostEqual(sharded.optimizer_bytes(), 4 * PARAMS + 34 * PARAMS / 8, delta=1)
        # pieces reduced to their owners: each f32 byte once over a link (hidden by backward);
        # then the bf16 weights and the f32 gains (2 a layer + the final norm) all-gathered
        self.assertAlmostEqual(sharded.comm_time()[0], 4 * PARAMS / 450e9, delta=1e-12)
        gains = (2 * L + 1) * C
        self.assertAlmostEqual(sharded.comm_time()[1], 7 / 8 * (2 * PARAMS + 4 * gains) / 450e9, delta=1e-12)
        self.assertGreater(sharded.mfu_step(), m.mfu_step())
        one = model(dp=1)
        self.assertEqual(one.comm_time(), (0.0, 0.0))
        self.assertEqual(one.num_micro(), 64)

    def test_memory(self):
        mem = model().memory()
        self.assertEqual(mem["weights (f32 master + bf16 copy)"], 6 * PARAMS)
        self.assertEqual(mem["gradients (f32)"], 4 * PARAMS)
        self.assertEqual(mem["optimizer state (m, v)"], 8 * PARAMS)
        # per layer: x->u, f, r for both sublayers (6 [N,C]), q k v ctx (4 [N,C]), gate up act
        # (3 [N,F]) in bf16; lse [B,H,T] and two rstd [N] in f32
        per_layer = 2 * (10 * N * C + 3 * N * F) + 4 * (N * 32 + 2 * N)
        # h0, final-norm output, logits (bf16); ids, final rstd (RMSNorm: no mean), targets,
        # losses and four loss statistics (row max, this rank's max, sum-exp, target logit)
        head = 2 * (2 * N * C + N * V) + 4 * 8 * N
        self.assertEqual(mem["activations"], L * per_layer + head)
        sharded = model(Impl(sharded_adamw=True)).memory()
        self.assertAlmostEqual(sharded["optimizer state (m, v)"], 8 * PARAMS / 8, delta=1)
        self.assertEqual(sharded["weights (f32 master + bf16 copy)"], 6 * PARAMS)  # whole master kept

    def test_micro_batch_choice(self):
        shape = shape_from_flags(read_flagfile(FLAGS_1B))
        big = largest_micro_batch(shape, BEFORE, H100, 8)
        self.assertEqual(big, 64)  # 64 sequences a rank; ~52 GiB of 80
        small = device("a100")
        tiny = type(small)("toy 24GiB", small.bf16_tflops, small.hbm_gbs, 24.0, small.link_gbs)
        # 22 GiB of state leaves no room on 24 GiB (2 GiB reserved): nothing fits
        self.assertIsNone(largest_micro_batch(shape, BEFORE, tiny, 8))
        chosen = chosen_micro_batch(shape, BEFORE, H100, 8)
        self.assertEqual(chosen, shape.B)  # the 1B flagfile follows the rule
        m = model(micro=chosen)
        self.assertTrue(m.fits())
        for k in m.kernels:
            if k.gemm and k.part in ("qkvo", "mlp", "head"):
                self.assertGreaterEqual(k.flops / k.bytes, 2 * H100.ridge, k.name)

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "--global_batch_size"):
            model(dp=3)
        with self.assertRaisesRegex(ValueError, "--flagfile: cannot read"):
            read_flagfile("/nonexistent/x.flags")
        with tempfile.NamedTemporaryFile("w", suffix=".flags", delete=False) as f:
            f.write("--hidden_size=abc\n")
        try:
            with self.assertRaisesRegex(ValueError, "--hidden_size: expected an integer"):
                shape_from_flags(read_flagfile(f.name))
        finally:
            os.unlink(f.name)
        cli = [sys.executable, os.path.join(ROOT, "tools", "perf", "roofline.py")]
        r = subprocess.run(cli + [f"--flagfile={FLAGS_1B}", "--gpu=v100"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr.strip().count("\n"), 0)
        self.assertIn("--gpu", r.stderr)
        r = subprocess.run(cli + [f"--flagfile={FLAGS_1B}", "--dp=8", "--kernels"], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("projected", r.stdout)


if __name__ == "__main__":
    unittest.main()
