#!/usr/bin/env python3
"""FP8 at depth (depth_study.py --study fp8 and fp8_depth_doc.py, issue 30).

1. The grid: every FP8 cell beside the same cell without FP8, a seed at a time; only the
   FP8 cells pass --fp8, and their names say so.
2. The page's answers (fp8_depth_doc.py) on records whose figures are worked out here,
   including a health record read from a metrics.jsonl written here.
3. The miniature grid end to end on the CPU (LNS_TRAIN_BIN, LNS_EVAL_BIN): FP8 records
   with their health in one folder, the baselines in the other, the page written from
   them, and a second invocation with nothing left.
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
import depth_report  # noqa: E402
import depth_study  # noqa: E402
import fp8_depth_doc  # noqa: E402
import study_stats  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import kept_folder  # noqa: E402  (a failed test keeps its folder and shows its runs' logs)


class Args:
    vocab, data, eval_tokens, device = 4096, "data/x", 16384, "cpu"


class Fp8Grid(unittest.TestCase):
    def test_each_fp8_cell_has_its_baseline(self):
        cells = depth_study.grid("fp8")
        names = [depth_study.run_name(c) for c in cells]
        self.assertEqual(len(cells), 54)  # 3 depths x 3 schemes x 3 seeds x {fp8, without}
        self.assertEqual(names[:2], ["L12_pre_lr2e-03_s400_fp8_seed1", "L12_pre_lr2e-03_s400_seed1"])
        self.assertTrue(all(c["seed"] == 1 for c in cells[:18]))  # a seed at a time
        fp8 = [c for c in cells if c.get("fp8")]
        self.assertEqual(len(fp8), 27)
        base = {depth_study.run_name(c) for c in cells if not c.get("fp8")}
        for c in fp8:
            self.assertIn(depth_study.run_name(c).replace("_fp8", ""), base)
            self.assertIn("--fp8=delayed", depth_study.train_flags(c, "/tmp/x", Args))
        for c in cells:
            if not c.get("fp8"):
                self.assertFalse(any(f.startswith("--fp8") for f in depth_study.train_flags(c, "/tmp/x", Args)))
        # a cell without FP8 keeps the width-64 study's name (its records are that study's)
        self.assertIn("L48_pre_lr2e-03_s400_seed2", base)
        mix = [c for c in fp8 if c["scheme"] == "mix" and c["layers"] == 48][0]
        self.assertIn("--post_layers=12", depth_study.train_flags(mix, "/tmp/x", Args))


def write_record(folder, cell, loss, health=None):
    os.makedirs(folder, exist_ok=True)
    L = cell["layers"]
    rec = dict(cell=cell, status="ok", loss=loss, drop_pct=[1.0] * L, angular=[0.1] * L, variance=[1.0] * L,
               curve=[[1, loss + 1.0]], device="cpu", seconds=1.0, jobs=1)
    if health is not None:
        rec["fp8_health"] = health
    with open(os.path.join(folder, depth_study.run_name(cell) + ".json"), "w") as f:
        json.dump(rec, f)


def health(L, x_sat, dy_sat):
    """Per-block lists: x saturated x_sat everywhere, dy saturated dy_sat[l]."""
    mk = lambda sat: dict(amax_last=[1.0 + l for l in range(L)], saturated_mean=sat, saturated_max=sat,
                          flushed_mean=[0.0] * L)
    return dict(steps=[10], nonfinite=0.0, x=mk([x_sat] * L), w=mk([0.0] * L), dy=mk(dy_sat))


class Fp8Doc(kept_folder.KeptFolderTest):
    def test_answers_from_records(self):
        tmp = self.work
        f8, base = os.path.join(tmp, "fp8"), os.path.join(tmp, "base")
        cell = lambda L, s, seed, fp8=None: depth_study.cell("fp8", L, s, seed, fp8=fp8)
        # Pre-LN: gap 0.01, 0.02 at 4 blocks; 0.05, 0.07 at 8 (grows beyond the spread).
        # LNS: gap 0.01, 0.03 at 4 and 0.015, 0.015 at 8 (within the spread).
        for L, s, seed, b, g in ((4, "pre", 1, 5.0, 0.01), (4, "pre", 2, 5.1, 0.02), (8, "pre", 1, 5.2, 0.05),
                                 (8, "pre", 2, 5.3, 0.07), (4, "lns", 1, 4.9, 0.01), (4, "lns", 2, 5.0, 0.03),
                                 (8, "lns", 1, 4.8, 0.015), (8, "lns", 2, 4.9, 0.015)):
            write_record(base, cell(L, s, seed), b)
            write_record(f8, cell(L, s, seed, "delayed"), b + g,
                         health(L, 0.001 * seed, [0.0] * (L // 2) + [0.004] * (L // 2)))
        doc = os.path.join(tmp, "page.md")
        with open(doc, "w") as f:
            f.write("# P\n<!-- fp8_depth:begin -->\nold\n<!-- fp8_depth:end -->\nafter\n")
        # the other precision's runs of two baselines: bf16 - f32 = +0.003 and -0.004
        other = os.path.join(tmp, "other")
        write_record(other, cell(4, "pre", 1), 5.0 + 0.003)
        write_record(other, cell(4, "pre", 2), 5.1 - 0.004)
        self.assertEqual(fp8_depth_doc.main(["--fp8", f8, "--baseline", base, "--doc", doc, "--noise", other,
                                             "--plots", os.path.join(tmp, "img")]), 0)
        with open(doc) as f:
            page = f.read()
        self.assertNotIn("\nold\n", page)
        self.assertTrue(page.endswith("<!-- fp8_depth:end -->\nafter\n"))
        # 8 blocks Pre-LN: without 5.25 ± 0.0707, with 5.31 ± 0.0849, gap 0.06 ± 0.0141
        self.assertIn("| 8 | Pre-LN | 5.2500 ± 0.0707 (2) | 5.3100 ± 0.0849 (2) | 0.0600 ± 0.0141 (2) |", page)
        # the trend: gaps 0.015 (se 0.0070711 / sqrt 2 = 0.005) and 0.06 (se 0.01) at log2 depth 2 and 3:
        # slope 0.045 per doubling, se sqrt(0.005^2 + 0.01^2) = 0.01118, t = 4.02, two depths: normal
        self.assertIn("- Pre-LN: the gap's slope on log2(depth) is significant: +0.0450 ± 0.0112 per doubling of the "
                      "depth (t = 4.02, normal, p = <0.001; 2 depths) (gaps 4: +0.0150, 8: +0.0600).", page)
        # LNS at 8 blocks has no spread (0.015 twice): no trend to state
        self.assertIn("- LNS: fewer than 2 depths with a spread over seeds, no trend (gaps 4: +0.0200, 8: +0.0150).",
                      page)
        # the noise reference: rms of +0.003 and -0.004 = 0.0035, beside the FP8 gaps' rms sqrt((0.01^2 + 0.02^2) / 2)
        self.assertIn("| 4 | Pre-LN | 0.0158 (2) | 0.0035 (2) | +0.0030, -0.0040 |", page)
        self.assertIn("| 8 | LNS | 0.0150 (2) | not run | — |", page)
        # x saturated: seeds 0.1% and 0.2%: 0.150 ± 0.071; dy deep / shallow half 0.400 / 0.000
        self.assertIn("| 8 | LNS | 0.150 ± 0.071 (2) | 0.000 ± 0.000 (2) | 0.000 ± 0.000 (2) | 0.000 ± 0.000 (2) | "
                      "0.200 ± 0.000 (2) | 0.000 ± 0.000 (2) | 0.15 ± 0.07 (2) | "
                      "0.400 ± 0.000 (2) / 0.000 ± 0.000 (2) | 0 |", page)
        # Q3 at 8 blocks: LNS 0.015 (no spread) against Pre-LN 0.05, 0.07: Welch se = sqrt(0.0002 / 2) = 0.01,
        # t = -4.5, df 1; two-sided p at df 1 = 1 - (2 / pi) atan(4.5) = 0.139: the ranges are apart, and yet
        # the difference is not significant
        self.assertIn("| 8 | LNS | 0.0150 ± 0.0000 (2) | 0.0600 ± 0.0141 (2) | -0.0450 ± 0.0100 | t = -4.50, df 1.0 | "
                      "not significant (p = 0.14) |", page)
        # the generated sentences: the largest mean gap per depth, the slopes, Q3 with its p (df 1:
        # 1 - (2/pi) atan(4.5)), the noise reference at 4 blocks (its only cell), saturation and flushing
        self.assertIn("The largest mean gap (FP8 − baseline, over seeds) of any scheme: 4 blocks +0.0200 (LNS), "
                      "8 blocks +0.0600 (Pre-LN). Its slope on log2(depth) is significant for Pre-LN", page)
        self.assertIn("*The gap's spread over seeds* (std) at 8 blocks: Pre-LN 0.0141, LNS 0.0000.", page)
        self.assertIn("significant at 0 of 2 comparisons (LNS 4 blocks +0.0050, p = %s; LNS 8 blocks -0.0450, p = %s)"
                      % (study_stats.fmt_p(study_stats.t_sf2(0.005 / math.sqrt(0.00005 / 2 + 0.0002 / 2),
                                                            study_stats.welch([0.01, 0.02], [0.01, 0.03])["df"])),
                         study_stats.fmt_p(1 - 2 / math.pi * math.atan(4.5))), page)
        self.assertIn("*Against the noise reference at 4 blocks:* bf16 − f32 moves a seed's loss by an rms of 0.0035 "
                      "over the schemes, FP8 by 0.0158 to 0.0224.", page)
        self.assertIn("inputs at most 0.150%, weights 0.000%, gradients at most 0.200% in any cell; non-finite "
                      "values: 0.", page)
        for fig in ("gap", "amax", "health"):
            self.assertTrue(os.path.exists(os.path.join(tmp, "img", "fp8_depth_%s.png" % fig)))
        # an FP8 record without its health is refused in one line
        write_record(f8, cell(4, "pre", 3, "delayed"), 5.0)
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "experiments", "fp8_depth_doc.py"),
                            "--fp8", f8, "--baseline", base, "--doc", doc], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertIn("an FP8 cell's record needs 'fp8_health'", r.stderr)

    def test_health_is_read_from_metrics(self):
        tmp = self.work
        path = os.path.join(tmp, "metrics.jsonl")
        rows = lambda step, sat: [dict(layer=l, linear=lin, tensor=t, amax=float(l + 1) * (2 if lin == "up_proj"
                                                                                            else 1),
                                       scale=1.0, saturated=sat if (t, l, lin) == ("dy", 1, "up_proj") else 0.0,
                                       flushed=0.0,
                                       nonfinite=0.0)
                                  for l in range(2) for lin in ("q_proj", "up_proj") for t in ("x", "w", "dy")]
        with open(path, "w") as f:
            f.write(json.dumps(dict(step=1, fp8=rows(1, 0.9))) + "\n")  # the cold start: left out
            f.write(json.dumps(dict(step=5, loss=1.0)) + "\n")
            f.write(json.dumps(dict(step=5, fp8=rows(5, 0.5))) + "\n")
            f.write(json.dumps(dict(step=10, fp8=rows(10, 0.1))) + "\n")
            f.write("{cut short")
        h = depth_report.read_fp8_health(path, 2)
        self.assertEqual(h["steps"], [5, 10])
        self.assertEqual(h["x"]["amax_last"], [2.0, 4.0])  # the larger of the two linears
        # block 1's dy: one linear at 0.5 then 0.1, the other 0: mean 0.15, max 0.5
        self.assertAlmostEqual(h["dy"]["saturated_mean"][1], 0.15)
        self.assertEqual(h["dy"]["saturated_max"], [0.0, 0.5])
        with self.assertRaises(depth_report.ReportError) as e:
            depth_report.read_fp8_health(path, 3)  # block 2 has no rows
        self.assertIn("does not cover blocks 0..2", str(e.exception))


FAKE_TRAIN = """#!/bin/bash
# a training that fails: says where its Open MPI session files would go, then 40 lines
for a in "$@"; do case $a in --out_dir=*) out=${a#--out_dir=} ;; esac; done
echo "$OMPI_MCA_orte_tmpdir_base $( [ -d "$OMPI_MCA_orte_tmpdir_base" ] && echo exists )" > "$out.session"
for i in $(seq 40); do echo "fake lns_train line $i"; done
exit 1
"""


class RunnerFailures(kept_folder.KeptFolderTest):
    """Issue 45: a failed run explains itself in the runner's output, and runs that start
    together never share Open MPI's session folder (the cause of the flaky run)."""

    def test_failed_run_prints_its_log_tail_and_runs_get_own_mpi_folders(self):
        bindir = os.path.join(self.work, "bin")
        os.makedirs(bindir)
        for name, text in (("lns_train", FAKE_TRAIN), ("lns_eval", "#!/bin/bash\nexit 0\n")):
            with open(os.path.join(bindir, name), "w") as f:
                f.write(text)
            os.chmod(os.path.join(bindir, name), 0o755)
        data = os.path.join(self.work, "corpus")
        for ext in (".train.tok", ".val.tok"):
            open(data + ext, "w").close()
        out = os.path.join(self.work, "runs")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "experiments", "depth_study.py"), "--study",
                            "fp8", "--grid", "fp8_mini", "--data", data, "--vocab", "257", "--bin", bindir, "--out",
                            out, "--record", "", "--baseline_record", "", "--jobs", "2", "--threads", "1",
                            "--cells", "mini_L02_pre_*_seed1"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1, r.stderr[-3000:])
        names = ["mini_L02_pre_lr2e-03_s6_fp8_seed1", "mini_L02_pre_lr2e-03_s6_seed1"]
        for n in names:
            self.assertIn("%s failed (exit 1" % n, r.stderr)
        # the tail of train.log: its last 25 lines, not the first 15
        self.assertIn("fake lns_train line 40\n", r.stderr)
        self.assertIn("fake lns_train line 16\n", r.stderr)
        self.assertNotIn("fake lns_train line 15\n", r.stderr)
        self.assertIn("(last 25 of 40 lines)", r.stderr)
        sessions = []
        for n in names:
            with open(os.path.join(out, n) + ".session") as f:
                path, *exists = f.read().split()
            self.assertEqual(exists, ["exists"], "the run's session folder is made before it starts")
            self.assertFalse(os.path.exists(path), "and removed when it ends: " + path)
            sessions.append(path)
        self.assertNotEqual(sessions[0], sessions[1])


