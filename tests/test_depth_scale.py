#!/usr/bin/env python3
"""The depth study at scale (tools/experiments/depth_study.py --study scale, issue 31).

1. The grid's rule, on made-up losses: the sweep comes first; the depths wait for its
   winner and take each scheme's own; the deepest depth's sweep brackets that winner
   and its cells take their own winner; Mix-LN and Post-LN follow Pre-LN's rate.
3. The page's answers (depth_scale_doc.py) on records whose figures are worked out here.
2. The miniature grid end to end on the CPU (LNS_TRAIN_BIN, LNS_EVAL_BIN): a corpus made
   by real_corpus.py from a package built here, then every cell trained, evaluated and
   recorded in one invocation (the waiting cells are added as their sweeps finish), the
   rates checked against the recorded losses, and a second invocation with nothing left.
"""
import json
import math
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "experiments"))
sys.path.insert(0, HERE)
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


@unittest.skipUnless(os.environ.get("LNS_TRAIN_BIN") and os.environ.get("LNS_EVAL_BIN"),
                     "set LNS_TRAIN_BIN and LNS_EVAL_BIN (ctest does)")
class ScaleMiniEndToEnd(kept_folder.KeptFolderTest):
    def test_mini_grid_runs_and_resumes(self):
        try:
            import tokenizers  # noqa: F401
        except ImportError:
            self.skipTest("needs the tokenizers package")
        import test_real_corpus as trc
        tmp = self.work
        cache = os.path.join(tmp, "cache")
        os.makedirs(os.path.join(cache, "pkg"))
        trc.make_deb(tmp, os.path.join(cache, "pkg"))
        trc.make_wheel(os.path.join(cache, "pkg"))
        src = os.path.join(tmp, "sources.json")
        with open(src, "w") as f:
            json.dump(trc.SOURCES, f)
        data = os.path.join(tmp, "mini")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "experiments", "real_corpus.py"),
                            "--sources", src, "--cache", cache, "--offline", "--out", data, "--vocab", "300",
                            "--val_fraction", "0.3", "--min_chars", "100"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        bindir = os.path.join(tmp, "bin")
        os.makedirs(bindir)
        for name in ("LNS_TRAIN_BIN", "LNS_EVAL_BIN"):
            os.symlink(os.environ[name], os.path.join(bindir, os.path.basename(os.environ[name])))
        out, rec = os.path.join(tmp, "runs"), os.path.join(tmp, "records")
        cmd = [sys.executable, os.path.join(ROOT, "tools", "experiments", "depth_study.py"), "--study", "scale",
               "--grid", "scale_mini", "--data", data, "--vocab", "300", "--bin", bindir, "--out", out,
               "--record", rec, "--jobs", "2", "--threads", "1"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        loss = lambda c: depth_study.finished_loss(c, out, rec)
        cells = depth_study.grid("scale_mini", loss)
        self.assertEqual(len(cells), 24)
        for c in cells:
            self.assertTrue(os.path.exists(os.path.join(rec, depth_study.run_name(c) + ".json")),
                            depth_study.run_name(c))
        # every depth runs at the rate its sweep's recorded losses chose
        sweep = [c for c in cells if c["group"] == "lr" and c["layers"] == 2]
        best = depth_study.best_rates(sweep, loss)
        for c in cells:
            if c["group"] == "depth" and c["layers"] in (2, 3):
                self.assertEqual(c["lr"], best[c["scheme"]], depth_study.run_name(c))
        deep = depth_study.best_rates([c for c in cells if c["group"] == "lr" and c["layers"] == 4], loss)
        for c in cells:
            if c["group"] == "depth" and c["layers"] == 4:
                self.assertEqual(c["lr"], deep[c["scheme"]])
        # a record holds the layer-removal sweep: one entry per block
        with open(os.path.join(rec, depth_study.run_name(cells[-1]) + ".json")) as f:
            some = json.load(f)
        self.assertEqual(len(some["drop_pct"]), cells[-1]["layers"])
        # the same command again has nothing to do
        r = subprocess.run(cmd + ["--list"], capture_output=True, text=True)
        self.assertIn("24 cells, 0 to run", r.stdout)


def write_record(folder, cell, loss, drop, variance):
    os.makedirs(folder, exist_ok=True)
    L = cell["layers"]
    rec = dict(cell=cell, status="ok", loss=loss, drop_pct=drop, angular=[0.1] * L, variance=variance,
               curve=[[1, loss + 1.0]], device="cuda", seconds=1.0, jobs=1)
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
                                               "--crosscheck", cross]), 0)
        with open(doc) as f:
            self.assertIn("Not run yet: `STAGES=crosscheck", f.read())
        # the cross-check's record (scale_crosscheck.py's fields) as a table
        rows = [dict(step=s, cpu_loss=l, cuda_loss=l + g, gap=g, rel_gap=abs(g) / l, cpu_grad_norm=1.5,
                     cuda_grad_norm=1.5 + g) for s, l, g in ((1, 10.5, 0.002), (2, 10.25, -0.004))]
        with open(cross, "w") as f:
            json.dump(dict(name="w512_L12_pre_lr2e-03_s800_seed1", steps=2, date="2026-11-28", cpu_threads=16,
                           seconds=dict(cpu=50.0, cuda=3.0), rows=rows, max_rel_gap=0.004 / 10.25), f)
        self.assertEqual(depth_scale_doc.main(["--width64", w64, "--scale", w512, "--doc", doc,
                                               "--crosscheck", cross]), 0)
        with open(doc) as f:
            page = f.read()
        self.assertIn("`w512_L12_pre_lr2e-03_s800_seed1`, its first 2 steps from the same weights and batches, "
                      "2026-11-28 (CPU: 16 threads, 50 s; CUDA: 3 s). Largest |gap|: **0.039%** of the CPU loss.",
                      page)
        self.assertIn("| 2 | 10.25000 | 10.24600 | -0.00400 (0.039%) | 1.5000 / 1.4960 |", page)
        self.assertNotIn("\nold\n", page)
        self.assertTrue(page.endswith("<!-- depth_scale:end -->\nafter\n"))
        # Q1: 3.75 - 4.1 = -0.35; the ranges [3.7, 3.8] and [4.0, 4.2] are apart
        self.assertIn("| 12 | 0.002 | 4.1000 ± 0.1000 (3) | 0.004 | 3.7500 ± 0.0500 (3) | -0.3500 | 0.0645 | "
                      "-0.3500 (3), yes | **beyond the spread** |", page)
        # Q2: the deep half costs 1.0% under Pre-LN and 3.0% under LNS on every seed
        self.assertIn("| 12 | 1.00 ± 0.00 (3) | 3.00 ± 0.00 (3) | +2.00 | **beyond the spread** | "
                      "50.00 ± 0.00 (3) | 40.00 ± 0.00 (3) |", page)
        # Q3: variance growth 10 against 2
        self.assertIn("| 12 | 10.00 ± 0.00 (3) | 2.00 ± 0.00 (3) | **beyond the spread** |", page)
        # Q4: both widths in one line each
        self.assertIn("| Q1 loss, LNS against Pre-LN | LNS lower at 0 of 1 depths (0 beyond the spread); one "
                      "depth, no trend yet (12: +0.100) | LNS lower at 1 of 1 depths (1 beyond the spread); one "
                      "depth, no trend yet (12: -0.350) |", page)
        self.assertIn("costs more under LNS at 1 of 1 depths (12: +2.00% apart)", page)
        self.assertIn("| 12 | 10.00 (1) | 12.00 (1) | +2.00 | one seed |", page)
        # a page without the markers is refused in one line and left as it was
        bad = os.path.join(tmp, "bad.md")
        with open(bad, "w") as f:
            f.write("# no markers\n")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "experiments", "depth_scale_doc.py"),
                            "--width64", w64, "--scale", w512, "--doc", bad], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertIn("needs one '<!-- depth_scale:begin -->' line", r.stderr)


if __name__ == "__main__":
    unittest.main()
