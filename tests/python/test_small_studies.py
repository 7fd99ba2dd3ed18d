#!/usr/bin/env python3
"""The records and pages of the small CPU studies (issue 45): tools/experiments/
retrofit_report.py and ln_free_report.py on run folders written here, whose figures are
worked out by hand: a run becomes a record, the page's tables and sentences come from the
records (the jump and the gaps paired by seed, LNS's gap against Pre-LN's by Welch's t,
each replacement's bump), and a record missing a figure, an empty records folder or
records of different settings are refused with one line."""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
EXP = os.path.join(ROOT, "tools", "experiments")
sys.path.insert(0, EXP)
import ln_free_report  # noqa: E402
import retrofit_report  # noqa: E402
import study_stats  # noqa: E402

FLAGS = dict(hidden_size=64, num_heads=4, num_kv_heads=4, intermediate_size=176, seq_len=128, global_batch_size=16,
             vocab_size=257)


def p_df1(t):
    """Two-sided tail of Student's t with 1 degree of freedom (Cauchy), closed form."""
    return 1 - 2 / math.pi * math.atan(abs(t))


def run_folder(d, seed, layers, metrics, scheme="lns", ln_free=""):
    os.makedirs(d, exist_ok=True)
    flags = dict(FLAGS, num_layers=layers, seed=seed, norm_scheme=scheme, ln_free=ln_free)
    with open(os.path.join(d, "config.flags"), "w") as f:
        f.write("".join("--%s=%s\n" % kv for kv in flags.items()))
    with open(os.path.join(d, "run.json"), "w") as f:
        json.dump(dict(source_revision="abc123", started="2026-11-29T07:00:00Z"), f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for r in metrics:
            f.write(json.dumps(r) + "\n")


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f)


def retrofit_run(root, seed, pre, rf, lns_val, pre_val):
    write_json(os.path.join(root, "eval_pre.json"), dict(loss=pre, ppl=math.exp(pre), tokens=16384))
    write_json(os.path.join(root, "eval_retrofit.json"), dict(loss=rf, ppl=math.exp(rf), tokens=16384))
    for arm, val in (("lns", lns_val), ("pre", pre_val)):
        m = [dict(step=s, loss=3.0) for s in range(301, 341)] + [dict(step=s, val_loss=v) for s, v in val.items()]
        run_folder(os.path.join(root, "finetune_%s" % arm), seed, 12, m, scheme=arm)


