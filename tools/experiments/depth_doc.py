#!/usr/bin/env python3
"""Writes the depth study's tables (from depth_report.py's report.json) into
docs/depth_study.md, between the lines "<!-- depth_doc:begin -->" and
"<!-- depth_doc:end -->" (--marker depth_doc_cuda: the GPU study's lines); the prose
around them is left alone.

    python3 tools/experiments/depth_doc.py runs/depth_study_v2/report.json [--doc docs/depth_study.md]
        [--grid session --study runs/depth_study_v2 --jobs 2]

With --grid it also lists the cells that have not finished and the projected time to
run them, from the measured wall time per block-step of the finished runs.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import depth_study  # noqa: E402  (the grid, the run names and the cost model)
import doc_markers  # noqa: E402  (the generated part of the page)

def markers(name="depth_doc"):
    """The lines the tables go between; the GPU study has its own (depth_doc_cuda)."""
    return "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name

PRIOR_MARK = " *"  # a configuration only summarised (its runs were not kept)
SHARED_LR, STEPS, EMB = depth_study.SHARED_LR, depth_study.STEPS, 0.02


def close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def find(cells, layers, scheme, lr=SHARED_LR, steps=STEPS, emb=EMB):
    for c in cells:
        if c["layers"] == layers and c["scheme"] == scheme and close(c["lr"], lr) and c["steps"] == steps \
                and close(c["embed_std"], emb):
            return c
    return None


def loss_cell(c):
    """'5.1234 +- 0.0100 (3)': mean validation loss, sample std over seeds, seeds."""
    if c is None:
        return "not run"
    if not c["n"]:
        return "diverged (%d)" % len(c["diverged_seeds"])
    std = " +- %.4f" % c["std"] if c.get("std") is not None else ""
    div = ", %d diverged" % len(c["diverged_seeds"]) if c.get("diverged_seeds") else ""
    # all seeds summarised: '(1) *'; some: '(3, 1 *)'
    part = ", %d%s" % (len(c["prior_seeds"]), PRIOR_MARK) if c.get("prior_seeds") and not c.get("prior") else ""
    return "%.4f%s (%d%s%s)%s" % (c["mean"], std, c["n"], part, div, PRIOR_MARK if c.get("prior") else "")


def comparison(report, a, b):
    if a is None or b is None:
        return None
    for cmp in report["comparisons"]:
        if cmp["a"] == a["name"] and cmp["b"] == b["name"]:
            return cmp
    return None


def diff_cells(cmp):
    if cmp is None or "diff" not in cmp:
        return "-", "-", "-"
    se = "%.4f" % cmp["se"] if cmp["se"] is not None else "-"
    beyond = {True: "yes", False: "no"}.get(cmp["beyond_spread"],
                                            "one seed" if min(cmp["n_a"], cmp["n_b"]) < 2 else "not known")
    return "%+.4f" % cmp["diff"], se, beyond


def paired_cell(cmp):
    """Per-seed differences: '-0.0700 +- 0.0100, all 3 same sign'."""
    p = (cmp or {}).get("paired")
    if not p or p["n"] < 2:
        return "-"
    return "%+.4f +- %.4f, %s" % (p["mean"], p["std"], "all %d same sign" % p["n"] if p["same_sign"] else "mixed signs")


def fmt(x, spec):
    return spec % x if x is not None else "-"


def against(report, other, label):
    """Every configuration of REPORT that OTHER (a study on another device) also ran: the
    two means, their difference and whether the seed ranges overlap."""
    cells = [c for c in report["cells"] if c["n"]]
    rows = []
    for c in cells:
        o = find(other["cells"], c["layers"], c["scheme"], lr=c["lr"], steps=c["steps"], emb=c["embed_std"])
        if o is None or not o["n"]:
            continue
        overlap = "-"
        if c.get("std") is not None and o.get("std") is not None and "max" in c and "max" in o:
            overlap = "yes" if c["min"] <= o["max"] and o["min"] <= c["max"] else "no"
        rows.append("| %d | %s | %g | %d | %s | %s | %+.4f | %s |" % (
            c["layers"], c["scheme"], c["lr"], c["steps"], "%.4g" % c["embed_std"], loss_cell(o) + " / " +
            loss_cell(c), c["mean"] - o["mean"], overlap))
    if not rows:
        return ""
    diffs = [float(r.split(" | ")[6]) for r in rows]
    return "\n".join(["### Against the %s study\n" % label,
                      "Each configuration both studies ran: validation loss there / here (seeds), the difference "
                      "here - there, and whether the two seed ranges overlap (`-`: one seed on a side).\n",
                      "| blocks | scheme | lr | steps | embedding std | %s / this study | difference | ranges overlap |"
                      % label, "|---|---|---|---|---|---|---|---|"] + rows +
                     ["", "%d configurations; difference mean %+.4f, largest %+.4f.\n" % (
                         len(rows), sum(diffs) / len(diffs), max(diffs, key=abs))])


def tables(report, missing=(), jobs=2):
    """The Markdown tables; missing: (grid, names of its unfinished cells, projected seconds)
    per grid, the first one's names listed."""
    cells = report["cells"]
    out = []
    w = out.append
    depths = sorted({c["layers"] for c in cells if c["scheme"] in ("pre", "lns") and close(c["lr"], SHARED_LR)
                     and c["steps"] == STEPS and close(c["embed_std"], EMB)})
    w("### Depth, shared learning rate %g, %d steps\n" % (SHARED_LR, STEPS))
    w("Validation loss: mean +- sample std over seeds (seeds). Difference = LNS - Pre-LN; "
      "\"beyond spread\": the seed ranges do not overlap; paired: the per-seed differences. "
      "`%s`: a configuration of an earlier session, summarised from its tables (its runs were not kept); "
      "`(3, 1 %s)`: 3 seeds, 1 of them such a summary.\n" % (PRIOR_MARK.strip(), PRIOR_MARK.strip()))
    w("| blocks | pre | lns | lns - pre | std error | beyond spread | paired by seed | ppl pre | ppl lns |"
      " variance growth pre | lns | skip cost deep half pre (%) | lns |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for L in depths:
        p, l = find(cells, L, "pre"), find(cells, L, "lns")
        cmp = comparison(report, p, l)
        d, se, beyond = diff_cells(cmp)
        g = lambda c, k, spec: fmt(c.get(k), spec) if c and c["n"] else "-"
        w("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            L, loss_cell(p), loss_cell(l), d, se, beyond, paired_cell(cmp), g(p, "ppl", "%.1f"), g(l, "ppl", "%.1f"),
            g(p, "variance_growth", "x%.2f"), g(l, "variance_growth", "x%.2f"),
            g(p, "drop_deep_half", "%.2f"), g(l, "drop_deep_half", "%.2f")))
    w("")

    lrs = sorted({c["lr"] for c in cells if c["steps"] == STEPS and close(c["embed_std"], EMB)
                  and c["scheme"] in ("pre", "lns")})
    sweep_depths = [L for L in depths if len({c["lr"] for c in cells if c["layers"] == L and c["steps"] == STEPS
                                             and close(c["embed_std"], EMB) and c["scheme"] in ("pre", "lns")}) > 1]
    for L in sweep_depths:
        w("### Learning-rate sweep, %d blocks, %d steps\n" % (L, STEPS))
        w("| peak lr | pre | lns | lns - pre | beyond spread | variance growth pre | lns |"
          " skip cost deep half pre (%) | lns |")
        w("|---|---|---|---|---|---|---|---|---|")
        for lr in lrs:
            p, l = find(cells, L, "pre", lr=lr), find(cells, L, "lns", lr=lr)
            if p is None and l is None:
                continue
            d, _, beyond = diff_cells(comparison(report, p, l))
            g = lambda c, k, spec: fmt(c.get(k), spec) if c and c["n"] else "-"
            w("| %g | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                lr, loss_cell(p), loss_cell(l), d, beyond, g(p, "variance_growth", "x%.2f"),
                g(l, "variance_growth", "x%.2f"), g(p, "drop_deep_half", "%.2f"), g(l, "drop_deep_half", "%.2f")))
        best = {b["scheme"]: b for b in report["best_lr"] if b["layers"] == L and b["steps"] == STEPS
                and close(b["embed_std"], EMB)}
        if best:
            line = "\nBest learning rate of those tried: " + "; ".join(
                "%s %g (loss %.4f, %d seed%s)" % (s, b["lr"], b["mean"], b["n"], "s" if b["n"] > 1 else "")
                for s, b in sorted(best.items()))
            if "pre" in best and "lns" in best:
                line += "; each at its best: lns - pre = %+.4f." % (best["lns"]["mean"] - best["pre"]["mean"])
            w(line)
        w("")

    others = [c for c in cells if c["scheme"] not in ("pre", "lns") and close(c["lr"], SHARED_LR)
              and c["steps"] == STEPS and close(c["embed_std"], EMB)]
    for L in sorted({c["layers"] for c in others}):
        w("### Schemes, %d blocks, lr %g, %d steps\n" % (L, SHARED_LR, STEPS))
        w("| scheme | validation loss | - pre | beyond spread | variance growth | skip cost deep half (%) |")
        w("|---|---|---|---|---|---|")
        p = find(cells, L, "pre")
        for s in ("pre", "lns", "mix", "post", "scaled_init", "lns_scaled_init", "sandwich", "deepnorm"):
            c = find(cells, L, s)
            if c is None:
                continue
            d, _, beyond = diff_cells(comparison(report, p, c)) if s != "pre" else ("-", "-", "-")
            w("| %s | %s | %s | %s | %s | %s |" % (s, loss_cell(c), d, beyond,
                                                  fmt(c.get("variance_growth"), "x%.2f"),
                                                  fmt(c.get("drop_deep_half"), "%.2f")))
        cmp = comparison(report, find(cells, L, "lns"), find(cells, L, "lns_scaled_init"))
        if cmp and "diff" in cmp:
            d, se, beyond = diff_cells(cmp)
            w("\nscaled_init + LNS against LNS alone: %s (std error %s, beyond spread: %s; paired by seed: %s)."
              % (d, se, beyond, paired_cell(cmp)))
        w("")

    emb_cells = [c for c in cells if not close(c["embed_std"], EMB)]
    for L in sorted({c["layers"] for c in emb_cells}):
        w("### Embedding std, %d blocks\n" % L)
        w("| embedding std | pre | lns | lns - pre |")
        w("|---|---|---|---|")
        for e in sorted({EMB} | {c["embed_std"] for c in emb_cells if c["layers"] == L}):
            p, l = find(cells, L, "pre", emb=e), find(cells, L, "lns", emb=e)
            w("| %.4g | %s | %s | %s |" % (e, loss_cell(p), loss_cell(l), diff_cells(comparison(report, p, l))[0]))
        w("")

    budget = sorted({(c["layers"], c["steps"]) for c in cells if c["steps"] != STEPS})
    for L in sorted({b[0] for b in budget}):
        w("### Budget, %d blocks, lr %g\n" % (L, SHARED_LR))
        w("| steps | pre | lns | lns - pre |")
        w("|---|---|---|---|")
        for steps in sorted({STEPS} | {b[1] for b in budget if b[0] == L}):
            p, l = find(cells, L, "pre", steps=steps), find(cells, L, "lns", steps=steps)
            w("| %d | %s | %s | %s |" % (steps, loss_cell(p), loss_cell(l), diff_cells(comparison(report, p, l))[0]))
        w("")

    for L in depths:
        p, l = find(cells, L, "pre"), find(cells, L, "lns")
        if not (p and p.get("drop_pct") and l and l.get("drop_pct")):
            continue
        w("### Per block, %d blocks (mean over seeds: pre %d, lns %d)\n" % (L, p.get("n_diag", p["n"]),
                                                                          l.get("n_diag", l["n"])))
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
    body = tables(report, missing, args.jobs)
    if args.against:
        try:
            with open(args.against) as f:
                body += "\n" + against(report, json.load(f), args.against_label)
        except (OSError, json.JSONDecodeError, KeyError) as e:
            print("depth_doc: --against=%s: %s" % (args.against, e), file=sys.stderr)
            return 1
    doc_markers.replace_between(args.doc, BEGIN, END, body)
    print("depth_doc: tables written into %s" % args.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
