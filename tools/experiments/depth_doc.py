#!/usr/bin/env python3
"""Writes the depth study's tables and findings (from depth_report.py's report.json) into
docs/depth_study.md, between the lines "<!-- depth_doc:begin -->" and
"<!-- depth_doc:end -->" (--marker depth_doc_cuda: the GPU study's lines); the prose
around them is left alone and states no result.

Every difference is printed with Welch's t over the seeds and every trend with depth is
the slope on log2(depth) with its standard error (study_stats.py); schemes are compared
at the shared rate where a table or sentence says so, and each at its own best rate
where the depth has a sweep. Each configuration's figures come from run records: one
only summarised in a prior_*.json (runs not kept) is refused (check_records), so the
page holds no figure without a record behind it.

    python3 tools/experiments/depth_doc.py runs/depth_study_v2/report.json [--doc docs/depth_study.md]
        [--grid session --study runs/depth_study_v2 --jobs 2]

With --grid it also lists the cells that have not finished and the projected time to
run them, from the measured wall time per block-step of the finished runs.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import depth_study  # noqa: E402  (the grid, the run names and the cost model)
import doc_markers  # noqa: E402  (the generated part of the page)
import study_budget  # noqa: E402  (tokens per parameter)
import study_stats  # noqa: E402  (Welch's t, the slope on log2(depth))


def markers(name="depth_doc"):
    """The lines the tables go between; the GPU study has its own (depth_doc_cuda)."""
    return "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name

SHARED_LR, STEPS, EMB = depth_study.SHARED_LR, depth_study.STEPS, 0.02


class DocError(Exception):
    """A figure the page would state without a run record behind it, or a bad input."""


def close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def find(cells, layers, scheme, lr=SHARED_LR, steps=STEPS, emb=EMB):
    for c in cells:
        if c["layers"] == layers and c["scheme"] == scheme and close(c["lr"], lr) and c["steps"] == steps \
                and close(c["embed_std"], emb):
            return c
    return None


def check_records(report):
    """Every figure of the page comes from a run record (issue 45): a configuration whose
    seeds are only summarised in a prior_*.json (the runs of an earlier session, not kept)
    is refused, naming it and the way out."""
    bad = ["%s (seeds %s, %s)" % (c["name"], ", ".join(map(str, c.get("prior_seeds") or c.get("seeds") or [])),
                                  c.get("prior") or ", ".join(c.get("prior_files") or ["a prior summary"]))
           for c in report["cells"] if c.get("prior") or c.get("prior_seeds")]
    if bad:
        raise DocError("%d configuration%s without a run record behind every seed: %s; rerun them "
                       "(depth_study.py --rerun_prior) or leave them out of the page" % (
                           len(bad), "s" if len(bad) > 1 else "", "; ".join(bad)))


def loss_cell(c):
    """'5.1234 +- 0.0100 (3)': mean validation loss, sample std over seeds, seeds."""
    if c is None:
        return "not run"
    if not c["n"]:
        return "diverged (%d)" % len(c["diverged_seeds"])
    std = " +- %.4f" % c["std"] if c.get("std") is not None else ""
    div = ", %d diverged" % len(c["diverged_seeds"]) if c.get("diverged_seeds") else ""
    return "%.4f%s (%d%s)" % (c["mean"], std, c["n"], div)


def ok(c):
    return c is not None and c["n"] > 0


def welch(a, b, key="losses"):
    """b - a over the seeds (study_stats.welch), or None (a side missing or one seed)."""
    if not (ok(a) and ok(b)) or key not in a or key not in b:
        return None
    return study_stats.welch(a[key], b[key])


def paired(a, b):
    """b - a seed by seed (the same initial weights and batches): study_stats.paired."""
    if not (ok(a) and ok(b)):
        return None
    la, lb = dict(zip(a["seeds"], a["losses"])), dict(zip(b["seeds"], b["losses"]))
    return study_stats.paired([lb[s] - la[s] for s in sorted(set(la) & set(lb))])


def diff_cell(a, b):
    """'-0.0718 ± 0.0125' (Welch's standard error), or the bare difference of one seed."""
    if not (ok(a) and ok(b)):
        return "-"
    w = welch(a, b)
    return "%+.4f ± %.4f" % (w["diff"], w["se"]) if w else "%+.4f" % (b["mean"] - a["mean"])


def test_cell(w):
    """'t = -5.71, df 3.9, p = 0.005' or why there is no test."""
    if w is None:
        return "one seed: no test"
    return "t = %s, df %.1f, p = %s%s" % (study_stats.fmt_t(w["t"]), w["df"], study_stats.fmt_p(w["p"]),
                                         " **significant**" if w["significant"] else "")


def paired_cell(a, b):
    p = paired(a, b)
    if p is None:
        return "-"
    return "%+.4f ± %.4f (%d seeds, p = %s)" % (p["mean"], p["se"], p["n"], study_stats.fmt_p(p["p"]))


def fmt(x, spec):
    return spec % x if x is not None else "-"


def against(report, other, label):
    """Every configuration of REPORT that OTHER (a study on another device) also ran: the
    two means, their difference and Welch's test of it. Both must have run records."""
    check_records(other)
    cells = [c for c in report["cells"] if c["n"]]
    rows, diffs = [], []
    for c in cells:
        o = find(other["cells"], c["layers"], c["scheme"], lr=c["lr"], steps=c["steps"], emb=c["embed_std"])
        if o is None or not o["n"]:
            continue
        diffs.append(c["mean"] - o["mean"])
        rows.append("| %d | %s | %g | %d | %s | %s | %+.4f | %s |" % (
            c["layers"], c["scheme"], c["lr"], c["steps"], "%.4g" % c["embed_std"], loss_cell(o) + " / " +
            loss_cell(c), diffs[-1], test_cell(welch(o, c)) if "losses" in o else "-"))
    if not rows:
        return ""
    tested = [welch(find(other["cells"], c["layers"], c["scheme"], lr=c["lr"], steps=c["steps"], emb=c["embed_std"]),
                    c) for c in cells]
    tested = [w for w in tested if w]
    return "\n".join(["### Against the %s study\n" % label,
                      "Each configuration both studies ran: validation loss there / here (seeds), the difference "
                      "here - there, and Welch's test of it over the seeds.\n",
                      "| blocks | scheme | lr | steps | embedding std | %s / this study | difference | Welch |"
                      % label, "|---|---|---|---|---|---|---|---|"] + rows +
                     ["", "%d configurations; difference mean %+.4f, largest %+.4f; %d of the %d with 2 or more seeds "
                      "a side significant at p < 0.05.\n" % (
                          len(rows), sum(diffs) / len(diffs), max(diffs, key=abs),
                          sum(1 for w in tested if w["significant"]), len(tested))])


def shared_depths(cells):
    return sorted({c["layers"] for c in cells if c["scheme"] in ("pre", "lns") and close(c["lr"], SHARED_LR)
                   and c["steps"] == STEPS and close(c["embed_std"], EMB)})


def sweep_rates(cells, L, scheme):
    return sorted(c["lr"] for c in cells if c["layers"] == L and c["scheme"] == scheme and c["steps"] == STEPS
                  and close(c["embed_std"], EMB) and c["n"])


def best(cells, L, scheme):
    """The configuration of the lowest mean loss among the rates tried at L blocks, and
    where that rate lies in the sweep ('', 'the largest rate tried', 'the smallest ...');
    None without a sweep (fewer than 2 rates)."""
    rates = sweep_rates(cells, L, scheme)
    if len(rates) < 2:
        return None
    c = min((find(cells, L, scheme, lr=lr) for lr in rates), key=lambda c: c["mean"])
    edge = "the largest rate tried" if close(c["lr"], rates[-1]) else \
        "the smallest rate tried" if close(c["lr"], rates[0]) else ""
    return c, edge


def tables(report, missing=(), jobs=2):
    """The Markdown tables; missing: (grid, names of its unfinished cells, projected seconds)
    per grid, the first one's names listed. Refuses a configuration without run records."""
    check_records(report)
    cells = report["cells"]
    out = []
    w = out.append
    depths = shared_depths(cells)
    w("Differences are LNS − Pre-LN (or the row's scheme − Pre-LN) of the mean validation loss over seeds, ± "
      "Welch's standard error, with Welch's t, its degrees of freedom and the two-sided p "
      "(`tools/experiments/study_stats.py`; **significant** at p < 0.05; one seed a side: no test). Validation loss: "
      "mean +- sample std over seeds (seeds).\n")
    w("### Depth, shared learning rate %g, %d steps\n" % (SHARED_LR, STEPS))
    w("One learning rate for every depth and both schemes; at the depths with a sweep it is not either scheme's "
      "best (the sweeps below).\n")
    w("| blocks | pre | lns | lns - pre | Welch | paired by seed | ppl pre | ppl lns |"
      " variance growth pre | lns | skip cost deep half pre (%) | lns |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|")
    g = lambda c, k, spec: fmt(c.get(k), spec) if ok(c) else "-"
    for L in depths:
        p, l = find(cells, L, "pre"), find(cells, L, "lns")
        w("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            L, loss_cell(p), loss_cell(l), diff_cell(p, l), test_cell(welch(p, l)), paired_cell(p, l),
            g(p, "ppl", "%.1f"), g(l, "ppl", "%.1f"), g(p, "variance_growth", "x%.2f"),
            g(l, "variance_growth", "x%.2f"), g(p, "drop_deep_half", "%.2f"), g(l, "drop_deep_half", "%.2f")))
    w("")

    lrs = sorted({c["lr"] for c in cells if c["steps"] == STEPS and close(c["embed_std"], EMB)
                  and c["scheme"] in ("pre", "lns")})
    for L in [L for L in depths if best(cells, L, "pre") or best(cells, L, "lns")]:
        w("### Learning-rate sweep, %d blocks, %d steps\n" % (L, STEPS))
        w("| peak lr | pre | lns | lns - pre | Welch | variance growth pre | lns | skip cost deep half pre (%) | lns |")
        w("|---|---|---|---|---|---|---|---|---|")
        for lr in lrs:
            p, l = find(cells, L, "pre", lr=lr), find(cells, L, "lns", lr=lr)
            if p is None and l is None:
                continue
            w("| %g | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                lr, loss_cell(p), loss_cell(l), diff_cell(p, l), test_cell(welch(p, l)),
                g(p, "variance_growth", "x%.2f"), g(l, "variance_growth", "x%.2f"), g(p, "drop_deep_half", "%.2f"),
                g(l, "drop_deep_half", "%.2f")))
        bp, bl = best(cells, L, "pre"), best(cells, L, "lns")
        parts = ["%s %g (%d seed%s%s)" % (s, b[0]["lr"], b[0]["n"], "s" if b[0]["n"] > 1 else "",
                                          ", " + b[1] if b[1] else "") for s, b in (("pre", bp), ("lns", bl)) if b]
        line = "\nBest learning rate of those tried (lowest mean): " + "; ".join(parts)
        if bp and bl:
            line += "; each at its best: lns - pre = %s (%s)." % (diff_cell(bp[0], bl[0]),
                                                                  test_cell(welch(bp[0], bl[0])))
        w(line)
        w("")

    others = [c for c in cells if c["scheme"] not in ("pre", "lns") and close(c["lr"], SHARED_LR)
              and c["steps"] == STEPS and close(c["embed_std"], EMB)]
    for L in sorted({c["layers"] for c in others}):
        w("### Schemes, %d blocks, shared lr %g, %d steps\n" % (L, SHARED_LR, STEPS))
        w("| scheme | validation loss | - pre | Welch | variance growth | skip cost deep half (%) |")
        w("|---|---|---|---|---|---|")
        p = find(cells, L, "pre")
        for s in ("pre", "lns", "mix", "post", "scaled_init", "lns_scaled_init", "sandwich", "deepnorm"):
            c = find(cells, L, s)
            if c is None:
                continue
            d, t = (diff_cell(p, c), test_cell(welch(p, c))) if s != "pre" else ("-", "-")
            w("| %s | %s | %s | %s | %s | %s |" % (s, loss_cell(c), d, t, fmt(c.get("variance_growth"), "x%.2f"),
                                                  fmt(c.get("drop_deep_half"), "%.2f")))
        l, ls = find(cells, L, "lns"), find(cells, L, "lns_scaled_init")
        if ok(l) and ok(ls):
            w("\nscaled_init + LNS against LNS alone: %s (%s; paired by seed: %s)." % (
                diff_cell(l, ls), test_cell(welch(l, ls)), paired_cell(l, ls)))
        w("")

    emb_cells = [c for c in cells if not close(c["embed_std"], EMB)]
    for L in sorted({c["layers"] for c in emb_cells}):
        w("### Embedding std, %d blocks, shared lr %g\n" % (L, SHARED_LR))
        w("| embedding std | pre | lns | lns - pre | Welch |")
        w("|---|---|---|---|---|")
        for e in sorted({EMB} | {c["embed_std"] for c in emb_cells if c["layers"] == L}):
            p, l = find(cells, L, "pre", emb=e), find(cells, L, "lns", emb=e)
            w("| %.4g | %s | %s | %s | %s |" % (e, loss_cell(p), loss_cell(l), diff_cell(p, l), test_cell(welch(p, l))))
        w("")

    budget = sorted({(c["layers"], c["steps"]) for c in cells if c["steps"] != STEPS})
    for L in sorted({b[0] for b in budget}):
        w("### Budget, %d blocks, shared lr %g\n" % (L, SHARED_LR))
        w("| steps | pre | lns | lns - pre | Welch |")
        w("|---|---|---|---|---|")
        for steps in sorted({STEPS} | {b[1] for b in budget if b[0] == L}):
            p, l = find(cells, L, "pre", steps=steps), find(cells, L, "lns", steps=steps)
            w("| %d | %s | %s | %s | %s |" % (steps, loss_cell(p), loss_cell(l), diff_cell(p, l),
                                              test_cell(welch(p, l))))
        w("")

    w("\n".join(study_budget.table([dict(c, shape=None) for c in cells], depth_study.shape_of,
                                   lambda c: depth_study.STUDIES["width64"]["vocab"], "The budget, a confound")))

    for L in depths:
        p, l = find(cells, L, "pre"), find(cells, L, "lns")
        if not (p and p.get("drop_pct") and l and l.get("drop_pct")):
            continue
        w("### Per block, %d blocks, shared lr %g (mean over seeds: pre %d, lns %d)\n" % (
            L, SHARED_LR, p.get("n_diag", p["n"]), l.get("n_diag", l["n"])))
        w("| block | skip cost pre (%) | lns | angular distance pre (pi) | lns | residual variance pre | lns |")
        w("|---|---|---|---|---|---|---|")
        for b in range(L):
            w("| %d | %.2f | %.2f | %.4f | %.4f | %.4g | %.4g |" % (
                b, p["drop_pct"][b], l["drop_pct"][b], p["angular"][b], l["angular"][b], p["variance"][b],
                l["variance"][b]))
        w("")

    where = {"cpu": "on 2 cores shared with other work, nice 19", "cuda": "on one GPU"}
    for t in report.get("prior_timing", []) + [report.get("timing", {})]:
        if t.get("block_steps"):
            w("Measured%s: %d runs, %.0f block-steps in %.1f h of run time (%.4f s per block-step per job, "
              "%d job%s at a time %s).\n" % (
                  " (%s)" % t["file"] if "file" in t else "", t["runs"], t["block_steps"], t["seconds"] / 3600,
                  t["seconds"] / t["block_steps"], t.get("jobs", 1), "s" if t.get("jobs", 1) > 1 else "",
                  where["cpu" if "file" in t else report.get("device", "cpu")]))
    w(run_times(report))
    for i, (grid, names, secs) in enumerate(missing or []):
        w("")
        if not names:
            w("Every cell of the `%s` grid finished." % grid)
            continue
        listed = ": " + ", ".join("`%s`" % m for m in names) if i == 0 else ""
        w("Not run from the `%s` grid (%d cells)%s." % (grid, len(names), listed))
        if secs is not None:
            w("Projected time for them at the measured rate, %d job%s: %s." % (
                jobs, "s" if jobs > 1 else "", "%.1f h" % (secs / 3600) if secs >= 3600 else "%.0f min" % (secs / 60)))
    return "\n".join(out).rstrip() + "\n"