class Retrofit(unittest.TestCase):
    def test_records_and_page(self):
        with tempfile.TemporaryDirectory() as t:
            rec = os.path.join(t, "records")
            # seed 1: jump 0.6, gaps 0.4 and 0.35; seed 2: jump 0.7, gaps 0.5 and 0.37
            for seed, pre, rf, lv, pv in ((1, 2.0, 2.6, {320: 2.4, 340: 2.3}, {320: 2.0, 340: 1.95}),
                                          (2, 2.1, 2.8, {320: 2.6, 340: 2.37}, {320: 2.1, 340: 2.0})):
                run = os.path.join(t, "run%d" % seed)
                retrofit_run(run, seed, pre, rf, lv, pv)
                with open(os.devnull, "w") as null:
                    old, sys.stdout = sys.stdout, null
                    try:
                        rc = retrofit_report.main([run, "--config", "300 40 20 5e-4", "--seconds", "150",
                                                   "--record", os.path.join(rec, "seed%d.json" % seed)])
                    finally:
                        sys.stdout = old
                self.assertEqual(rc, 0)
            doc = os.path.join(t, "page.md")
            with open(doc, "w") as f:
                f.write("# R\n<!-- retrofit:begin -->\nold\n<!-- retrofit:end -->\nafter\n")
            self.assertEqual(retrofit_report.main(["--records", rec, "--doc", doc]), 0)
            with open(doc) as f:
                page = f.read()
            self.assertNotIn("\nold\n", page)
            self.assertIn("(2 seeds: 1, 2; `PRETRAIN=300 FINETUNE=40 EVAL_EVERY=20 FT_LR=5e-4`; 12 blocks of width 64",
                          page)
            self.assertIn("| 2 | 2.1000 | 2.8000 | +0.7000 |", page)
            # jumps 0.6, 0.7: mean 0.65, sd sqrt(0.005), se 0.05, t 13 with 1 degree of freedom
            self.assertIn("paired by seed: +0.6500 ± 0.0500 (paired t = 13.00, df 1, p = %s)."
                          % study_stats.fmt_p(p_df1(13.0)), page)
            # step 320: gaps 0.4, 0.5 (mean 0.45, se 0.05, t 9); step 340: 0.35, 0.37 (se 0.01, t 36)
            self.assertIn("| 320 | 2.5000 ± 0.1414 (2) | 2.0500 ± 0.0707 (2) | +0.4500 ± 0.0500 (paired t = 9.00, df 1, "
                          "p = %s) |" % study_stats.fmt_p(p_df1(9.0)), page)
            self.assertIn("After 40 steps of fine-tuning (step 340) the retrofit is %s" % (
                "behind the control, significantly" if p_df1(36.0) < 0.05 else "not resolved from the control"), page)
            # the budget: 12 blocks of width 64 (kv 4 of 4 heads), vocabulary 257
            n = 2 * 257 * 64 + 64 + 12 * (4 * 64 * 64 + 3 * 64 * 176 + 2 * 64)
            self.assertIn("| width 64, vocabulary 257 | 12 | 300 | %s | 614,400 | %.2f |" % (format(n, ","),
                                                                                          614400 / n), page)
            # a record without a figure the page gives is refused, the page left as it was
            with open(os.path.join(rec, "seed2.json")) as f:
                r = json.load(f)
            del r["val_pre"]
            write_json(os.path.join(rec, "seed2.json"), r)
            p = subprocess.run([sys.executable, os.path.join(EXP, "retrofit_report.py"), "--records", rec, "--doc", doc],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 1)
            self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
            self.assertIn("seed2.json: no 'val_pre': every figure of the page comes from a record", p.stderr)
            with open(doc) as f:
                self.assertEqual(f.read(), page)
            # records of other settings do not share a page; an empty folder has nothing to say
            r["val_pre"] = [[320, 2.1], [340, 2.0]]
            r["config"]["finetune"] = 60
            write_json(os.path.join(rec, "seed2.json"), r)
            self.assertEqual(retrofit_report.main(["--records", rec, "--doc", doc]), 1)
            os.makedirs(os.path.join(t, "empty"))
            self.assertEqual(retrofit_report.main(["--records", os.path.join(t, "empty"), "--doc", doc]), 1)


SCHEDULE = "mlp@+20,final@~0.03/40"


def ln_free_run(root, seed, shift):
    """Both schemes: training loss 2.0 up to step 320, 2.3 for steps 321-325 (after the
    first replacement), then 2.1; the second replacement at 331. Validation at 320 and 340:
    LN-free 2.2 + shift (Pre-LN) / 2.15 + shift (LNS), control 2.1 / 2.1."""
    for arm, gap in (("pre", 0.1), ("lns", 0.05)):
        write_json(os.path.join(root, "eval_pretrained_%s.json" % arm), dict(loss=2.25))
        loss = lambda s: 2.0 if s <= 320 else 2.3 if s <= 325 else 2.1
        ev = [dict(step=321, ln_free_event=dict(entry="mlp@+20", reason="20 steps since the previous event",
                                                fixed_total=6)),
              dict(step=331, ln_free_event=dict(entry="final@~0.03/40", reason="mean loss 2.1 of the last 10 steps "
                                                "within 0.03 of the baseline 2.09", fixed_total=7))]
        lf = [dict(step=s, loss=loss(s)) for s in range(301, 341)] + ev + \
            [dict(step=s, val_loss=2.1 + gap + shift) for s in (320, 340)]
        run_folder(os.path.join(root, "lnfree_%s" % arm), seed, 6, lf, arm, SCHEDULE)
        ct = [dict(step=s, loss=2.0) for s in range(301, 341)] + [dict(step=s, val_loss=2.1) for s in (320, 340)]
        run_folder(os.path.join(root, "control_%s" % arm), seed, 6, ct, arm)
        write_json(os.path.join(root, "eval_lnfree_%s.json" % arm), dict(loss=2.2))
        write_json(os.path.join(root, "eval_folded_%s.json" % arm), dict(loss=2.2 * (1 + 2e-9)))


