#!/usr/bin/env python3
"""The depth study at scale (tools/experiments/depth_study.py --study scale, issue 31).

1. The grid's rule, on made-up losses: the sweep comes first; the depths wait for its
   winner and take each scheme's own; the deepest depth's sweep brackets that winner
   and its cells take their own winner; Mix-LN and Post-LN follow Pre-LN's rate.
2. The page's answers (depth_scale_doc.py) on records whose figures are worked out here,
   and its figures measured without a GPU from their records.
The miniature grid end to end on the CPU is tests/python/test_scale_pipeline.py (a slice of the
real corpus, the grid, the cross-check, the records and the page).
"""
import json
import math
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "experiments"))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import depth_study  # noqa: E402
import kept_folder  # noqa: E402  (a failed test keeps its folder and shows its runs' logs)


class ScaleGrid(unittest.TestCase):
    def test_the_sweeps_decide_the_rates(self):
        cells = depth_study.grid("scale")  # nothing finished: the sweep only
        names = [depth_study.run_name(c) for c in cells]
        self.assertEqual(len(cells), 6)
        self.assertEqual(names[0], "w512_L12_pre_lr1e-03_s800_seed1")
        self.assertEqual({c["lr"] for c in cells}, {1e-3, 2e-3, 4e-3})
        # 12-block sweep: Pre-LN best at 2e-3, LNS at 4e-3 (a tie at 1e-3 would go to the smaller)
        sweep = {("pre", 1e-3): 4.1, ("pre", 2e-3): 4.0, ("pre", 4e-3): math.inf,
                 ("lns", 1e-3): 4.2, ("lns", 2e-3): 4.0, ("lns", 4e-3): 3.9}
        loss = lambda c: sweep.get((c["scheme"], c["lr"])) if c["layers"] == 12 and c["seed"] == 1 else None
        cells = depth_study.grid("scale", loss)
        by = {(c["group"], c["layers"], c["scheme"], c["seed"]): c for c in cells}
        for seed in (1, 2, 3):
            self.assertEqual(by[("depth", 24, "pre", seed)]["lr"], 2e-3)
            self.assertEqual(by[("depth", 24, "lns", seed)]["lr"], 4e-3)
            self.assertEqual(by[("schemes", 24, "mix", seed)]["lr"], 2e-3)
            self.assertEqual(by[("schemes", 24, "post", seed)]["lr"], 2e-3)
        # seed 1 at 12 blocks at the winner is the sweep's own cell (one run, named once)
        names = [depth_study.run_name(c) for c in cells]
        self.assertEqual(len(names), len(set(names)))
        self.assertEqual(names.count("w512_L12_lns_lr4e-03_s800_seed1"), 1)
        deep = sorted((c["scheme"], c["lr"]) for c in cells if c["layers"] == 48)
        self.assertEqual(deep, [("lns", 2e-3), ("lns", 4e-3), ("lns", 8e-3), ("pre", 1e-3), ("pre", 2e-3),
                                ("pre", 4e-3)])
        self.assertFalse(any(c["group"] == "depth" and c["layers"] == 48 for c in cells))  # waits on its sweep
        # 48-block sweep: Pre-LN moves down to 1e-3, LNS stays
        deep_loss = {("pre", 1e-3): 4.5, ("pre", 2e-3): 4.6, ("pre", 4e-3): 4.9,
                     ("lns", 2e-3): 4.3, ("lns", 4e-3): 4.2, ("lns", 8e-3): 4.4}
        loss2 = lambda c: deep_loss.get((c["scheme"], c["lr"])) if c["layers"] == 48 and c["seed"] == 1 else loss(c)
        cells = depth_study.grid("scale", loss2)
        names = {depth_study.run_name(c) for c in cells}
        for seed in (1, 2, 3):  # seed 1's is the sweep's own cell
            self.assertIn("w512_L48_pre_lr1e-03_s800_seed%d" % seed, names)
            self.assertIn("w512_L48_lns_lr4e-03_s800_seed%d" % seed, names)
        self.assertEqual(sorted((c["scheme"], c["lr"]) for c in cells if c["layers"] == 48 and c["seed"] > 1),
                         [("lns", 4e-3), ("lns", 4e-3), ("pre", 1e-3), ("pre", 1e-3)])
        shape = depth_study.SHAPES["w512"]
        tokens = shape["seq"] * shape["batch"] * depth_study.SCALE_STEPS["w512"]
        self.assertGreaterEqual(tokens, 50_000_000)  # the budget per cell
        self.assertEqual(shape["intermediate"] % 64, 0)
        self.assertEqual(shape["hidden"] // shape["heads"], 64)

    def test_grid_and_study_must_agree(self):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "experiments", "depth_study.py"),
                            "--study", "scale", "--grid", "full", "--list"], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--grid=full is not a grid of --study=scale (scale, scale_mini)", r.stderr)


