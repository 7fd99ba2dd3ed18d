#!/usr/bin/env python3
"""tools/experiments/study_stats.py against values worked out by hand (closed forms of
Student's t at 1 and 2 degrees of freedom, textbook critical values, Welch's formula and
least squares on small numbers), and the rule it gives the study pages (issue 45)."""
import math
import os
import sys
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "experiments"))
import study_stats as st  # noqa: E402


class TDistribution(unittest.TestCase):
    def test_tails_against_closed_forms(self):
        for t in (0.3, 1.0, 2.0, 4.5):
            # df 1 (Cauchy): P(|T| >= t) = 1 - (2/pi) atan(t); df 2: 1 - t / sqrt(2 + t^2)
            self.assertAlmostEqual(st.t_sf2(t, 1), 1 - 2 / math.pi * math.atan(t), places=12)
            self.assertAlmostEqual(st.t_sf2(-t, 2), 1 - t / math.sqrt(2 + t * t), places=12)
            self.assertAlmostEqual(st.t_sf2(t, math.inf), math.erfc(t / math.sqrt(2)), places=14)
        self.assertEqual(st.t_sf2(0.0, 3), 1.0)

    def test_critical_values_of_the_tables(self):
        for df, want in ((1, 12.706204736), (2, 4.302652730), (4, 2.776445105), (10, 2.228138852),
                         (30, 2.042272456), (math.inf, 1.959963985)):
            self.assertAlmostEqual(st.t_crit(df), want, places=7, msg=df)