def run_times(report):
    """Wall time of one run (training, validation, the sweep and the diagnostics) by depth
    and steps, from the records' 'seconds' (the range over the runs)."""
    rows = report.get("timing", {}).get("by_shape") or []
    if not rows:
        return ""
    span = lambda a, b: "%.0f-%.0f s" % (a, b) if b < 120 else "%.1f-%.1f min" % (a / 60, b / 60)
    return ("Wall time of one run by blocks and steps (min-max over the recorded runs; a run resumed from its "
            "checkpoint records its last part only): %s.\n") % ", ".join(
        "%d blocks %d steps %s (%d runs)" % (L, steps, span(a, b), n) for L, steps, a, b, n in sorted(rows))


# ---- the study's findings, every sentence from the records ---------------------------------

def gap_points(pairs):
    """[(L, welch)] -> trend points [(L, diff, se)] of the depths with a test."""
    return [(L, t["diff"], t["se"]) for L, t in pairs if t and t["se"] > 0]


def fmt_gap(t, digits=3):
    """'-0.072 ± 0.013 (p = 0.005)': a Welch test's difference, error and p."""
    if t is None:
        return "one seed a side: no test"
    return ("%%+.%df ± %%.%df (p = %%s)" % (digits, digits)) % (t["diff"], t["se"], study_stats.fmt_p(t["p"]))


