#!/usr/bin/env python3
"""tools/experiments/depth_report.py and depth_doc.py on a synthetic study whose
statistics are computed by hand here; bad run files are refused with one line; the
study's grid is unique, in priority order, and names each cell apart."""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
EXP = os.path.join(HERE, "..", "..", "tools", "experiments")
sys.path.insert(0, EXP)
import depth_doc  # noqa: E402
import depth_report  # noqa: E402
import depth_study  # noqa: E402
import study_stats  # noqa: E402


def p_df2(t):
    """Two-sided tail of Student's t with 2 degrees of freedom, closed form."""
    return 1 - abs(t) / math.sqrt(2 + t * t)


def p_df4(t):
    """Two-sided tail of Student's t with 4 degrees of freedom, closed form:
    F(t) = 1/2 + (3/4) u (1 - u^2 / 3) with u = t / sqrt(4 + t^2)."""
    u = abs(t) / math.sqrt(4 + t * t)
    return 1 - 2 * 0.75 * u * (1 - u * u / 3)

# Per seed: validation loss, relative_drop per block (fractions), variance per block.
PRE = {1: (5.0, [1.0, 0.2, 0.1, 0.3], [0.1, 0.2, 0.3, 0.4]),
       2: (5.2, [3.0, 0.4, 0.1, 0.1], [0.2, 0.4, 0.6, 1.0]),
       3: (5.1, [2.0, 0.3, 0.4, 0.2], [0.5, 1.0, 2.0, 3.0])}
LNS = {1: (4.8, [1.0, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.1]),
       2: (4.9, [1.0, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.2]),
       3: (4.7, [1.0, 0.1, 0.1, 0.1], [0.1, 0.1, 0.2, 0.3])}
MIX = {1: (5.05, [0.1] * 4, [1.0] * 4), 2: (5.25, [0.1] * 4, [1.0] * 4)}
LNS_LR4 = {1: (4.75, [0.5] * 4, [0.1] * 4)}