class Tests(unittest.TestCase):
    def test_welch_by_hand(self):
        # a = 1, 2, 3 (mean 2, var 1), b = 2, 4, 6 (mean 4, var 4): se^2 = 1/3 + 4/3,
        # df = (5/3)^2 / ((1/3)^2/2 + (4/3)^2/2) = 50/17
        w = st.welch([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
        self.assertAlmostEqual(w["diff"], 2.0)
        self.assertAlmostEqual(w["se"], math.sqrt(5.0 / 3.0), places=14)
        self.assertAlmostEqual(w["t"], 2.0 / math.sqrt(5.0 / 3.0), places=14)
        self.assertAlmostEqual(w["df"], 50.0 / 17.0, places=14)
        self.assertAlmostEqual(w["p"], st.t_sf2(w["t"], 50.0 / 17.0), places=15)
        self.assertFalse(w["significant"])
        self.assertIsNone(st.welch([1.0], [2.0, 3.0]))  # one seed: no spread to test against
        # equal variances and sizes: Welch's df is 2n - 2, t the pooled one
        w = st.welch([0.0, 1.0, 2.0, 3.0], [10.0, 11.0, 12.0, 13.0])
        self.assertAlmostEqual(w["df"], 6.0)
        self.assertTrue(w["significant"])
        self.assertEqual(st.fmt_welch(w, 2), "+10.00 ± 0.91 (Welch t = 10.95, df 6.0, p = <0.001)")

    def test_contrast_by_hand(self):
        # two terms: Welch's test itself
        a, b = [1.0, 2.0, 3.0], [2.0, 4.0, 6.0]
        c, w = st.contrast([(-1, a), (1, b)]), st.welch(a, b)
        for k in ("diff", "se", "t", "df", "p"):
            self.assertAlmostEqual(c[k], w[k], places=14, msg=k)
        # the change of a gap: (d - c) - (b - a) with a = 1,2,3 (var 1), b = 2,4,6 (var 4),
        # c = 0,0,3 (mean 1, var 3), d = 5,7 (mean 6, var 2): diff (6 - 1) - (4 - 2) = 3,
        # v = 1/3, 4/3, 1, 1: se^2 = 11/3, df = (11/3)^2 / ((1/9 + 16/9 + 1) / 2 + 1 / 1)
        g = st.contrast([(1, a), (-1, b), (-1, [0.0, 0.0, 3.0]), (1, [5.0, 7.0])])
        self.assertAlmostEqual(g["diff"], 3.0, places=14)
        self.assertAlmostEqual(g["se"], math.sqrt(11.0 / 3.0), places=14)
        self.assertAlmostEqual(g["df"], (11.0 / 3.0) ** 2 / ((1 / 9 + 16 / 9 + 1) / 2 + 1), places=12)
        self.assertAlmostEqual(g["p"], st.t_sf2(3.0 / math.sqrt(11.0 / 3.0), g["df"]), places=15)
        self.assertIsNone(st.contrast([(1, a), (-1, [1.0])]))

    def test_the_range_rule_the_pages_dropped(self):
        # Seed ranges apart by 0.0003 with 3 seeds a side (the FP8 page's LNS at 12 blocks):
        # not a significant difference by Welch's test.
        a, b = [0.0010, 0.0040, 0.0066], [-0.0060, -0.0030, 0.0007]
        self.assertLess(max(b), min(a))
        self.assertFalse(st.welch(a, b)["significant"])

    def test_paired_by_hand(self):
        p = st.paired([-0.1, -0.2, -0.3])  # mean -0.2, s 0.1, se 0.1/sqrt(3)
        self.assertAlmostEqual(p["mean"], -0.2)
        self.assertAlmostEqual(p["se"], 0.1 / math.sqrt(3), places=14)
        self.assertEqual(p["df"], 2)
        t = -0.2 / (0.1 / math.sqrt(3))
        self.assertAlmostEqual(p["p"], 1 - abs(t) / math.sqrt(2 + t * t), places=12)  # df 2's closed form

    def test_trend_by_hand(self):
        # on a line: depths 2, 4, 8 (log2 1, 2, 3), values 1, 2, 3, se 1: slope 1 per doubling,
        # Sxx = 2 so se = sqrt(1/2); no residual, no scaling; df 1
        tr = st.trend([(2, 1.0, 1.0), (4, 2.0, 1.0), (8, 3.0, 1.0)])
        self.assertAlmostEqual(tr["slope"], 1.0, places=14)
        self.assertAlmostEqual(tr["se"], math.sqrt(0.5), places=14)
        self.assertAlmostEqual(tr["p"], 1 - 2 / math.pi * math.atan(math.sqrt(2)), places=12)
        # values 1, 3, 3 with se 0.1: slope 1, residuals -1/3, 2/3, -1/3, chi^2 = (6/9) / 0.01;
        # the scatter exceeds the errors, so se = sqrt(chi^2 / 1 / Sxx) = sqrt((2/3) / 2): OLS's
        tr = st.trend([(2, 1.0, 0.1), (4, 3.0, 0.1), (8, 3.0, 0.1)])
        self.assertAlmostEqual(tr["slope"], 1.0, places=12)
        self.assertAlmostEqual(tr["chi2"], 200.0 / 3.0, places=9)
        self.assertAlmostEqual(tr["se"], math.sqrt(1.0 / 3.0), places=12)
        # unequal weights: depths 2 and 4 only, the slope is their difference whatever the weights
        tr = st.trend([(2, 1.0, 0.1), (4, 1.5, 0.3)])
        self.assertAlmostEqual(tr["slope"], 0.5, places=14)
        self.assertAlmostEqual(tr["se"], math.sqrt(0.1 ** 2 + 0.3 ** 2), places=14)
        self.assertTrue(math.isinf(tr["df"]))
        self.assertIsNone(st.trend([(12, 1.0, 0.1)]))
        with self.assertRaises(ValueError):
            st.trend([(2, 1.0, 0.0), (4, 1.0, 0.1)])

    def test_the_flat_best_rate_gap_is_no_trend(self):
        # issue 45: each scheme at its best rate the gap is -0.129 at 12 blocks and -0.132 at
        # 24 (se 0.032 and 0.024): no trend; a clear one is called so
        flat = st.trend([(12, -0.129, 0.0323), (24, -0.1318, 0.0241)])
        self.assertFalse(flat["significant"])
        steep = st.trend([(6, -0.05, 0.005), (12, -0.10, 0.005), (24, -0.15, 0.005), (48, -0.20, 0.005)])
        self.assertTrue(steep["significant"])
        self.assertAlmostEqual(steep["slope"], -0.05, places=12)
        self.assertIn("-0.0500 ± ", st.fmt_trend(steep))
        self.assertIn("4 depths", st.fmt_trend(steep))


if __name__ == "__main__":
    unittest.main()