def fmt_gaps(pairs, digits=3):
    return ", ".join("%d: %s" % (L, fmt_gap(t, digits)) for L, t in pairs)


def n_sig(pairs, sign):
    """How many of the tests are significant in the direction SIGN (-1: b below a)."""
    return sum(1 for _, t in pairs if t and t["significant"] and t["diff"] * sign > 0)


def per_seed_trend(points, log=False):
    """points [(L, values over seeds)] -> the slope of the mean on log2(depth), each depth
    weighted by the standard error of its mean; log: of the mean of log2(value) (a ratio
    such as the variance growth changes by factors), None if a value is <= 0. None when a
    depth has one seed."""
    pts = []
    for L, v in points:
        if log:
            if any(x <= 0 for x in v):
                return None
            v = [math.log2(x) for x in v]
        if len(v) < 2 or study_stats.var(v) <= 0:
            return None
        pts.append((L, study_stats.mean(v), math.sqrt(study_stats.var(v) / len(v))))
    return study_stats.trend(pts)


def fmt_log_trend(tr):
    """The slope of log2(x): '+1.21 ± 0.20 in log2 per doubling of the depth (x2.31 per
    doubling; t = ...)'."""
    if tr is None:
        return "no trend (a depth with one seed, or a value <= 0)"
    return study_stats.fmt_trend(tr, 2, unit="in log2 per doubling of the depth (x%.2f per doubling;" % (
        2 ** tr["slope"])).replace("; (t =", "; t =")