# The miniature grid end to end on the CPU: tests/python/test_scale_pipeline.py (a slice of the real corpus).


def write_record(folder, cell, loss, drop, variance, spread=True):
    os.makedirs(folder, exist_ok=True)
    L = cell["layers"]
    rec = dict(cell=cell, status="ok", loss=loss, drop_pct=drop, angular=[0.1] * L, variance=variance,
               curve=[[1, loss + 1.0]], device="cuda", seconds=1.0, jobs=1)
    if cell.get("shape"):  # which validation tokens: spread over the file (depth_study's width-512 shapes)
        rec["eval"] = dict(tokens=131072, spread=spread)
    with open(os.path.join(folder, depth_study.run_name(cell) + ".json"), "w") as f:
        json.dump(rec, f)


class ScaleDoc(kept_folder.KeptFolderTest):
    """tools/experiments/depth_scale_doc.py on records whose figures are worked out here."""

    def test_answers_from_records(self):
        import depth_scale_doc
        tmp = self.work
        w64, w512 = os.path.join(tmp, "w64"), os.path.join(tmp, "w512")
        L = 12
        c = lambda scheme, seed, lr, shape=None: depth_study.cell("depth", L, scheme, seed, lr=lr,
                                                                steps=800 if shape else 400, shape=shape)
        # width 512: Pre-LN's 3-seed rate 2e-3 (its 1-seed 1e-3 does not count), LNS's 4e-3
        write_record(w512, c("pre", 1, 1e-3, "w512"), 3.9, [1.0] * L, [1.0] * L)
        write_record(w512, c("lns", 1, 2e-3, "w512"), 3.6, [1.0] * L, [1.0] * L)
        for seed, lp, ll in ((1, 4.0, 3.7), (2, 4.1, 3.75), (3, 4.2, 3.8)):
            write_record(w512, c("pre", seed, 2e-3, "w512"), lp, [50.0] * 6 + [1.0] * 6,
                         [1.0 + 9.0 * i / (L - 1) for i in range(L)])
            write_record(w512, c("lns", seed, 4e-3, "w512"), ll, [40.0] * 6 + [3.0] * 6,
                         [1.0 + 1.0 * i / (L - 1) for i in range(L)])
        # width 64: one seed a side, LNS higher
        write_record(w64, c("pre", 1, 2e-3), 5.0, [10.0] * L, [1.0] * L)
        write_record(w64, c("lns", 1, 2e-3), 5.1, [12.0] * L, [2.0] * L)
        doc = os.path.join(tmp, "page.md")
        with open(doc, "w") as f:
            f.write("# P\n<!-- depth_scale:begin -->\nold\n<!-- depth_scale:end -->\nafter\n")
        cross = os.path.join(tmp, "crosscheck.json")
        self.assertEqual(depth_scale_doc.main(["--width64", w64, "--scale", w512, "--doc", doc,
                                               "--crosscheck", cross, "--measured", os.path.join(tmp, "none")]), 0)
        with open(doc) as f:
            self.assertIn("Not run yet: `STAGES=crosscheck", f.read())
        # the cross-check's record (scale_crosscheck.py's fields) as a table
        rows = [dict(step=s, cpu_loss=l, cuda_loss=l + g, gap=g, rel_gap=abs(g) / l, cpu_grad_norm=1.5,
                     cuda_grad_norm=1.5 + g) for s, l, g in ((1, 10.5, 0.002), (2, 10.25, -0.004))]
        with open(cross, "w") as f:
            json.dump(dict(name="w512_L12_pre_lr2e-03_s800_seed1", steps=2, date="2026-11-28", cpu_threads=16,
                           seconds=dict(cpu=50.0, cuda=3.0), rows=rows, max_rel_gap=0.004 / 10.25), f)
        self.assertEqual(depth_scale_doc.main(["--width64", w64, "--scale", w512, "--doc", doc,
                                               "--crosscheck", cross, "--measured", os.path.join(tmp, "none")]), 0)
        with open(doc) as f:
            page = f.read()
        self.assertIn("`w512_L12_pre_lr2e-03_s800_seed1`, its first 2 steps from the same weights and batches, "
                      "2026-11-28 (CPU: 16 threads, 50 s; CUDA: 3 s). Largest |gap|: **0.039%** of the CPU loss.",
                      page)
        self.assertIn("| 2 | 10.25000 | 10.24600 | -0.00400 (0.039%) | 1.5000 / 1.4960 |", page)
        self.assertNotIn("\nold\n", page)
        self.assertTrue(page.endswith("<!-- depth_scale:end -->\nafter\n"))
        # Q1: 3.75 - 4.1 = -0.35; Welch: variances 0.01 and 0.0025 over 3 seeds each, so
        # se = sqrt(0.0125 / 3) = 0.0645, t = -5.42, df = (0.0125/3)^2 / ((0.01/3)^2/2 + (0.0025/3)^2/2) = 50/17
        import study_stats
        t, df = -0.35 / math.sqrt(0.0125 / 3), 50.0 / 17.0
        p = study_stats.fmt_p(study_stats.t_sf2(t, df))
        self.assertIn("| 12 | 0.002 | 4.1000 ± 0.1000 (3) | 0.004 | 3.7500 ± 0.0500 (3) | -0.3500 | 0.0645 | "
                      "t = -5.42, df 2.9 | -0.3500 (3), yes | **significant** (p = %s) |" % p, page)
        # Q2: the deep half costs 1.0% under Pre-LN and 3.0% under LNS on every seed (no spread)
        self.assertIn("| 12 | 1.00 ± 0.00 (3) | 3.00 ± 0.00 (3) | +2.00 | **significant** (p = <0.001) | "
                      "50.00 ± 0.00 (3) | 40.00 ± 0.00 (3) |", page)
        # Q3: variance growth 10 against 2
        self.assertIn("| 12 | 10.00 ± 0.00 (3) | 2.00 ± 0.00 (3) | **significant** (p = <0.001) |", page)
        # Q4: both widths in one line each; one depth: no trend to state
        self.assertIn("| Q1 loss, LNS against Pre-LN | LNS lower at 0 of 1 depths (0 significant, Welch p < 0.05); "
                      "fewer than 2 depths with both schemes at their best rate, no trend yet (gaps 12: +0.100) | "
                      "LNS lower at 1 of 1 depths (1 significant, Welch p < 0.05); fewer than 2 depths with both "
                      "schemes at their best rate, no trend yet (gaps 12: -0.350) |", page)
        self.assertIn("costs more under LNS at 1 of 1 depths (12: +2.00%, p = <0.001)", page)
        self.assertIn("| 12 | 10.00 (1) | 12.00 (1) | +2.00 | one seed: no test |", page)
        # the evaluation sample and the budget, from the records and the cells
        self.assertIn("- width 512: 131,072 tokens spread over the whole validation file (8 records).", page)
        self.assertIn("- width 64: not recorded in 2 records", page)
        # width 512, 12 blocks: 32768 x 512 x 2 + 512 + 12 x (4 x 512^2 + 3 x 512 x 1408 + 2 x 512)
        # = 33,554,944 + 12 x 3,212,288 = 72,102,400 parameters; 800 x 128 x 512 = 52,428,800 tokens
        self.assertIn("| width 512, vocabulary 32768 | 12 | 800 | 72,102,400 | 52,428,800 | 0.73 |", page)
        self.assertIn("| the paper's 130m (`configs/130m_lns.flags`) | | | 134,105,856 | 2,621,440,000 | 19.5 |",
                      page)
        # a width-512 record evaluated on the first tokens only is refused in one line
        write_record(w512, c("pre", 4, 2e-3, "w512"), 4.0, [1.0] * L, [1.0] * L, spread=False)
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "experiments", "depth_scale_doc.py"),
                            "--width64", w64, "--scale", w512, "--doc", doc], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertIn("w512_L12_pre_lr2e-03_s800_seed4.json: evaluated on the first validation tokens", r.stderr)
        os.remove(os.path.join(w512, "w512_L12_pre_lr2e-03_s800_seed4.json"))
        # a page without the markers is refused in one line and left as it was
        bad = os.path.join(tmp, "bad.md")
        with open(bad, "w") as f:
            f.write("# no markers\n")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "experiments", "depth_scale_doc.py"),
                            "--width64", w64, "--scale", w512, "--doc", bad], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertIn("needs one '<!-- depth_scale:begin -->' line", r.stderr)

    def test_measured_without_a_gpu(self):
        """The page's figures on the CPU's speed at width 512 and on the emulated cross-check
        come from their records; a record missing one of them is refused in one line."""
        import depth_scale_doc
        m = os.path.join(self.work, "measurements")
        os.makedirs(m)
        self.assertEqual(depth_scale_doc.measured_section(m)[1], "No measurement recorded in `%s`." % m)
        cell = depth_study.cell("depth", 12, "pre", 1, lr=2e-3, steps=800, shape="w512")
        rows = [dict(step=1, loss=10.5, grad_norm=2.0, step_time_s=160.0, tokens_per_s=409.6),
                dict(step=2, loss=10.25, grad_norm=1.9, step_time_s=140.0, tokens_per_s=468.1)]
        with open(os.path.join(m, "cpu_steps.json"), "w") as f:
            json.dump(dict(kind="cpu_steps", cell=cell, name="w512_L12_x", steps=2, cpu_threads=2, cores=2, nice=19,
                           seconds=300.0, rows=rows, date="2026-11-29"), f)
        emu = [dict(step=1, cpu_loss=5.5, cuda_loss=5.5005, gap=0.0005, rel_gap=0.0005 / 5.5, grad_norm_rel=0.003),
               dict(step=2, cpu_loss=5.4, cuda_loss=5.4, gap=0.0, rel_gap=0.0, grad_norm_rel=0.012)]
        with open(os.path.join(m, "crosscheck_emulated.json"), "w") as f:
            json.dump(dict(kind="crosscheck", cuda_on="emulator", name="mini_x", steps=2, date="2026-11-29",
                           rows=emu, max_rel_gap=0.0005 / 5.5), f)
        text = "\n".join(depth_scale_doc.measured_section(m))
        # 800 steps at the mean step time of 150 s: 33.3 hours; ln 32768 = 10.397
        self.assertIn("`w512_L12_x`'s first 2 steps on 2 cores (2 threads, nice 19) took 160 s, 140 s (410 to 468 "
                      "tokens/s), with losses 10.5000, 10.2500 against ln 32768 = 10.397 at initialisation; at their "
                      "mean step time its 800 steps would take about 33 hours", text)
        self.assertIn("`mini_x`, 2 steps; the largest |gap| is 0.009% of the CPU loss and the gradient norms differ "
                      "by 1.20% at most.", text)
        # a record without a figure, or of another kind, is refused
        del rows[1]["tokens_per_s"]
        with open(os.path.join(m, "cpu_steps.json"), "w") as f:
            json.dump(dict(kind="cpu_steps", cell=cell, name="w512_L12_x", steps=2, cpu_threads=2, cores=2, nice=19,
                           seconds=300.0, rows=rows, date="2026-11-29"), f)
        with self.assertRaises(depth_scale_doc.DocError) as e:
            depth_scale_doc.measured_section(m)
        self.assertIn("a record without a figure the page gives ('tokens_per_s')", str(e.exception))
        os.remove(os.path.join(m, "cpu_steps.json"))
        with open(os.path.join(m, "crosscheck_emulated.json"), "w") as f:
            json.dump(dict(kind="crosscheck", cuda_on="gpu", name="mini_x", steps=2, date="2026-11-29", rows=emu,
                           max_rel_gap=0.0), f)
        with self.assertRaises(depth_scale_doc.DocError) as e:
            depth_scale_doc.measured_section(m)
        self.assertIn("whose CUDA side ran on the emulator", str(e.exception))


if __name__ == "__main__":
    unittest.main()