def write_run(root, scheme, seed, loss, drops, variance, lr=2e-3, status="ok", layers=4, seconds=10.0, device=None,
              steps=400):
    c = depth_study.cell("depth", layers, scheme, seed, lr=lr, steps=steps)
    d = os.path.join(root, depth_study.run_name(c))
    os.makedirs(d)
    with open(os.path.join(d, "cell.json"), "w") as f:
        json.dump(c, f)
    with open(os.path.join(d, "result.json"), "w") as f:
        json.dump(dict(c, status=status, seconds=seconds, **({"device": device} if device else {})), f)
    if status != "ok":
        return d
    ev = {"num_layers": layers, "loss": loss, "ppl": math.exp(loss), "norm_scheme": scheme,
          "sweep": {"layers": [{"layer": l, "relative_drop": r} for l, r in enumerate(drops)]},
          "diag": [{"layer": l, "variance": v, "angular_distance": 0.1 * (l + 1)} for l, v in enumerate(variance)]}
    with open(os.path.join(d, "eval.json"), "w") as f:
        json.dump(ev, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        # step 100 twice: a resumed run repeats steps; the last line counts
        for step, v in ((100, 9.0), (100, 6.0), (200, loss)):
            f.write(json.dumps({"step": step, "val_loss": v}) + "\n")
        f.write('{"step": 300, "val_lo')  # a line cut short by a stop
    return d


def synthetic(root):
    for table, scheme, lr in ((PRE, "pre", 2e-3), (LNS, "lns", 2e-3), (MIX, "mix", 2e-3), (LNS_LR4, "lns", 4e-3)):
        for seed, (loss, drops, var) in table.items():
            write_run(root, scheme, seed, loss, drops, var, lr=lr)
    write_run(root, "post", 1, None, None, None, status="diverged")


class DepthReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        synthetic(self.root)
        self.report = depth_report.build_report(depth_report.find_runs(self.root))
        self.cells = {(c["scheme"], c["lr"]): c for c in self.report["cells"]}

    def tearDown(self):
        self.tmp.cleanup()

    def test_mean_and_spread(self):
        pre = self.cells[("pre", 2e-3)]
        self.assertEqual(pre["n"], 3)
        self.assertEqual(pre["seeds"], [1, 2, 3])
        self.assertAlmostEqual(pre["mean"], 5.1, places=12)
        # deviations -0.1, 0.1, 0: sum of squares 0.02 over n - 1 = 2
        self.assertAlmostEqual(pre["std"], 0.1, places=12)
        self.assertEqual((pre["min"], pre["max"]), (5.0, 5.2))
        self.assertAlmostEqual(pre["ppl"], math.exp(5.1), places=9)
        mix = self.cells[("mix", 2e-3)]
        self.assertAlmostEqual(mix["std"], math.sqrt(0.02), places=12)  # 5.05, 5.25
        self.assertIsNone(self.cells[("lns", 4e-3)]["std"])  # one seed has no spread

    def test_comparisons(self):
        by = {(c["b"]): c for c in self.report["comparisons"]}
        lns = by[self.cells[("lns", 2e-3)]["name"]]
        self.assertAlmostEqual(lns["diff"], -0.3, places=12)
        self.assertAlmostEqual(lns["se"], math.sqrt(0.01 / 3 + 0.01 / 3), places=12)
        self.assertTrue(lns["beyond_spread"])  # lns max 4.9 < pre min 5.0
        mix = by[self.cells[("mix", 2e-3)]["name"]]
        self.assertAlmostEqual(mix["diff"], 0.05, places=12)
        self.assertAlmostEqual(mix["se"], math.sqrt(0.01 / 3 + 0.02 / 2), places=12)
        self.assertFalse(mix["beyond_spread"])  # [5.05, 5.25] overlaps [5.0, 5.2]
        # paired by seed: lns - pre = -0.2, -0.3, -0.4; mix - pre = +0.05, +0.05
        self.assertEqual(lns["paired"]["n"], 3)
        self.assertAlmostEqual(lns["paired"]["mean"], -0.3, places=12)
        self.assertAlmostEqual(lns["paired"]["std"], 0.1, places=12)
        self.assertTrue(lns["paired"]["same_sign"])
        self.assertEqual(mix["paired"]["n"], 2)
        self.assertAlmostEqual(mix["paired"]["mean"], 0.05, places=12)
        self.assertAlmostEqual(mix["paired"]["std"], 0.0, places=12)
        self.assertTrue(mix["paired"]["same_sign"])  # consistent by seed though the ranges overlap
        self.assertNotIn(self.cells[("lns", 4e-3)]["name"], by)  # no Pre-LN at that learning rate

    def test_per_block(self):
        pre = self.cells[("pre", 2e-3)]
        for got, want in zip(pre["drop_pct"], [200.0, 30.0, 20.0, 20.0]):
            self.assertAlmostEqual(got, want, places=9)
        self.assertAlmostEqual(pre["drop_shallow_half"], 115.0, places=9)
        self.assertAlmostEqual(pre["drop_deep_half"], 20.0, places=9)
        # growth last / first per seed: 4, 5, 6
        self.assertAlmostEqual(pre["variance_growth"], 5.0, places=12)
        for got, want in zip(pre["variance"], [0.8 / 3, 1.6 / 3, 2.9 / 3, 4.4 / 3]):
            self.assertAlmostEqual(got, want, places=12)
        self.assertAlmostEqual(pre["angular"][2], 0.3, places=12)
        self.assertEqual(pre["curves"]["1"], [(100, 6.0), (200, 5.0)])  # the repeated step: last wins

    def test_diverged_and_best_lr(self):
        post = self.cells[("post", 2e-3)]
        self.assertEqual((post["n"], post["diverged_seeds"]), (0, [1]))
        best = {b["scheme"]: b for b in self.report["best_lr"]}
        self.assertEqual(best["lns"]["lr"], 4e-3)  # 4.75 < mean 4.8
        self.assertEqual(best["lns"]["tried"], [2e-3, 4e-3])
        self.assertNotIn("pre", best)  # one learning rate: no sweep
        self.assertEqual(self.report["timing"]["runs"], 10)
        self.assertAlmostEqual(self.report["timing"]["block_steps"], 10 * 400 * (4 + depth_study.HEAD_BLOCKS))

    def test_doc_tables(self):
        md = depth_doc.tables(self.report, missing=[("session", ["L06_x"], 7200), ("full", ["L06_x", "L07_y"], 9000),
                                                    ("gpu", ["L06_x"], 150)])
        self.assertIn("Projected time for them at the measured rate, 2 jobs: 2 min.", md)  # under an hour: minutes
        # pre 5.0, 5.2, 5.1 against lns 4.8, 4.9, 4.7: variances 0.01 and 0.01, se sqrt(0.02/3),
        # Welch's df (2 * 0.01/3)^2 / (2 * (0.01/3)^2 / 2) = 4; paired -0.2, -0.3, -0.4: se 0.1/sqrt(3), df 2
        se = math.sqrt(0.02 / 3)
        tp = -0.3 / (0.1 / math.sqrt(3))
        self.assertIn("| 4 | 5.1000 +- 0.1000 (3) | 4.8000 +- 0.1000 (3) | -0.3000 ± %.4f | t = %.2f, df 4.0, p = %.2g "
                      "**significant** | -0.3000 ± %.4f (3 seeds, p = %.2g) | 164.0 | 121.5 | x5.00 | x2.00 | 20.00 | "
                      "10.00 |" % (se, -0.3 / se, p_df4(-0.3 / se), 0.1 / math.sqrt(3), p_df2(tp)), md)
        self.assertIn("| post | diverged (1) |", md)
        self.assertIn("Best learning rate of those tried (lowest mean): lns 0.004 (1 seed, the largest rate tried)", md)
        self.assertIn("Not run from the `session` grid (1 cells): `L06_x`.\n"
                      "Projected time for them at the measured rate, 2 jobs: 2.0 h.", md)
        self.assertIn("Not run from the `full` grid (2 cells).\nProjected time for them at the measured rate, 2 jobs: "
                      "2.5 h.", md)
        # the budget: 4 blocks of width 64, 4096 tokens, 400 steps of 16 x 128 tokens
        n = 2 * 4096 * 64 + 64 + 4 * (4 * 64 * 64 + 3 * 64 * 176 + 2 * 64)
        self.assertIn("| width 64, vocabulary 4096 | 4 | 400 | %s | 819,200 | %.2f |" % (format(n, ","), 819200 / n),
                      md)
        self.assertIn("Wall time of one run by blocks and steps (min-max over the recorded runs; a run resumed from its "
                      "checkpoint records its last part only): 4 blocks 400 steps "
                      "10-10 s (10 runs).", md)

    def test_findings(self):
        f = depth_doc.findings(self.report, "CPU (f32)")
        se = math.sqrt(0.02 / 3)
        self.assertIn("**LNS − Pre-LN at the shared rate 0.002** (one rate for both schemes; at the depths with a "
                      "sweep it is below both schemes' best): 4: -0.300 ± %.3f (p = %.2g); LNS significantly lower "
                      "at 1 of 1 depths, higher at 0." % (se, p_df4(-0.3 / se)), f)
        self.assertIn("fewer than 2 depths with a spread: no trend", f)  # one depth
        # variance growth per seed: pre 4, 5, 6; lns 1, 2, 3: Welch -3 ± sqrt(2/3), df 4
        self.assertIn("4: x5.00 / x2.00; LNS − Pre-LN significantly lower at 1 of 1 depths", f)
        self.assertAlmostEqual(depth_doc.welch(self.cells[("pre", 2e-3)], self.cells[("lns", 2e-3)],
                                               key="growth_by_seed")["t"], -3 / math.sqrt(2 / 3), places=12)
        # mix: 5.05, 5.25 against pre's 5.0, 5.2, 5.1 and lns's 4.8, 4.9, 4.7
        w = study_stats.welch([5.0, 5.2, 5.1], [5.05, 5.25])
        self.assertIn("mix − Pre-LN %+.3f ± %.3f (p = %.2g)" % (0.05, math.sqrt(0.01 / 3 + 0.02 / 2), w["p"]), f)
        self.assertIn("| Post-LN diverges at depth | 4 blocks: 1 of 1 seeds diverged | reproduced |", f)
        self.assertIn("| LNS reaches a lower loss than Mix-LN | shared rate: LNS − Mix-LN 4: ", f)

    def test_findings_trend_over_depths(self):
        """Three depths with gaps -0.1, -0.2, -0.3 (3 seeds a side): the slope on log2(depth)
        printed is the one study_stats.trend computes from the Welch differences and errors."""
        with tempfile.TemporaryDirectory() as t:
            for L, gap in ((2, -0.1), (4, -0.2), (8, -0.3)):
                for seed, (a, b) in enumerate(((5.0, 0.0), (5.2, 0.05), (5.1, -0.04)), 1):
                    write_run(t, "pre", seed, a, [0.1] * L, [0.1 * (i + 1) for i in range(L)], layers=L)
                    write_run(t, "lns", seed, a + gap + b, [0.05] * L, [0.1] * L, layers=L)
            report = depth_report.build_report(depth_report.find_runs(t))
            pts = []
            for L, gap in ((2, -0.1), (4, -0.2), (8, -0.3)):
                w = study_stats.welch([5.0, 5.2, 5.1], [5.0 + gap, 5.25 + gap, 5.06 + gap])
                self.assertAlmostEqual(w["diff"], gap + 0.01 / 3, places=12)
                pts.append((L, w["diff"], w["se"]))
            tr = study_stats.trend(pts)
            self.assertAlmostEqual(tr["slope"], -0.1, places=9)  # the same seeds' offsets at every depth
            f = depth_doc.findings(report, "CPU (f32)")
            self.assertIn("The gap's slope on log2(depth) at this rate: %s." % study_stats.fmt_trend(tr, 3), f)
            # no sweep anywhere: the best-rate claim says so instead of a shared-rate number
            self.assertIn("| LNS's advantage grows with depth | each at its best rate: fewer than 2 depths", f)

    def test_a_figure_without_a_record_is_refused(self):
        """A configuration known only from an earlier session's summary (prior_*.json, runs
        not kept) stops the page generator, which names it; depth_doc.py exits 1 with one line."""
        with tempfile.TemporaryDirectory() as t:
            rec = os.path.join(t, "records")
            os.makedirs(rec)
            with open(os.path.join(rec, "prior_x.json"), "w") as f:
                json.dump(PRIOR, f)
            report = depth_report.build_report(depth_report.find_runs(self.root), depth_report.load_prior(rec))
            with self.assertRaises(depth_doc.DocError) as e:
                depth_doc.tables(report)
            self.assertIn("2 configurations without a run record behind every seed: 4 blocks lns lr 0.008 400 steps "
                          "(seeds 1, prior_x.json); 4 blocks pre lr 0.008 400 steps (seeds 1, prior_x.json)",
                          str(e.exception))
            with self.assertRaises(depth_doc.DocError):
                depth_doc.findings(report, "x")
            rep, doc = os.path.join(t, "report.json"), os.path.join(t, "doc.md")
            with open(rep, "w") as f:
                json.dump(report, f)
            with open(doc, "w") as f:
                f.write("<!-- depth_doc:begin -->\nold\n<!-- depth_doc:end -->\n")
            r = subprocess.run([sys.executable, os.path.join(EXP, "depth_doc.py"), rep, "--doc", doc, "--record", ""],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn("depth_doc: %s: 2 configurations without a run record" % rep, r.stderr)
            with open(doc) as f:
                self.assertEqual(f.read(), "<!-- depth_doc:begin -->\nold\n<!-- depth_doc:end -->\n")  # untouched
            # the same records without the summary: accepted
            depth_doc.tables(depth_report.build_report(depth_report.find_runs(self.root)))

    def test_bad_runs_are_refused(self):
        cli = [sys.executable, os.path.join(EXP, "depth_report.py")]
        cases = []
        with tempfile.TemporaryDirectory() as bad:
            d = write_run(os.path.join(bad, "nan"), "pre", 1, float("nan"), [0.1] * 4, [1.0] * 4)
            cases.append((os.path.join(bad, "nan"), "eval.json: loss: expected a finite number"))
            d = write_run(os.path.join(bad, "short"), "pre", 1, 5.0, [0.1] * 3, [1.0] * 3)
            cases.append((os.path.join(bad, "short"), "must cover blocks 0..3"))
            d = write_run(os.path.join(bad, "status"), "pre", 1, 5.0, [0.1] * 4, [1.0] * 4)
            with open(os.path.join(d, "result.json"), "w") as f:
                json.dump({"status": "running"}, f)
            cases.append((os.path.join(bad, "status"), "status 'running'"))
            os.makedirs(os.path.join(bad, "empty"))
            cases.append((os.path.join(bad, "empty"), "no finished runs"))
            for root, want in cases:
                p = subprocess.run(cli + [root], capture_output=True, text=True)
                self.assertEqual(p.returncode, 1, root)
                self.assertIn(want, p.stderr)
                self.assertTrue(p.stderr.startswith("depth_report: ") and p.stderr.count("\n") == 1, p.stderr)
            p = subprocess.run(cli + [self.root, "--json", os.path.join(bad, "r.json")], capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)


PRIOR = {"runs": [dict(layers=4, scheme="pre", lr=8e-3, steps=400, embed_std=0.02, seed=1),
                  dict(layers=4, scheme="lns", lr=8e-3, steps=400, embed_std=0.02, seed=1),
                  dict(layers=4, scheme="pre", lr=2e-3, steps=400, embed_std=0.02, seed=1)],
         "cells": [dict(layers=4, scheme="pre", lr=8e-3, steps=400, embed_std=0.02, n=1, seeds=[1], mean=4.5, std=None),
                   dict(layers=4, scheme="lns", lr=8e-3, steps=400, embed_std=0.02, n=1, seeds=[1], mean=4.4, std=None),
                   # covered by this study's runs: the runs win
                   dict(layers=4, scheme="pre", lr=2e-3, steps=400, embed_std=0.02, n=1, seeds=[1], mean=9.0,
                        std=None)],
         "comparisons": [dict(layers=4, lr=8e-3, steps=400, embed_std=0.02, diff=-0.1001)],
         "timing": dict(runs=3, block_steps=4800, seconds=480.0, jobs=2)}


class RecordTest(unittest.TestCase):
    """Runs kept as records (depth_study.py --record) and earlier sessions' summaries."""

    def test_record_round_trip_and_prior(self):
        with tempfile.TemporaryDirectory() as t:
            study, rec = os.path.join(t, "study"), os.path.join(t, "records")
            synthetic(study)
            for name in sorted(os.listdir(study)):
                c = depth_report.load_json(os.path.join(study, name, "cell.json"))
                if depth_report.load_json(os.path.join(study, name, "result.json"))["status"] == "ok":
                    # what depth_study.finish writes when a run ends: its result.json and its record
                    self.assertEqual(depth_study.finish(c, os.path.join(study, name), 0, 10.0, rec, 1)["status"], "ok")
            self.assertEqual(len(os.listdir(rec)), 9)  # the 9 runs that finished
            with open(os.path.join(rec, "prior_x.json"), "w") as f:
                json.dump(PRIOR, f)
            # from the records alone (the study directory gone), the same statistics
            report = depth_report.build_report(depth_report.find_records(rec), depth_report.load_prior(rec))
            cells = {(c["scheme"], c["lr"]): c for c in report["cells"]}
            self.assertAlmostEqual(cells[("pre", 2e-3)]["mean"], 5.1, places=12)  # runs, not the prior 9.0
            self.assertNotIn("prior", cells[("pre", 2e-3)])
            self.assertEqual(cells[("pre", 2e-3)]["curves"]["1"], [(100, 6.0), (200, 5.0)])
            self.assertAlmostEqual(cells[("lns", 2e-3)]["variance_growth"], 2.0, places=12)
            self.assertEqual(cells[("pre", 8e-3)]["prior"], "prior_x.json")
            by = {c["b"]: c for c in report["comparisons"]}
            self.assertAlmostEqual(by[cells[("lns", 8e-3)]["name"]]["diff"], -0.1001)  # as the prior computed it
            self.assertAlmostEqual(by[cells[("lns", 2e-3)]["name"]]["diff"], -0.3, places=12)
            best = {b["scheme"]: b for b in report["best_lr"]}
            self.assertEqual(best["pre"]["lr"], 8e-3)  # 4.5 (prior) < 5.1
            self.assertEqual(report["prior_runs"], 3)
            self.assertEqual(report["timing"]["runs"], 9)
            # the study directory and the records together: each run once
            both = depth_report.build_report(depth_report.find_runs(study) + depth_report.find_records(rec))
            self.assertEqual((both["runs"], both["timing"]["runs"]), (10, 10))
            self.assertEqual(both["cells"], depth_report.build_report(depth_report.find_runs(study))["cells"])
            with self.assertRaises(depth_doc.DocError):  # the summarised cells have no record
                depth_doc.tables(report)
            # the one rule for a finished cell: a record, a prior summary, or a result in the study
            prior = depth_study.prior_names(rec)
            pre8 = depth_study.cell("lr", 4, "pre", 1, lr=8e-3)
            self.assertTrue(depth_study.finished(pre8, os.path.join(t, "none"), rec, prior))
            self.assertFalse(depth_study.finished(pre8, os.path.join(t, "none"), rec, set()))  # --rerun_prior
            lns2 = depth_study.cell("depth", 4, "lns", 3)
            self.assertTrue(depth_study.finished(lns2, os.path.join(t, "none"), rec, set()))
            self.assertFalse(depth_study.finished(dict(lns2, seed=4), study, rec, prior))

    def test_prior_seed_joins_new_seeds(self):
        """A single-seed summary of an earlier session (24 blocks seed 1 on the real grid)
        and this study's seeds 2 and 3 of the same configuration make one 3-seed cell."""
        with tempfile.TemporaryDirectory() as t:
            study, rec = os.path.join(t, "study"), os.path.join(t, "records")
            os.makedirs(rec)
            for scheme, seed, loss, var in (("pre", 2, 4.6, [0.2] * 4), ("pre", 3, 4.7, [0.3, 0.3, 0.3, 0.6]),
                                            ("lns", 2, 4.3, [0.1] * 4), ("lns", 3, 4.5, [0.1, 0.1, 0.1, 0.3])):
                write_run(study, scheme, seed, loss, [0.1] * 4, var, lr=8e-3)
            prior = json.loads(json.dumps(PRIOR))
            prior["cells"][0].update(drop_pct=[50.0, 10.0, 10.0, 10.0], angular=[0.1] * 4, variance=[0.1, 0.1, 0.1, 0.4])
            with open(os.path.join(rec, "prior_x.json"), "w") as f:
                json.dump(prior, f)
            report = depth_report.build_report(depth_report.find_runs(study), depth_report.load_prior(rec))
            cells = {(c["scheme"], c["lr"]): c for c in report["cells"]}
            pre, lns = cells[("pre", 8e-3)], cells[("lns", 8e-3)]
            self.assertEqual((pre["n"], pre["seeds"], pre["prior_seeds"]), (3, [1, 2, 3], [1]))
            self.assertNotIn("prior", pre)  # partly summarised: computed from the seeds, not the prior's comparison
            self.assertAlmostEqual(pre["mean"], 4.6, places=12)  # 4.5 (summary), 4.6, 4.7
            self.assertAlmostEqual(pre["std"], 0.1, places=12)
            self.assertEqual(pre["n_diag"], 3)
            self.assertAlmostEqual(pre["variance_growth"], 7.0 / 3, places=12)  # 4, 1, 2
            self.assertAlmostEqual(pre["drop_pct"][0], (50.0 + 10.0 + 10.0) / 3, places=12)
            self.assertEqual(lns["n_diag"], 2)  # the lns summary has no per-block lists
            self.assertAlmostEqual(lns["variance_growth"], 2.0, places=12)  # 1, 3
            self.assertEqual(sorted(pre["curves"]), ["2", "3"])  # a summary has no curve
            cmp = {c["b"]: c for c in report["comparisons"]}[lns["name"]]
            self.assertAlmostEqual(cmp["diff"], -0.2, places=12)  # 4.4 mean: 4.4, 4.3, 4.5
            self.assertAlmostEqual(cmp["paired"]["mean"], -0.2, places=12)  # -0.1, -0.3, -0.2
            self.assertAlmostEqual(cmp["paired"]["std"], 0.1, places=12)
            self.assertTrue(cmp["paired"]["same_sign"])
            self.assertFalse(cmp["beyond_spread"])  # lns [4.3, 4.5] overlaps pre [4.5, 4.7]
            self.assertEqual(report["runs"], 4)  # the summaries are not runs of this study
            self.assertEqual(report["timing"]["runs"], 4)
            with self.assertRaises(depth_doc.DocError) as e:  # seed 1 is a summary, not a record
                depth_doc.tables(report)
            self.assertIn("4 blocks pre lr 0.008 400 steps (seeds 1, prior_x.json)", str(e.exception))
            # this study's own run of the summarised seed wins over the summary
            write_run(study, "pre", 1, 4.8, [0.1] * 4, [0.1] * 4, lr=8e-3)
            report = depth_report.build_report(depth_report.find_runs(study), depth_report.load_prior(rec))
            pre = {(c["scheme"], c["lr"]): c for c in report["cells"]}[("pre", 8e-3)]
            self.assertAlmostEqual(pre["mean"], 4.7, places=12)
            self.assertNotIn("prior_seeds", pre)
            # a one-seed summary must name its seed
            prior["cells"][1]["seeds"] = []
            with open(os.path.join(rec, "prior_x.json"), "w") as f:
                json.dump(prior, f)
            p = subprocess.run([sys.executable, os.path.join(EXP, "depth_report.py"), study, "--records", rec,
                                "--json", os.path.join(t, "r.json")], capture_output=True, text=True)
            self.assertEqual(p.returncode, 1)
            self.assertTrue(p.stderr.startswith("depth_report: prior_x.json: the cell 4 blocks lns lr 0.008")
                            and p.stderr.count("\n") == 1, p.stderr)
            self.assertIn("n = 1 needs 'seeds' with one seed", p.stderr)

    def test_bad_records_are_refused(self):
        cli = [sys.executable, os.path.join(EXP, "depth_report.py")]
        with tempfile.TemporaryDirectory() as t:
            for name, edit, want in (
                    ("short", lambda r: r.update(variance=[1.0] * 3), "'variance' must have one number per block (4)"),
                    ("inf", lambda r: r.update(loss=float("inf")), "loss: expected a finite number"),
                    ("cell", lambda r: r["cell"].pop("lr"), "'cell' must hold"),
                    ("prior", None, "a cell must hold")):
                rec = os.path.join(t, name)
                os.makedirs(rec)
                if edit is None:
                    with open(os.path.join(rec, "prior_bad.json"), "w") as f:
                        json.dump({"cells": [{"layers": 4}]}, f)
                else:
                    r = dict(cell=depth_study.cell("depth", 4, "pre", 1), status="ok", loss=5.0,
                             drop_pct=[1.0] * 4, angular=[0.1] * 4, variance=[1.0] * 4, curve=[])
                    edit(r)
                    with open(os.path.join(rec, "L04_pre.json"), "w") as f:
                        json.dump(r, f)
                p = subprocess.run(cli + [os.path.join(t, "nostudy"), "--records", rec, "--json",
                                          os.path.join(t, name + ".json")], capture_output=True, text=True)
                self.assertEqual(p.returncode, 1, name)
                self.assertIn(want, p.stderr)
                self.assertTrue(p.stderr.startswith("depth_report: ") and p.stderr.count("\n") == 1, p.stderr)


class DeviceTest(unittest.TestCase):
    """A GPU (bf16) study is its own: never pooled with CPU (f32) runs, its own records,
    markers and figures, and a table against the CPU study."""

    def test_devices_are_never_pooled(self):
        with tempfile.TemporaryDirectory() as t:
            synthetic(t)  # CPU runs (no device in result.json: an older run, cpu)
            write_run(t, "pre", 4, 5.3, [0.1] * 4, [1.0] * 4, device="cuda")
            with self.assertRaises(depth_report.ReportError) as e:
                depth_report.build_report(depth_report.find_runs(t))
            self.assertIn("runs of devices cpu and cuda in one report", str(e.exception))
            p = subprocess.run([sys.executable, os.path.join(EXP, "depth_report.py"), t], capture_output=True, text=True)
            self.assertEqual(p.returncode, 1)
            self.assertTrue(p.stderr.startswith("depth_report: ") and p.stderr.count("\n") == 1, p.stderr)
            # a CPU prior summary and GPU runs: refused too
            with self.assertRaises(depth_report.ReportError):
                depth_report.build_report([r for r in depth_report.find_runs(t) if r["device"] == "cuda"],
                                          [dict(PRIOR, file="prior_x.json")])

    def test_gpu_study_against_cpu_study(self):
        with tempfile.TemporaryDirectory() as t:
            cpu, gpu = os.path.join(t, "cpu"), os.path.join(t, "gpu")
            synthetic(cpu)
            for seed, (loss, drops, var) in PRE.items():  # each GPU seed 0.01 above the CPU's
                write_run(gpu, "pre", seed, loss + 0.01, drops, var, device="cuda")
            write_run(gpu, "lns", 1, 4.7, [0.1] * 4, [0.1] * 4, device="cuda")
            # scaled_init + LNS from its own init: 4.9, 5.0, 4.8 against LNS's 4.8, 4.9, 4.7 here
            for seed, loss in ((1, 4.9), (2, 5.0), (3, 4.8)):
                write_run(gpu, "lns_scaled_init", seed, loss, [0.1] * 4, [0.1] * 4, device="cuda")
            for seed, (loss, drops, var) in LNS.items():
                if seed > 1:
                    write_run(gpu, "lns", seed, loss, drops, var, device="cuda")
            rc = depth_report.build_report(depth_report.find_runs(cpu))
            rg = depth_report.build_report(depth_report.find_runs(gpu))
            self.assertEqual((rc["device"], rg["device"]), ("cpu", "cuda"))
            md = depth_doc.tables(rg)
            self.assertIn("a time on one GPU)", md)
            # lns seeds 4.7, 4.9, 4.7 (seed 1 is 4.7 on the GPU; variance 0.04/3) against 4.9, 5.0, 4.8
            # (variance 0.01): se sqrt(0.04/9 + 0.01/3), Welch's df (va + vb)^2 / (va^2/2 + vb^2/2);
            # paired +0.2, +0.1, +0.1: mean 0.1333, sd 0.0577, se 0.0577/sqrt(3), df 2
            va, vb = 0.04 / 9, 0.01 / 3
            se, df = math.sqrt(va + vb), (va + vb) ** 2 / (va * va / 2 + vb * vb / 2)
            tp = (0.4 / 3) / (math.sqrt(0.01 / 3) / math.sqrt(3))
            self.assertIn("scaled_init + LNS against LNS alone: +0.1333 ± %.4f (t = %.2f, df %.1f, p = %.2g; paired by "
                          "seed: +0.1333 ± %.4f (3 seeds, p = %.2g))." % (
                              se, (0.4 / 3) / se, df, study_stats.t_sf2((0.4 / 3) / se, df),
                              math.sqrt(0.01 / 3) / math.sqrt(3), p_df2(tp)), md)
            md = depth_doc.against(rg, rc, "CPU (f32)")
            # pre: the same spread a side (variance 0.01), +0.01: se sqrt(0.02/3), df 4
            t_pre = 0.01 / math.sqrt(0.02 / 3)
            self.assertIn("| 4 | pre | 0.002 | 400 | 0.02 | 5.1000 +- 0.1000 (3) / 5.1100 +- 0.1000 (3) | +0.0100 | "
                          "t = %.2f, df 4.0, p = %.2g |" % (t_pre, p_df4(t_pre)), md)
            self.assertIn("| 4 | lns | 0.002 | 400 | 0.02 | 4.8000 +- 0.1000 (3) / 4.7667 +- 0.1155 (3) | -0.0333 | t = ",
                          md)
            self.assertIn("2 configurations; difference mean -0.0117, largest -0.0333; 0 of the 2 with 2 or more seeds a "
                          "side significant at p < 0.05.", md)
            self.assertEqual(depth_doc.against(rg, {"cells": []}, "x"), "")

    def test_doc_markers(self):
        with tempfile.TemporaryDirectory() as t:
            synthetic(t)
            rep = os.path.join(t, "report.json")
            with open(rep, "w") as f:
                json.dump(depth_report.build_report(depth_report.find_runs(t)), f)
            doc = os.path.join(t, "doc.md")
            with open(doc, "w") as f:
                f.write("a\n<!-- depth_doc:begin -->\nold\n<!-- depth_doc:end -->\nb\n"
                        "<!-- depth_doc_cuda:begin -->\nold gpu\n<!-- depth_doc_cuda:end -->\n")
            cli = [sys.executable, os.path.join(EXP, "depth_doc.py"), rep, "--doc", doc, "--record", ""]
            self.assertEqual(subprocess.run(cli + ["--marker", "depth_doc_cuda"], capture_output=True).returncode, 0)
            with open(doc) as f:
                text = f.read()
            self.assertIn("old\n", text)  # the CPU tables untouched
            self.assertNotIn("old gpu", text)
            self.assertEqual(text.count("### Depth, shared learning rate"), 1)
            p = subprocess.run(cli + ["--marker", "nope"], capture_output=True, text=True)
            self.assertEqual(p.returncode, 1)
            self.assertIn("needs one '<!-- nope:begin -->' line", p.stderr)

    def test_figures_take_the_prefix(self):
        with tempfile.TemporaryDirectory() as t:
            study, out = os.path.join(t, "s"), os.path.join(t, "img")
            synthetic(study)
            for scheme, loss in (("pre", 4.5), ("lns", 4.4)):  # the budget axis: 4x the steps
                write_run(study, scheme, 1, loss, [0.1] * 4, [0.1] * 4, steps=1600)
            depth_report.plots(depth_report.build_report(depth_report.find_runs(study)), out, "x_cuda")
            self.assertEqual(sorted(os.listdir(out)), ["x_cuda_%s.png" % f for f in (
                "angular", "budget", "depth", "layer_drop", "loss", "lr", "variance")])

    def test_records_by_device(self):
        self.assertEqual(depth_study.RECORDS, {"cpu": "docs/depth_study_runs", "cuda": "docs/depth_study_runs_cuda"})
        with self.assertRaises(SystemExit) as e:
            depth_study.main(["--device", "tpu", "--list"])
        self.assertIn("--device=tpu: expected cpu or cuda", str(e.exception))


class GridTest(unittest.TestCase):
    def test_grids(self):
        for name in ("smoke", "session", "full"):
            cells = depth_study.grid(name)
            names = [depth_study.run_name(c) for c in cells]
            self.assertEqual(len(names), len(set(names)), name)
        session = depth_study.grid("session")
        # priority: 3 seeds of pre and lns at 6 and 12 blocks first, at the shared rate
        first = session[:12]
        self.assertEqual({(c["layers"], c["scheme"], c["seed"]) for c in first},
                         {(L, s, seed) for L in (6, 12) for s in ("pre", "lns") for seed in (1, 2, 3)})
        self.assertTrue(all(c["lr"] == depth_study.SHARED_LR for c in first))
        lrs = {c["lr"] for c in session if c["group"] == "lr"} | {depth_study.SHARED_LR}
        self.assertEqual(sorted(lrs), [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2])  # past the best rate of 8e-3
        self.assertEqual(depth_study.lr_name(1.6e-2), "1.6e-02")
        self.assertEqual(depth_study.lr_name(2e-3), "2e-03")  # the first session's names unchanged
        # then (issue 20's order for the third session) 24 blocks' seeds 2 and 3, the budget
        # axis, 48 blocks, scaled_init alone, each scheme's best rate with seeds 2 and 3
        names = [depth_study.run_name(c) for c in session]
        order = [names.index(n) for n in ("L24_lns_lr2e-03_s400_seed1", "L24_pre_lr2e-03_s400_seed2",
                                          "L24_lns_lr2e-03_s400_seed3", "L06_pre_lr2e-03_s1600_seed1",
                                          "L48_lns_lr2e-03_s400_seed1", "L12_scaled_init_lr2e-03_s400_seed1",
                                          "L12_pre_lr8e-03_s400_seed2", "L12_lns_lr1.6e-02_s400_seed3")]
        self.assertEqual(order, sorted(order))
        self.assertEqual(names[-4:], ["L12_pre_lr8e-03_s400_seed2", "L12_lns_lr1.6e-02_s400_seed2",
                                      "L12_pre_lr8e-03_s400_seed3", "L12_lns_lr1.6e-02_s400_seed3"])
        full = [depth_study.run_name(c) for c in depth_study.grid("full")]
        self.assertGreater(len(full), len(session))
        # the full grid ends with the budget axis at 24, then 12 blocks (3 seeds each), then
        # the sweeps at 6 and 48 blocks (seed by seed)
        self.assertEqual(full[-60:-48], ["L%02d_%s_lr2e-03_s1600_seed%d" % (L, s, seed)
                                         for L in (24, 12) for seed in (1, 2, 3) for s in ("pre", "lns")])
        self.assertEqual(full[-48:-24], ["L06_%s_lr%s_s400_seed%d" % (s, lr, seed) for seed in (1, 2, 3)
                                         for lr in ("1e-03", "4e-03", "8e-03", "1.6e-02") for s in ("pre", "lns")])
        self.assertEqual(full[-24:], ["L48_%s_lr%s_s400_seed%d" % (s, lr, seed) for seed in (1, 2, 3)
                                      for lr in ("8e-03", "4e-03", "1.6e-02", "1e-03") for s in ("pre", "lns")])
        with self.assertRaises(SystemExit):
            depth_study.grid("huge")

    def test_flags(self):
        class A:
            vocab, data, eval_tokens, device, nice = 4096, "data/x", 16384, "cpu", 0
        mix = depth_study.train_flags(depth_study.cell("schemes", 12, "mix", 1), "/tmp/r", A)
        self.assertIn("--post_layers=3", mix)  # the paper's 25%
        emb = depth_study.cell("embed", 12, "pre", 2, embed_std=depth_study.PAPER_EMBED_STD)
        self.assertIn("--embed_init_std=0.632456", depth_study.train_flags(emb, "/tmp/r", A))
        self.assertIn("--seed=2", depth_study.train_flags(emb, "/tmp/r", A))
        self.assertNotEqual(depth_study.run_name(emb), depth_study.run_name(dict(emb, embed_std=0.02)))
        sc = depth_study.train_flags(depth_study.cell("schemes", 12, "lns_scaled_init", 1), "/tmp/r", A)
        self.assertIn("--norm_scheme=lns", sc)
        self.assertIn("--init_from=/tmp/r/init/hf/model.safetensors", sc)


if __name__ == "__main__":
    unittest.main()
