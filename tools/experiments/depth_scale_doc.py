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

A difference is called one only where Welch's t over the seeds is significant at 5%
(study_stats.py; >= 2 seeds a side), and a trend with depth is the slope of the gap on
log2(depth) with its standard error; each statistic is printed beside its claim. The
width-512 records must have been evaluated on sequences spread over the whole validation
file (lns_eval --eval_spread, their "eval" field): a record without it is refused. Each
study's cells are listed with their parameters and tokens per parameter, beside the
paper's budgets (study_budget.py). Writes the tables between the
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
import study_budget  # noqa: E402
import study_stats  # noqa: E402
from depth_report import mean, sample_std  # noqa: E402

BEGIN, END = "<!-- depth_scale:begin -->", "<!-- depth_scale:end -->"
STUDIES = (("width 64", "docs/depth_study_runs_cuda"), ("width 512", "docs/depth_study_scale_runs_cuda"))
CROSSCHECK = "docs/depth_study_scale_crosscheck.json"
MEASURED = "docs/depth_study_scale_runs/measurements"  # the runs without a GPU (measured_section)


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
        out[k] = (lr, sorted(by_lr[lr], key=lambda r: r["cell"]["seed"]), len(by_lr))
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
            lr, rs, n_rates = best[(L, s)]
            ps = per_seed(rs)
            seeds[s] = ps
            row[s] = dict(lr=lr, rates=n_rates, **{q: spread(list(ps[q].values())) for q in ("loss", "deep", "shallow", "growth")
                                    if ps[q]})
        for q in ("loss", "deep", "growth"):
            if q in row["pre"] and q in row["lns"]:
                a, b = row["pre"][q], row["lns"][q]
                d = dict(diff=b["mean"] - a["mean"], apart=apart(a, b), welch=study_stats.welch(a["values"],
                                                                                                b["values"]))
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
    """A difference's Welch test, as the tables print it."""
    if d is None:
        return "—"
    return study_stats.verdict(d.get("welch"))


def welch_cell(d):
    w = (d or {}).get("welch")
    return "t = %s, df %.1f" % (study_stats.fmt_t(w["t"]), w["df"]) if w else "—"


def swept(r):
    """Both schemes at their best of a sweep (more than one rate tried at this depth)."""
    return r["pre"]["rates"] > 1 and r["lns"]["rates"] > 1


def gap_trend(rows, q="loss"):
    """The slope of LNS − Pre-LN on log2(depth) over the depths where both schemes are at
    their own best rate (a depth with one rate only compares at a shared rate: left out),
    each weighted by its Welch standard error."""
    pts = [(r["layers"], r[q + "_cmp"]["welch"]["diff"], r[q + "_cmp"]["welch"]["se"]) for r in rows
           if swept(r) and (r.get(q + "_cmp") or {}).get("welch") and r[q + "_cmp"]["welch"]["se"] > 0]
    return study_stats.trend(pts)


def lr_cell(side):
    return "%g" % side["lr"] if side["rates"] > 1 else "%g (the only rate run)" % side["lr"]


