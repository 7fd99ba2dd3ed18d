#!/usr/bin/env python3
"""The answers of the depth study at scale (docs/depth_study_scale.md, issue 31), beside
the width-64 study's, from the two studies' run records.

    python3 tools/experiments/depth_scale_doc.py [--doc docs/depth_study_scale.md] [--plots docs/images]

For each depth, each scheme at its own best learning rate (the lowest mean validation
loss among the rates tried with the most seeds at that depth), over its seeds:

  Q1  validation loss; LNS - Pre-LN, its standard error, paired by seed, and whether the
      seed ranges are apart ("beyond the spread"); does the gap grow with depth?
  Q2  the cost of skipping a block (lns_eval's perplexity increase, %): mean over the
      deeper half of the blocks and over the shallower half, per seed, then over seeds;
      do deep blocks matter more under LNS than under Pre-LN?
  Q3  the residual stream's variance growth (after the last block / after the first),
      per seed; is it bounded under LNS?
  Q4  each answer at width 64 and at width 512, side by side.

A difference is called one only where the two seed ranges do not overlap (>= 2 seeds a
side); otherwise the table says "within the spread". Writes the tables between the
"<!-- depth_scale:begin -->" and "<!-- depth_scale:end -->" lines of --doc, and with
--plots three figures (depth_scale_gap.png, depth_scale_skip.png, depth_scale_variance.png);
and the CPU f32 cross-check's record (--crosscheck, scale_crosscheck.py) as a table.
Every failure is one line "depth_scale_doc: ..." and exit status 1.
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import depth_report  # noqa: E402
import doc_markers  # noqa: E402
from depth_report import mean, sample_std  # noqa: E402

BEGIN, END = "<!-- depth_scale:begin -->", "<!-- depth_scale:end -->"
STUDIES = (("width 64", "docs/depth_study_runs_cuda"), ("width 512", "docs/depth_study_scale_runs_cuda"))
CROSSCHECK = "docs/depth_study_scale_crosscheck.json"


class DocError(Exception):
    pass


def spread(xs):
    """mean, sample std (None for one value), min, max, n"""
    return dict(mean=mean(xs), std=sample_std(xs), min=min(xs), max=max(xs), n=len(xs), values=xs)


def apart(a, b):
    """The seed ranges do not overlap (None: fewer than 2 seeds on a side)."""
    if a["n"] < 2 or b["n"] < 2:
        return None
    return a["max"] < b["min"] or b["max"] < a["min"]


def per_seed(runs):
    """Per-seed figures of one cell's ok runs: loss, deep- and shallow-half skip cost,
    variance growth."""
    out = {"loss": {}, "deep": {}, "shallow": {}, "growth": {}}
    for r in runs:
        s = r["cell"]["seed"]
        out["loss"][s] = r["loss"]
        if "drop_pct" in r and r["drop_pct"]:
            L = len(r["drop_pct"])
            out["shallow"][s] = mean(r["drop_pct"][:L // 2])
            out["deep"][s] = mean(r["drop_pct"][L // 2:])
        if "variance" in r and r["variance"] and r["variance"][0] > 0:
            out["growth"][s] = r["variance"][-1] / r["variance"][0]
    return out


def best_cells(runs):
    """{(layers, scheme): (lr, [ok runs])}: per depth and scheme the rate of the lowest
    mean loss among the rates with the most seeds (the width-64 study's default budget
    and embedding only)."""
    groups = {}
    for r in runs:
        c = r["cell"]
        if r.get("status") != "ok" or abs(c.get("embed_std", 0.02) - 0.02) > 1e-12:
            continue
        if not c.get("shape") and c["steps"] != 400:  # width 64: the budget axis is another question
            continue
        groups.setdefault((c["layers"], c["scheme"]), {}).setdefault(c["lr"], []).append(r)
    out = {}
    for k, by_lr in groups.items():
        most = max(len(v) for v in by_lr.values())
        lr = min((mean([r["loss"] for r in v]), lr) for lr, v in by_lr.items() if len(v) == most)[1]
        out[k] = (lr, sorted(by_lr[lr], key=lambda r: r["cell"]["seed"]))
    return out


def rows_of(runs):
    """Per depth where both Pre-LN and LNS ran: the figures of Q1-Q3."""
    best = best_cells(runs)
    rows = []
    for L in sorted({k[0] for k in best}):
        if (L, "pre") not in best or (L, "lns") not in best:
            continue
        row = dict(layers=L)
        seeds = {}
        for s in ("pre", "lns"):
            lr, rs = best[(L, s)]
            ps = per_seed(rs)
            seeds[s] = ps
            row[s] = dict(lr=lr, **{q: spread(list(ps[q].values())) for q in ("loss", "deep", "shallow", "growth")
                                    if ps[q]})
        for q in ("loss", "deep", "growth"):
            if q in row["pre"] and q in row["lns"]:
                a, b = row["pre"][q], row["lns"][q]
                d = dict(diff=b["mean"] - a["mean"], apart=apart(a, b))
                if a["std"] is not None and b["std"] is not None:
                    d["se"] = math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"])
                common = sorted(set(seeds["pre"][q]) & set(seeds["lns"][q]))
                if common:
                    pd = [seeds["lns"][q][s] - seeds["pre"][q][s] for s in common]
                    d["paired"] = dict(n=len(pd), mean=mean(pd), same_sign=len(pd) > 1 and (
                        all(x < 0 for x in pd) or all(x > 0 for x in pd)))
                row[q + "_cmp"] = d
        rows.append(row)
    return rows


def fmt(s, digits=3):
    if not s:
        return "—"
    f = "%%.%df" % digits
    return (f % s["mean"]) + ("" if s["std"] is None else " ± " + f % s["std"]) + " (%d)" % s["n"]


def verdict(d):
    if d is None:
        return "—"
    if d.get("apart") is None:
        return "one seed"
    return "**beyond the spread**" if d["apart"] else "within the spread"


def answers(rows):
    """One line per question for a study's rows (Q4's table)."""
    if not rows:
        return dict(q1="not run", q2="not run", q3="not run")
    lower = [r for r in rows if "loss_cmp" in r and r["loss_cmp"]["diff"] < 0]
    beyond = [r for r in lower if r["loss_cmp"].get("apart")]
    gaps = [(r["layers"], r["loss_cmp"]["diff"]) for r in rows if "loss_cmp" in r]
    grows = len(gaps) > 1 and all(b[1] < a[1] for a, b in zip(gaps, gaps[1:]))
    trend = ("the gap grows with depth" if grows else "the gap does not grow steadily with depth") \
        if len(gaps) > 1 else "one depth, no trend yet"
    q1 = "LNS lower at %d of %d depths (%d beyond the spread); %s (%s)" % (
        len(lower), len(gaps), len(beyond), trend, ", ".join("%d: %+.3f" % g for g in gaps))
    deep = [(r["layers"], r["deep_cmp"]) for r in rows if "deep_cmp" in r]
    more = [L for L, d in deep if d["diff"] > 0]
    q2 = "skipping a deep-half block costs more under LNS at %d of %d depths (%s)" % (
        len(more), len(deep), ", ".join("%d: %+.2f%% %s" % (L, d["diff"], "apart" if d.get("apart") else
                                                           "within" if d.get("apart") is False else "1 seed")
                                         for L, d in deep)) if deep else "no layer-removal sweep"
    gr = [(r["layers"], r["pre"].get("growth"), r["lns"].get("growth")) for r in rows]
    q3 = "variance growth Pre-LN / LNS: %s" % ", ".join(
        "%d: %.1f / %.1f" % (L, p["mean"], q["mean"]) for L, p, q in gr if p and q) if gr else "—"
    return dict(q1=q1, q2=q2, q3=q3)


def section(name, rows):
    w = []
    if not rows:
        return ["### %s\n" % name, "No depth has both Pre-LN and LNS recorded yet.\n"]
    w.append("### %s\n" % name)
    w.append("Q1, validation loss (mean ± std over seeds (n)), each scheme at its best rate:\n")
    w.append("| blocks | Pre-LN lr | Pre-LN | LNS lr | LNS | LNS − Pre-LN | se | paired, same sign | |")
    w.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        d = r.get("loss_cmp", {})
        p = d.get("paired")
        w.append("| %d | %g | %s | %g | %s | %+.4f | %s | %s | %s |" % (
            r["layers"], r["pre"]["lr"], fmt(r["pre"].get("loss"), 4), r["lns"]["lr"], fmt(r["lns"].get("loss"), 4),
            d.get("diff", float("nan")), "%.4f" % d["se"] if d.get("se") is not None else "—",
            ("%+.4f (%d), %s" % (p["mean"], p["n"], "yes" if p["same_sign"] else "no")) if p else "—", verdict(d)))
    w.append("\nQ2, skipping one block: perplexity increase (%), mean over the deeper and the shallower half of the "
             "blocks:\n")
    w.append("| blocks | Pre-LN deep half | LNS deep half | LNS − Pre-LN, deep | | Pre-LN shallow half | "
             "LNS shallow half |")
    w.append("|---|---|---|---|---|---|---|")
    for r in rows:
        d = r.get("deep_cmp")
        w.append("| %d | %s | %s | %s | %s | %s | %s |" % (
            r["layers"], fmt(r["pre"].get("deep"), 2), fmt(r["lns"].get("deep"), 2),
            "%+.2f" % d["diff"] if d else "—", verdict(d), fmt(r["pre"].get("shallow"), 2),
            fmt(r["lns"].get("shallow"), 2)))
    w.append("\nQ3, residual-stream variance after the last block over after the first:\n")
    w.append("| blocks | Pre-LN | LNS | |")
    w.append("|---|---|---|---|")
    for r in rows:
        w.append("| %d | %s | %s | %s |" % (r["layers"], fmt(r["pre"].get("growth"), 2), fmt(r["lns"].get("growth"), 2),
                                            verdict(r.get("growth_cmp"))))
    w.append("")
    return w


def crosscheck_section(path):
    """The CPU f32 cross-check's record (scale_crosscheck.py) as a table, or a line saying
    that it has not run."""
    w = ["### The CPU f32 cross-check of the smallest cell\n"]
    if not path or not os.path.exists(path):
        w.append("Not run yet: `STAGES=crosscheck bash tools/device/run_gpu.sh` on a GPU machine (its CPU "
                 "cores run the f32 side) writes the record `docs/depth_study_scale_crosscheck.json`.")
        return w
    rec = depth_report.load_json(path)
    try:
        rows = rec["rows"]
        w.append("`%s`, its first %d steps from the same weights and batches, %s (CPU: %d threads, %.0f s; "
                 "CUDA: %.0f s). Largest |gap|: **%.3f%%** of the CPU loss.\n"
                 % (rec["name"], rec["steps"], rec["date"], rec["cpu_threads"], rec["seconds"]["cpu"],
                    rec["seconds"]["cuda"], 100 * rec["max_rel_gap"]))
        w.append("| step | CPU f32 loss | CUDA bf16 loss | gap | gradient norm, CPU / CUDA |")
        w.append("|---|---|---|---|---|")
        for r in rows:
            w.append("| %d | %.5f | %.5f | %+.5f (%.3f%%) | %.4f / %.4f |" % (
                r["step"], r["cpu_loss"], r["cuda_loss"], r["gap"], 100 * r["rel_gap"], r["cpu_grad_norm"] or 0,
                r["cuda_grad_norm"] or 0))
    except (KeyError, TypeError, ValueError) as e:
        raise DocError("%s: not a cross-check record (%s)" % (path, e))
    return w


def render(studies, crosscheck=""):
    w = ["Generated by `tools/experiments/depth_scale_doc.py` from the run records "
         "(%s)." % ", ".join("%s: `%s`, %d runs" % (n, d, len(runs)) for n, d, runs, _ in studies), ""]
    w.append("### Q4, width 64 against width 512\n")
    w.append("| question | width 64 | width 512 |")
    w.append("|---|---|---|")
    ans = [answers(rows) for _, _, _, rows in studies]
    for q, title in (("q1", "Q1 loss, LNS against Pre-LN"), ("q2", "Q2 deep blocks when skipped"),
                     ("q3", "Q3 variance growth")):
        w.append("| %s | %s | %s |" % (title, ans[0][q], ans[1][q]))
    w.append("")
    for name, _, _, rows in studies:
        w += section(name, rows)
    w += crosscheck_section(crosscheck)
    return "\n".join(w) + "\n"


def save(plt, fig, ax, xlabel, ylabel, title, path):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plots(studies, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(out_dir, exist_ok=True)
    styles = {"width 64": "--", "width 512": "-"}
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, _, _, rows in studies:
        pts = [(r["layers"], r["loss_cmp"]["diff"], r["loss_cmp"].get("se") or 0) for r in rows if "loss_cmp" in r]
        if pts:
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                        linestyle=styles[name], label=name)
    ax.axhline(0, color="k", linewidth=0.5)
    ax.set_xscale("log", base=2)
    save(plt, fig, ax, "blocks", "LNS − Pre-LN validation loss (± se)", "Q1: the gap against depth",
         os.path.join(out_dir, "depth_scale_gap.png"))
    # Q2: the skip cost per block against relative depth, the deepest depth of each study
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, _, runs, rows in studies:
        if not rows:
            continue
        L = rows[-1]["layers"]
        best = best_cells(runs)
        for s, color in (("pre", "tab:blue"), ("lns", "tab:red")):
            rs = [r for r in best[(L, s)][1] if r.get("drop_pct")]
            if rs:
                prof = depth_report.per_block_mean([r["drop_pct"] for r in rs])
                ax.plot([(i + 0.5) / L for i in range(L)], prof, linestyle=styles[name], color=color,
                        label="%s, %s, %d blocks" % (s, name, L))
    ax.set_yscale("symlog", linthresh=1.0)
    save(plt, fig, ax, "block depth (fraction of the stack)", "perplexity increase when skipped (%)",
         "Q2: what each block is worth", os.path.join(out_dir, "depth_scale_skip.png"))
    # Q3: variance growth against depth
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, _, _, rows in studies:
        for s, color in (("pre", "tab:blue"), ("lns", "tab:red")):
            pts = [(r["layers"], r[s]["growth"]["mean"]) for r in rows if "growth" in r[s]]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", linestyle=styles[name], color=color,
                        label="%s, %s" % (s, name))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    save(plt, fig, ax, "blocks", "variance after the last block / after the first",
         "Q3: residual-stream variance growth", os.path.join(out_dir, "depth_scale_variance.png"))


def write_doc(doc, text, begin=BEGIN, end=END):
    try:
        doc_markers.replace_between(doc, begin, end, text)
    except (OSError, ValueError) as e:
        raise DocError(str(e) if isinstance(e, ValueError) else "%s: cannot read (%s)" % (doc, e.strerror or e))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width64", default=STUDIES[0][1], help="the width-64 study's records (GPU, bf16)")
    ap.add_argument("--scale", default=STUDIES[1][1], help="the scale study's records (GPU, bf16)")
    ap.add_argument("--crosscheck", default=CROSSCHECK, help="the CPU f32 cross-check's record (scale_crosscheck.py)")
    ap.add_argument("--doc", default="docs/depth_study_scale.md")
    ap.add_argument("--plots", default="", help="folder for the three figures (none without)")
    args = ap.parse_args(argv)
    try:
        studies = []
        for name, path in (("width 64", args.width64), ("width 512", args.scale)):
            runs = [r for r in depth_report.find_records(path) if r.get("status") in ("ok", "diverged")]
            studies.append((name, path, runs, rows_of(runs)))
        text = render(studies, args.crosscheck)
        if args.doc:
            write_doc(args.doc, text)
        else:
            sys.stdout.write(text)
        if args.plots:
            plots(studies, args.plots)
    except (DocError, depth_report.ReportError) as e:
        print("depth_scale_doc: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