class LnFree(unittest.TestCase):
    def test_records_and_page(self):
        with tempfile.TemporaryDirectory() as t:
            rec = os.path.join(t, "records")
            for seed, shift in ((1, 0.0), (2, 0.02)):
                run = os.path.join(t, "run%d" % seed)
                ln_free_run(run, seed, shift)
                with open(os.devnull, "w") as null:
                    old, sys.stdout = sys.stdout, null
                    try:
                        rc = ln_free_report.main([run, "--config", "300 40 20 5e-4 0.03 40 20 6", "--seconds", "200",
                                                  "--record", os.path.join(rec, "seed%d.json" % seed)])
                    finally:
                        sys.stdout = old
                self.assertEqual(rc, 0)
            doc = os.path.join(t, "page.md")
            with open(doc, "w") as f:
                f.write("<!-- ln_free:begin -->\nold\n<!-- ln_free:end -->\n")
            self.assertEqual(ln_free_report.main(["--records", rec, "--doc", doc]), 0)
            with open(doc) as f:
                page = f.read()
            self.assertIn("schedule `%s`" % SCHEDULE, page)
            # Pre-LN's gap 0.1 and 0.12 (mean 0.11, se 0.01, t 11, df 1); LNS's 0.05 and 0.07
            self.assertIn("| Pre-LN | 2.2500 ± 0.0000 (2) | 2.2100 ± 0.0141 (2) | 2.1000 ± 0.0000 (2) | +0.1100 ± 0.0100 "
                          "(paired t = 11.00, df 1, p = %s) |" % study_stats.fmt_p(p_df1(11.0)), page)
            # LNS's gap - Pre-LN's: -0.05 with equal spreads a side: se sqrt(2 x 0.0002 / 2) = 0.0141, df 2
            se = math.sqrt(0.0002 / 2 * 2)
            self.assertIn("LNS's gap − Pre-LN's at step 340: -0.0500 ± %.4f (Welch t = %.2f, df 2.0, p = %s)." % (
                se, -0.05 / se, study_stats.fmt_p(1 - (0.05 / se) / math.sqrt(2 + (0.05 / se) ** 2))), page)
            # bumps: 2.3 - 2.0 at 321; 2.1 - (2.3 x 5 + 2.1 x 5) / 10 = -0.1 at 331, the same in both seeds
            self.assertIn("| `mlp@+20` | 321, 321 | steps, steps | 6 | +0.3000 ± 0.0000 (2) |", page)
            self.assertIn("| `final@~0.03/40` | 331, 331 | loss, loss | 7 | -0.1000 ± 0.0000 (2) |", page)
            self.assertIn("Steps between replacements: 10 to 10.", page)
            self.assertIn("Largest relative difference between a folded model and its LN-free checkpoint: 2.0e-09.",
                          page)
            # the fold's figure missing from a record: refused in one line
            with open(os.path.join(rec, "seed1.json")) as f:
                r = json.load(f)
            del r["lns"]["folded_loss"]
            write_json(os.path.join(rec, "seed1.json"), r)
            p = subprocess.run([sys.executable, os.path.join(EXP, "ln_free_report.py"), "--records", rec, "--doc", doc],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 1)
            self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
            self.assertIn("seed1.json: no 'lns.folded_loss'", p.stderr)
            with open(doc) as f:
                self.assertEqual(f.read(), page)

    def test_fired_by(self):
        self.assertEqual(ln_free_report.fired_by("mean loss 2.2 of the last 10 steps within 0.03 of the baseline 2.19"),
                         "loss")
        self.assertEqual(ln_free_report.fired_by("loss 2.3 not within 0.03 of the baseline 2.19 after the cap of 40 "
                                                 "steps"), "cap")
        self.assertEqual(ln_free_report.fired_by("20 steps since the previous event"), "steps")


if __name__ == "__main__":
    unittest.main()