class KeptFolder(unittest.TestCase):
    """kept_folder's rule on a test that passes and one that fails."""

    def test_kept_only_on_failure_with_the_unfinished_runs_log(self):
        seen = {}

        class Inner(kept_folder.KeptFolderTest):
            def test_pass(self):
                seen["pass"] = self.work

            def test_fail(self):
                seen["fail"] = self.work
                for name, done in (("a_run", False), ("b_run", True)):
                    d = os.path.join(self.work, "runs", name)
                    os.makedirs(d)
                    open(os.path.join(d, "run.sh"), "w").close()
                    with open(os.path.join(d, "train.log"), "w") as f:
                        f.write("".join("%s line %d\n" % (name, i) for i in range(1, 51)))
                    if done:
                        open(os.path.join(d, "result.json"), "w").close()
                self.fail("deliberately")

        import io
        import contextlib
        err = io.StringIO()
        result = unittest.TestResult()
        with contextlib.redirect_stderr(err):
            unittest.defaultTestLoader.loadTestsFromTestCase(Inner).run(result)
        self.assertEqual(len(result.failures), 1)
        self.assertFalse(os.path.exists(seen["pass"]))
        try:
            self.assertTrue(os.path.isdir(seen["fail"]))
            text = err.getvalue()
            self.assertIn("its folder is kept at %s" % seen["fail"], text)
            self.assertIn("a_run line 50", text)  # the unfinished run's log, its tail
            self.assertIn("a_run line 21\n", text)
            self.assertNotIn("a_run line 20\n", text)
            self.assertNotIn("b_run", text)  # a finished run's log is not what explains a failure
        finally:
            kept_folder.done(seen["fail"], False)