def findings(report, label):
    """The study's claims as sentences and a table against the paper's claims, each number
    from the report (its run records) and each difference or trend with its test."""
    check_records(report)
    cells = report["cells"]
    depths = shared_depths(cells)
    shared = {L: (find(cells, L, "pre"), find(cells, L, "lns")) for L in depths}
    shared = {L: (p, l) for L, (p, l) in shared.items() if ok(p) and ok(l)}
    depths = sorted(shared)
    if not depths:
        return "No depth has both Pre-LN and LNS at the shared rate yet.\n"
    w = []
    sg = [(L, welch(*shared[L])) for L in depths]
    tr = study_stats.trend(gap_points(sg))
    w.append("### What the %s records say\n" % label)
    w.append("Generated by `depth_doc.py` from the same records as the tables; a difference or a trend is "
             "**significant** at p < 0.05 (Welch's t over the seeds; the slope on log2(depth) weighted by each "
             "depth's standard error), and otherwise the records do not resolve it.\n")
    lines = []
    lines.append("**LNS − Pre-LN at the shared rate %g** (one rate for both schemes; at the depths with a sweep it "
                 "is below both schemes' best): %s; LNS significantly lower at %d of %d depths, higher at %d. The "
                 "gap's slope on log2(depth) at this rate: %s." % (
                     SHARED_LR, fmt_gaps(sg), n_sig(sg, -1), len(sg), n_sig(sg, 1), study_stats.fmt_trend(tr, 3)))
    # each scheme's own loss against depth at the shared rate
    sl = {s: per_seed_trend([(L, shared[L][i]["losses"]) for L in depths]) for i, s in enumerate(("pre", "lns"))}
    lines.append("Validation loss against depth at the shared rate, slope on log2(depth): Pre-LN %s; LNS %s." % (
        study_stats.fmt_trend(sl["pre"], 3), study_stats.fmt_trend(sl["lns"], 3)))
    # each at its own best rate
    bests = []
    for L in depths:
        bp, bl = best(cells, L, "pre"), best(cells, L, "lns")
        if bp and bl:
            bests.append((L, bp, bl, welch(bp[0], bl[0])))
    if bests:
        bt = study_stats.trend(gap_points([(L, t) for L, _, _, t in bests]))
        lines.append("**Each scheme at its own best rate** (the depths with a sweep of both): %s. LNS significantly "
                     "lower at %d of %d; the gap's slope on log2(depth): %s." % (
                         "; ".join("%d blocks: Pre-LN %g (%d seed%s%s), LNS %g (%d seed%s%s), LNS − Pre-LN %s" % (
                             L, bp[0]["lr"], bp[0]["n"], "s" if bp[0]["n"] > 1 else "", ", " + bp[1] if bp[1] else "",
                             bl[0]["lr"], bl[0]["n"], "s" if bl[0]["n"] > 1 else "", ", " + bl[1] if bl[1] else "",
                             fmt_gap(t) if t else "%+.3f (one seed a side: no test)" % (
                                 bl[0]["mean"] - bp[0]["mean"])) for L, bp, bl, t in bests),
                         n_sig([(L, t) for L, _, _, t in bests], -1), len(bests), study_stats.fmt_trend(bt, 3)))
        rates_lower = []
        for L, _, _, _ in bests:
            both = [lr for lr in sweep_rates(cells, L, "pre") if lr in sweep_rates(cells, L, "lns")]
            pairs = [(find(cells, L, "pre", lr=lr), find(cells, L, "lns", lr=lr)) for lr in both]
            low = [1 for p, l in pairs if l["mean"] < p["mean"]]
            tests = [welch(p, l) for p, l in pairs]
            rates_lower.append("%d blocks %d of %d rates (significantly at %d of the %d with 2 or more seeds a side)" % (
                L, len(low), len(both), sum(1 for t in tests if t and t["significant"] and t["diff"] < 0),
                sum(1 for t in tests if t)))
        lines.append("LNS's mean below Pre-LN's at the same rate of a sweep: %s." % ", ".join(rates_lower))
    # variance growth and deep-half skip cost, per seed
    for key, what, unit in (("growth_by_seed", "Residual-variance growth over the blocks (last / first)", "x%.2f"),
                            ("deep_half_by_seed", "Skip cost of the deeper half of the blocks (perplexity increase "
                             "when one is skipped, %)", "%.2f")):
        pairs = [(L, welch(*shared[L], key=key)) for L in depths]
        pre_tr = per_seed_trend([(L, shared[L][0][key]) for L in depths if key in shared[L][0]], log=True)
        lines.append("%s at the shared rate, Pre-LN / LNS: %s; LNS − Pre-LN significantly lower at %d of %d depths, "
                     "higher at %d; Pre-LN's, in log2, against log2(depth): %s." % (
                         what, ", ".join("%d: %s / %s" % (L, unit % shared[L][0][k2], unit % shared[L][1][k2])
                                         for L in depths for k2 in [{"growth_by_seed": "variance_growth",
                                                                     "deep_half_by_seed": "drop_deep_half"}[key]]
                                         if shared[L][0].get(k2) is not None and shared[L][1].get(k2) is not None),
                         n_sig(pairs, -1), len(pairs), n_sig(pairs, 1), fmt_log_trend(pre_tr)))
    # the budget axis
    for L, steps in sorted({(c["layers"], c["steps"]) for c in cells if c["steps"] != STEPS}):
        p2, l2 = find(cells, L, "pre", steps=steps), find(cells, L, "lns", steps=steps)
        p1, l1 = shared.get(L, (None, None))
        if not (ok(p2) and ok(l2) and ok(p1) and ok(l1)):
            continue
        ch = study_stats.contrast([(1, l2["losses"]), (-1, p2["losses"]), (-1, l1["losses"]), (1, p1["losses"])]) \
            if min(len(x["losses"]) for x in (p1, l1, p2, l2)) > 1 else None
        lines.append("**Budget, %d blocks:** LNS − Pre-LN at %d steps %s, at %d steps %s; the change %s." % (
            L, steps, fmt_gap(welch(p2, l2)), STEPS, fmt_gap(welch(p1, l1)),
            study_stats.fmt_welch(ch, 3).replace("Welch t", "t") if ch else "one seed: no test"))
    # the other schemes at the shared rate
    for L in sorted({c["layers"] for c in cells if c["scheme"] not in ("pre", "lns") and close(c["lr"], SHARED_LR)
                     and c["steps"] == STEPS and close(c["embed_std"], EMB)}):
        p, l = find(cells, L, "pre"), find(cells, L, "lns")
        parts = []
        for s in ("mix", "post", "scaled_init", "lns_scaled_init", "sandwich", "deepnorm"):
            c = find(cells, L, s)
            if c is None:
                continue
            if not ok(c):
                parts.append("%s diverged in %d seed%s" % (s, len(c["diverged_seeds"]),
                                                           "s" if len(c["diverged_seeds"]) > 1 else ""))
                continue
            parts.append("%s − Pre-LN %s, %s − LNS %s%s" % (
                s, fmt_gap(welch(p, c)) if welch(p, c) else "%+.3f (one seed)" % (c["mean"] - p["mean"]),
                s, fmt_gap(welch(l, c)) if welch(l, c) else "%+.3f (one seed)" % (c["mean"] - l["mean"]),
                ", %d diverged" % len(c["diverged_seeds"]) if c.get("diverged_seeds") else ""))
        if parts:
            lines.append("**Other schemes, %d blocks, shared rate:** %s." % (L, "; ".join(parts)))
    # the embedding's initial std
    for L, e in sorted({(c["layers"], c["embed_std"]) for c in cells if not close(c["embed_std"], EMB)}):
        pe, le = find(cells, L, "pre", emb=e), find(cells, L, "lns", emb=e)
        p, l = find(cells, L, "pre"), find(cells, L, "lns")
        if ok(pe) and ok(le) and ok(p) and ok(l):
            lines.append("**Embedding std %.3g, %d blocks:** LNS − Pre-LN %s (at 0.02: %s); Pre-LN %.3g − 0.02 %s; "
                         "LNS %.3g − 0.02 %s." % (e, L, fmt_gap(welch(pe, le)),
                                                   fmt_gap(welch(p, l)), e,
                                                   fmt_gap(welch(p, pe)), e,
                                                   fmt_gap(welch(l, le))))
    w += ["- " + x for x in lines]
    w.append("")
    w += claims_table(cells, shared, depths, sg, tr, bests if bests else [])
    return "\n".join(w).rstrip() + "\n"