def answers(rows):
    """One line per question for a study's rows (Q4's table)."""
    if not rows:
        return dict(q1="not run", q2="not run", q3="not run")
    lower = [r for r in rows if "loss_cmp" in r and r["loss_cmp"]["diff"] < 0]
    sig = [r for r in lower if (r["loss_cmp"].get("welch") or {}).get("significant")]
    gaps = [(r["layers"], r["loss_cmp"]["diff"]) for r in rows if "loss_cmp" in r]
    tr = gap_trend(rows)
    if tr is None:
        trend = "fewer than 2 depths with both schemes at their best rate, no trend yet"
    else:
        trend = "the gap's slope on log2(depth) %s: %s" % (
            ("is significant" if tr["significant"] else "is not significant"), study_stats.fmt_trend(tr, 3))
    q1 = "LNS lower at %d of %d depths (%d significant, Welch p < 0.05); %s (gaps %s)" % (
        len(lower), len(gaps), len(sig), trend, ", ".join("%d: %+.3f" % g for g in gaps))
    deep = [(r["layers"], r["deep_cmp"]) for r in rows if "deep_cmp" in r]
    more = [L for L, d in deep if d["diff"] > 0]
    q2 = "skipping a deep-half block costs more under LNS at %d of %d depths (%s)" % (
        len(more), len(deep), ", ".join("%d: %+.2f%%, %s" % (
            L, d["diff"], "p = %s" % study_stats.fmt_p(d["welch"]["p"]) if d.get("welch") else "1 seed")
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
    w.append("Q1, validation loss (mean ± std over seeds (n)), each scheme at its best rate where the depth has a "
             "sweep (else at the one rate run there, marked); Welch's t over the seeds, significant at p < 0.05:\n")
    w.append("| blocks | Pre-LN lr | Pre-LN | LNS lr | LNS | LNS − Pre-LN | se | Welch | paired, same sign | |")
    w.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        d = r.get("loss_cmp", {})
        p = d.get("paired")
        w.append("| %d | %s | %s | %s | %s | %+.4f | %s | %s | %s | %s |" % (
            r["layers"], lr_cell(r["pre"]), fmt(r["pre"].get("loss"), 4), lr_cell(r["lns"]), fmt(r["lns"].get("loss"), 4),
            d.get("diff", float("nan")), "%.4f" % d["se"] if d.get("se") is not None else "—", welch_cell(d),
            ("%+.4f (%d), %s" % (p["mean"], p["n"], "yes" if p["same_sign"] else "no")) if p else "—", verdict(d)))
    shared = [str(r["layers"]) for r in rows if not swept(r)]
    w.append("\nThe gap against depth, each scheme at its own best rate: %s%s.\n" % (
        study_stats.fmt_trend(gap_trend(rows)), "; left out, one rate only (a shared-rate comparison): %s blocks"
        % ", ".join(shared) if shared else ""))
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


def check_eval(name, runs):
    """The width-512 study's runs must have been evaluated spread over the validation file
    (issue 45: its first 131,072 tokens are 91% dictionaries)."""
    if name != "width 512":
        return
    for r in runs:
        if r.get("status") == "ok" and not (r.get("eval") or {}).get("spread"):
            raise DocError("%s: evaluated on the first validation tokens, not spread over the file (no \"eval\": "
                           "{\"spread\": true}); rerun it with the current depth_study.py" % r.get("dir", "a record"))


def eval_line(name, runs):
    """Which validation tokens the study's losses are over, from its records."""
    specs = sorted({(r["eval"].get("tokens"), bool(r["eval"].get("spread"))) for r in runs
                    if r.get("status") == "ok" and r.get("eval")})
    unrecorded = sum(1 for r in runs if r.get("status") == "ok" and not r.get("eval"))
    parts = ["%s tokens %s (%d records)" % (format(t, ",") if t else "?", "spread over the whole validation file"
                                           if sp else "from the start of the validation file",
                                           sum(1 for r in runs if (r.get("eval") or {}).get("tokens") == t and
                                               bool(r["eval"].get("spread")) == sp)) for t, sp in specs]
    if unrecorded:
        parts.append("not recorded in %d records (written before the records kept it: the runner evaluated the "
                     "first %s validation tokens)" % (unrecorded, format(16384, ",")))
    return "- %s: %s." % (name, "; ".join(parts) if parts else "no run yet")


def measured_section(folder):
    """What was measured without a GPU, from its records (MEASURED): the CPU's first steps of
    the smallest width-512 cell (scale_crosscheck.py --cpu_only) and the cross-check of the
    miniature's smallest cell with the CUDA side under the emulator (tests/gpu/
    test_scale_crosscheck.py, LNS_CROSSCHECK_KEEP). A record missing a figure is refused."""
    import depth_study
    w = ["### Measured without a GPU\n"]
    cpu, emu = os.path.join(folder, "cpu_steps.json"), os.path.join(folder, "crosscheck_emulated.json")
    if not os.path.exists(cpu) and not os.path.exists(emu):
        return w + ["No measurement recorded in `%s`." % folder, ""]
    try:
        if os.path.exists(cpu):
            r = depth_report.load_json(cpu)
            if r.get("kind") != "cpu_steps":
                raise DocError("%s: 'kind' is %r, expected 'cpu_steps'" % (cpu, r.get("kind")))
            rows = r["rows"]
            vocab = r.get("vocab", depth_study.STUDIES["scale"]["vocab"])
            mean_s = sum(x["step_time_s"] for x in rows) / len(rows)
            w.append("- The CPU, f32 (`%s`, %s): `%s`'s first %d steps on %d cores (%d threads, nice %d%s) took %s "
                     "(%s tokens/s), with losses %s against ln %d = %.3f at initialisation; at their mean step time "
                     "its %d steps would take about %.0f hours, so the cross-check compares the first steps only." % (
                         cpu, r["date"], r["name"], r["steps"],
                         r["cores"], r["cpu_threads"], r["nice"], ", load average %.1f from other work" % r["load_average"]
                         if "load_average" in r else "", ", ".join("%.0f s" % x["step_time_s"] for x in rows),
                         " to ".join("%.0f" % v for v in (min(x["tokens_per_s"] for x in rows),
                                                          max(x["tokens_per_s"] for x in rows))),
                         ", ".join("%.4f" % x["loss"] for x in rows), vocab, math.log(vocab), r["cell"]["steps"],
                         r["cell"]["steps"] * mean_s / 3600))
        if os.path.exists(emu):
            r = depth_report.load_json(emu)
            if r.get("kind") != "crosscheck" or r.get("cuda_on") != "emulator":
                raise DocError("%s: expected a cross-check record whose CUDA side ran on the emulator (kind %r, "
                               "cuda_on %r)" % (emu, r.get("kind"), r.get("cuda_on")))
            w.append("- The cross-check with its CUDA side under the emulator (`%s`, %s): `%s`, %d steps; the "
                     "largest |gap| is %.3f%% of the CPU loss and the gradient norms differ by %.2f%% at most." % (
                         emu, r["date"], r["name"], r["steps"], 100 * r["max_rel_gap"],
                         100 * max(x["grad_norm_rel"] for x in r["rows"])))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise DocError("%s: a record without a figure the page gives (%s)" % (folder, e))
    return w + [""]


def render(studies, crosscheck="", measured=""):
    import depth_study
    w = ["Generated by `tools/experiments/depth_scale_doc.py` from the run records "
         "(%s)." % ", ".join("%s: `%s`, %d runs" % (n, d, len(runs)) for n, d, runs, _ in studies), ""]
    w.append("Evaluation sample of each study's validation losses:\n")
    w += [eval_line(n, runs) for n, _, runs, _ in studies]
    w.append("")
    vocab = lambda c: depth_study.STUDIES["scale" if c.get("shape") else "width64"]["vocab"]
    # the width-512 grid's cells by design (every sweep taken as finished), run or not
    cells = [r["cell"] for _, _, runs, _ in studies for r in runs] + depth_study.grid("scale", lambda c: 1.0)
    if cells:
        w += study_budget.table(cells, depth_study.shape_of, vocab, "The budget, a confound")
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
    if measured:
        w.append("")
        w += measured_section(measured)
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
    ap.add_argument("--measured", default=MEASURED, help="the records of what was measured without a GPU")
    ap.add_argument("--doc", default="docs/depth_study_scale.md")
    ap.add_argument("--plots", default="", help="folder for the three figures (none without)")
    args = ap.parse_args(argv)
    try:
        studies = []
        for name, path in (("width 64", args.width64), ("width 512", args.scale)):
            runs = [r for r in depth_report.find_records(path) if r.get("status") in ("ok", "diverged")]
            check_eval(name, runs)
            studies.append((name, path, runs, rows_of(runs)))
        text = render(studies, args.crosscheck, args.measured)
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