@unittest.skipUnless(os.environ.get("LNS_TRAIN_BIN") and os.environ.get("LNS_EVAL_BIN"),
                     "set LNS_TRAIN_BIN and LNS_EVAL_BIN (ctest does)")
class Fp8MiniEndToEnd(kept_folder.KeptFolderTest):
    def test_mini_grid_runs_records_and_page(self):
        tmp = self.work
        text = os.path.join(tmp, "text.txt")
        with open(text, "w") as f:
            for i in range(400):
                f.write("document %d: a small text the tiny models read, %d times over.\n\n" % (i, i * 7 % 13))
        data = os.path.join(tmp, "corpus")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare_data.py"), "--input", text, "--out",
                        data, "--val_fraction", "0.2", "--no_progress"], check=True, capture_output=True)
        bindir = os.path.join(tmp, "bin")
        os.makedirs(bindir)
        for name in ("LNS_TRAIN_BIN", "LNS_EVAL_BIN"):
            os.symlink(os.environ[name], os.path.join(bindir, os.path.basename(os.environ[name])))
        out, rec, base = os.path.join(tmp, "runs"), os.path.join(tmp, "fp8rec"), os.path.join(tmp, "baserec")
        cmd = [sys.executable, os.path.join(ROOT, "tools", "experiments", "depth_study.py"), "--study", "fp8",
               "--grid", "fp8_mini", "--data", data, "--vocab", "257", "--bin", bindir, "--out", out,
               "--record", rec, "--baseline_record", base, "--jobs", "2", "--threads", "1"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        cells = depth_study.grid("fp8_mini")
        self.assertEqual(len(cells), 24)
        for c in cells:
            folder = rec if c.get("fp8") else base
            path = os.path.join(folder, depth_study.run_name(c) + ".json")
            self.assertTrue(os.path.exists(path), path)
            got = depth_report.read_record(path)  # validated as the page reads it
            self.assertEqual("fp8_health" in got, bool(c.get("fp8")))
        with open(os.path.join(out, "mini_L04_lns_lr2e-03_s6_fp8_seed1", "train.log")) as f:
            self.assertIn("fp8 step 6:", f.read())  # the health line of an FP8 run's log
        doc = os.path.join(tmp, "page.md")
        with open(doc, "w") as f:
            f.write("<!-- fp8_depth:begin -->\n<!-- fp8_depth:end -->\n")
        self.assertEqual(fp8_depth_doc.main(["--fp8", rec, "--baseline", base, "--doc", doc]), 0)
        with open(doc) as f:
            page = f.read()
        self.assertIn("| 4 | Mix-LN |", page)
        self.assertIn("(FP8: `%s`, 12 runs; without FP8: `%s`, 12 runs)" % (rec, base), page)
        r = subprocess.run(cmd + ["--list"], capture_output=True, text=True)
        self.assertIn("24 cells, 0 to run", r.stdout)


if __name__ == "__main__":
    unittest.main()