def claims_table(cells, shared, depths, sg, tr, bests):
    """The paper's claims, each with what these records say and the test behind it."""
    def verdict(sig_for, sig_against, n):
        if n == 0:
            return "untested (one seed a side)"
        if sig_for == n:
            return "reproduced"
        if sig_against and not sig_for:
            return "**reversed**"
        if sig_for:
            return "partly (%d of %d)" % (sig_for, n)
        return "not resolved"

    rows = []
    lo, hi = depths[0], depths[-1]
    g = [(L, welch(*shared[L], key="growth_by_seed")) for L in depths]
    pre_g = per_seed_trend([(L, shared[L][0]["growth_by_seed"]) for L in depths if "growth_by_seed" in shared[L][0]],
                           log=True)
    rows.append(("Pre-LN's residual variance grows with depth; LNS bounds it",
                 "Pre-LN x%.2f (%d blocks) to x%.2f (%d), slope %s; LNS x%.2f to x%.2f, below Pre-LN at %d of %d "
                 "depths (Welch)" % (shared[lo][0]["variance_growth"], lo, shared[hi][0]["variance_growth"], hi,
                                     fmt_log_trend(pre_g), shared[lo][1]["variance_growth"],
                                     shared[hi][1]["variance_growth"], n_sig(g, -1), len(g)),
                 verdict(n_sig(g, -1) if pre_g and pre_g["significant"] and pre_g["slope"] > 0 else 0, n_sig(g, 1),
                         len(g))))
    pre_d = per_seed_trend([(L, shared[L][0]["deep_half_by_seed"]) for L in depths
                            if "deep_half_by_seed" in shared[L][0]], log=True)
    rows.append(("Pre-LN's deep blocks matter little, less with depth (layer removal)",
                 "deep half's skip cost %.2f%% (%d blocks) to %.2f%% (%d), slope %s" % (
                     shared[lo][0]["drop_deep_half"], lo, shared[hi][0]["drop_deep_half"], hi,
                     fmt_log_trend(pre_d)),
                 "not measured" if not pre_d else "reproduced" if pre_d["significant"] and pre_d["slope"] < 0
                 else "**reversed**" if pre_d["significant"] else "not resolved"))
    bt = [(L, t) for L, _, _, t in bests]
    rows.append(("LNS reaches a lower loss than Pre-LN",
                 "shared rate: lower at %d of %d depths (Welch); each at its best rate: lower at %d of %d depths "
                 "with a sweep (%d with one seed a side, untested)" % (
                     n_sig(sg, -1), len(sg), n_sig(bt, -1), len(bt), sum(1 for _, t in bt if t is None)),
                 verdict(n_sig(bt, -1), n_sig(bt, 1), sum(1 for _, t in bt if t)) + " at the best rates" if bt else
                 verdict(n_sig(sg, -1), n_sig(sg, 1), len(sg)) + " at the shared rate"))
    btr = study_stats.trend(gap_points(bt))
    rows.append(("LNS's advantage grows with depth",
                 "each at its best rate: %s; at the shared rate %g: %s" % (
                     study_stats.fmt_trend(btr, 3), SHARED_LR, study_stats.fmt_trend(tr, 3)),
                 ("reproduced" if btr["significant"] and btr["slope"] < 0 else "not resolved" if not btr["significant"]
                  else "**reversed**") + " at the best rates" if btr else
                 "not measured at the best rates; %s at the shared rate" % (
                     "grows" if tr and tr["significant"] and tr["slope"] < 0 else "not resolved")))
    d = [(L, welch(*shared[L], key="deep_half_by_seed")) for L in depths]
    rows.append(("LNS makes the deep blocks useful (a larger skip cost than Pre-LN's)",
                 "LNS's deep half costs more when skipped at %d of %d depths, less at %d (Welch)" % (
                     n_sig(d, 1), len(d), n_sig(d, -1)),
                 verdict(n_sig(d, 1), n_sig(d, -1), len(d))))
    for s, name in (("post", "Post-LN"), ("mix", "Mix-LN")):
        pairs = [(L, welch(find(cells, L, s), shared[L][1])) for L in depths if ok(find(cells, L, s))]
        if pairs:
            rows.append(("LNS reaches a lower loss than %s" % name,
                         "shared rate: LNS − %s %s" % (name, fmt_gaps(pairs)),
                         verdict(n_sig(pairs, -1), n_sig(pairs, 1), sum(1 for _, t in pairs if t))))
    post = [c for c in cells if c["scheme"] == "post"]
    if post:
        rows.append(("Post-LN diverges at depth", ", ".join(
            "%d blocks: %d of %d seeds diverged" % (c["layers"], len(c["diverged_seeds"]),
                                                    c["n"] + len(c["diverged_seeds"])) for c in post),
            "reproduced" if any(c["diverged_seeds"] for c in post) else "not seen"))
    sc = [(L, welch(shared[L][1], find(cells, L, "lns_scaled_init"))) for L in depths
          if ok(find(cells, L, "lns_scaled_init"))]
    if sc:
        rows.append(("scaled_init undermines LNS (LNS from scaled_init's weights is worse)",
                     "LNS with scaled_init − LNS: %s" % fmt_gaps(sc),
                     verdict(n_sig(sc, 1), n_sig(sc, -1), sum(1 for _, t in sc if t))))
    w = ["| the paper's claim | these records | verdict |", "|---|---|---|"]
    w += ["| %s | %s | %s |" % r for r in rows]
    return w + [""]
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report")
    ap.add_argument("--doc", default="docs/depth_study.md")
    ap.add_argument("--grid", default="", help="grids whose unfinished cells to count, e.g. session,full "
                    "(with --study; the first one's are listed)")
    ap.add_argument("--study", default="", help="the study directory, for --grid")
    ap.add_argument("--jobs", type=int, default=2, help="jobs in parallel, for the projection")
    ap.add_argument("--record", default="docs/depth_study_runs", help="the run records (depth_study.py --record)")
    ap.add_argument("--marker", default="depth_doc", help="the tables go between '<!-- MARKER:begin -->' and "
                    "'<!-- MARKER:end -->' (depth_doc_cuda: the GPU study's)")
    ap.add_argument("--against", default="", help="another device's report.json: a table of the "
                    "configurations both ran")
    ap.add_argument("--against_label", default="CPU (f32)", help="that study's name in the table")
    args = ap.parse_args(argv)
    BEGIN, END = markers(args.marker)
    try:
        with open(args.report) as f:
            report = json.load(f)
        with open(args.doc) as f:
            doc = f.read()
    except (OSError, json.JSONDecodeError) as e:
        print("depth_doc: %s" % e, file=sys.stderr)
        return 1
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):  # before any work
        print("depth_doc: %s: needs one '%s' line before one '%s' line" % (args.doc, BEGIN, END), file=sys.stderr)
        return 1
    missing = []
    prior = depth_study.prior_names(args.record)
    for grid in dict.fromkeys(filter(None, args.grid.split(","))):  # in order, once each
        todo = [c for c in depth_study.grid(grid) if not depth_study.finished(c, args.study, args.record, prior)]
        t = report.get("timing", {})
        if not t.get("block_steps"):  # no run of this session yet: the earlier session's rate
            t = next((p for p in report.get("prior_timing", []) if p.get("block_steps")), {})
        secs = None
        if t.get("block_steps"):
            secs = sum(depth_study.cost(c) for c in todo) * t["seconds"] / t["block_steps"] / max(1, args.jobs)
        missing.append((grid, [depth_study.run_name(c) for c in todo], secs))
    try:
        body = tables(report, missing, args.jobs)
        body += "\n" + findings(report, "GPU (bf16)" if report.get("device") == "cuda" else "CPU (f32)")
    except DocError as e:
        print("depth_doc: %s: %s" % (args.report, e), file=sys.stderr)
        return 1
    if args.against:
        try:
            with open(args.against) as f:
                body += "\n" + against(report, json.load(f), args.against_label)
        except (OSError, json.JSONDecodeError, KeyError, DocError) as e:
            print("depth_doc: --against=%s: %s" % (args.against, e), file=sys.stderr)
            return 1
    doc_markers.replace_between(args.doc, BEGIN, END, body)
    print("depth_doc: tables written into %s" % args.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
