#!/usr/bin/env python3
"""FP8 at depth (docs/fp8_depth.md, issue 30): does FP8's damage grow with depth under
Pre-LN and stay flat under LNS? From the run records of depth_study.py --study fp8.

    python3 tools/experiments/fp8_depth_doc.py [--fp8 docs/fp8_depth_runs] \\
        [--baseline docs/depth_study_runs] [--doc docs/fp8_depth.md] [--plots docs/images]

Each FP8 run (--fp8=delayed) is paired with the run of the same cell and seed without
FP8 (the baseline study's record: the same initial weights and batches), and per depth
and scheme, over the seeds:

  Q1  the FP8 loss gap: FP8 minus baseline validation loss, per seed, then its mean and
      spread; does it grow from the shallowest to the deepest depth?
  Q2  the casts' health: the fraction of saturated and of flushed-to-zero values of each
      linear's input x, weight w and gradient dy (mean over the blocks, the logged steps
      and the seven linears), and its deeper half against its shallower half;
  Q3  LNS against Pre-LN (and Mix-LN against Pre-LN) at each depth: the difference of
      their FP8 gaps.

  Noise  the same cells' other-precision baseline (--noise: the GPU's bf16 records for the
      CPU's f32 study, and the other way round): per seed bf16 minus f32 without FP8, its
      root mean square beside the FP8 gap's, so a gap can be read against what a change of
      rounding alone does to the same seed.

A trend is the slope of the gap on log2(depth) with its standard error, a difference
Welch's t over the seeds (study_stats.py), each printed beside its claim and called
significant only at p < 0.05. Writes the tables between
"<!-- MARKER:begin -->" and "<!-- MARKER:end -->" of --doc (--marker: fp8_depth, or
fp8_depth_cuda for the GPU's records: a bf16 study of its own) and with --plots three
figures: PREFIX_gap.png, PREFIX_amax.png, PREFIX_health.png. Every failure is one line
"fp8_depth_doc: ..." and exit status 1.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import math  # noqa: E402

import depth_report  # noqa: E402
import study_stats  # noqa: E402
from depth_report import FP8_TENSORS, mean  # noqa: E402
from depth_scale_doc import DocError, fmt, save, spread, write_doc  # noqa: E402

SCHEMES = ("pre", "lns", "mix")
NAMES = {"pre": "Pre-LN", "lns": "LNS", "mix": "Mix-LN"}


def pair_key(c):
    """What an FP8 run and its baseline share: everything in the cell but --fp8 and the group."""
    return (c["layers"], c["scheme"], c["lr"], c["steps"], c["embed_std"], c.get("shape") or "", c["seed"])


def cells_of(fp8_runs, base_runs):
    """{(layers, scheme): per-seed figures} for every FP8 cell (ok runs; a diverged FP8
    or baseline run is listed, not averaged)."""
    base = {pair_key(r["cell"]): r for r in base_runs}
    out = {}
    for r in fp8_runs:
        c = r["cell"]
        cell = out.setdefault((c["layers"], c["scheme"]), dict(
            layers=c["layers"], scheme=c["scheme"], lr=c["lr"], steps=c["steps"], seeds={}, diverged=[],
            **({"shape": c["shape"]} if c.get("shape") else {})))
        b = base.get(pair_key(c))
        if r.get("status") != "ok" or (b is not None and b.get("status") != "ok"):
            cell["diverged"].append(c["seed"])
            continue
        h = r["fp8_health"]
        L = c["layers"]
        s = dict(loss=r["loss"], health={}, seconds=r.get("seconds"), layers=L)
        for t in FP8_TENSORS:
            ht = h[t]
            s["health"][t] = dict(sat=mean(ht["saturated_mean"]), flush=mean(ht["flushed_mean"]),
                                  sat_deep=mean(ht["saturated_mean"][L // 2:]),
                                  sat_shallow=mean(ht["saturated_mean"][:L // 2]),
                                  sat_max=max(ht["saturated_max"]),
                                  amax_growth=(ht["amax_last"][-1] / ht["amax_last"][0]) if ht["amax_last"][0] > 0
                                  else None)
        s["nonfinite"] = h.get("nonfinite", 0.0)
        if b is not None:
            s["base"] = b["loss"]
            s["gap"] = r["loss"] - b["loss"]
        cell["seeds"][c["seed"]] = s
    for cell in out.values():
        seeds = cell["seeds"]
        cell["fp8"] = spread([v["loss"] for v in seeds.values()]) if seeds else None
        paired = [v for v in seeds.values() if "gap" in v]
        cell["base"] = spread([v["base"] for v in paired]) if paired else None
        cell["gap"] = spread([v["gap"] for v in paired]) if paired else None
        cell["gap_pct"] = spread([100.0 * v["gap"] / v["base"] for v in paired]) if paired else None
        cell["health"] = {t: {k: spread([v["health"][t][k] for v in seeds.values()])
                              for k in ("sat", "flush", "sat_deep", "sat_shallow", "sat_max")}
                          for t in FP8_TENSORS} if seeds else None
        cell["nonfinite"] = sum(v["nonfinite"] for v in seeds.values())
    return out


def pct(s, digits=3):
    """A fraction's spread as a percentage."""
    if not s:
        return "—"
    return fmt(dict(s, mean=100 * s["mean"], std=None if s["std"] is None else 100 * s["std"]), digits)


def trend(cells, scheme):
    """Q1 for one scheme: the slope of the FP8 gap on log2(depth), each depth's mean gap
    weighted by its standard error over the seeds (std / sqrt(n))."""
    pts = sorted((L, c["gap"]) for (L, s), c in cells.items() if s == scheme and c["gap"])
    if not pts:
        return "not run", pts
    gaps = ", ".join("%d: %+.4f" % (L, g["mean"]) for L, g in pts)
    tr = study_stats.trend([(L, g["mean"], g["std"] / math.sqrt(g["n"])) for L, g in pts
                            if g["std"] is not None and g["std"] > 0])
    if tr is None:
        return "fewer than 2 depths with a spread over seeds, no trend (gaps %s)" % gaps, pts
    return "the gap's slope on log2(depth) is %s: %s (gaps %s)" % (
        "significant" if tr["significant"] else "not significant", study_stats.fmt_trend(tr), gaps), pts


def noise(fp8_runs, base_runs, other_runs):
    """{(layers, scheme): [other - base loss per seed]} for the baselines of FP8_RUNS
    (the same cell and seed without FP8) that both precisions ran."""
    paired = {pair_key(r["cell"]) for r in fp8_runs}
    other = {pair_key(r["cell"]): r for r in other_runs if r.get("status") == "ok" and not r["cell"].get("fp8")}
    out = {}
    for r in base_runs:
        o = other.get(pair_key(r["cell"]))
        if r.get("status") == "ok" and o is not None and pair_key(r["cell"]) in paired:
            out.setdefault((r["cell"]["layers"], r["cell"]["scheme"]), []).append(o["loss"] - r["loss"])
    return out


def rms(xs):
    return math.sqrt(sum(x * x for x in xs) / len(xs))


def render(cells, fp8_dir, base_dir, n_fp8, n_base, noise_ref=None, noise_dir="", vocab=4096):
    w = ["Generated by `tools/experiments/fp8_depth_doc.py` from the run records (FP8: `%s`, %d runs; "
         "without FP8: `%s`, %d runs)." % (fp8_dir, n_fp8, base_dir, n_base), ""]
    if not cells:
        return "\n".join(w + ["No FP8 run is recorded yet.", ""])
    import depth_study
    import study_budget
    w += study_budget.table([dict(c, layers=c["layers"]) for c in cells.values()], depth_study.shape_of,
                            lambda c: vocab, "The budget, a confound")
    w.append("### Q1, the FP8 loss gap against depth\n")
    w.append("FP8 minus the same seed without FP8, validation loss (mean ± std over seeds (n)):\n")
    w.append("| blocks | scheme | without FP8 | FP8 | gap | gap, % | diverged seeds |")
    w.append("|---|---|---|---|---|---|---|")
    for k in sorted(cells, key=lambda k: (k[0], SCHEMES.index(k[1]) if k[1] in SCHEMES else 9)):
        c = cells[k]
        w.append("| %d | %s | %s | %s | %s | %s | %s |" % (
            c["layers"], NAMES.get(c["scheme"], c["scheme"]), fmt(c["base"], 4), fmt(c["fp8"], 4),
            fmt(c["gap"], 4), fmt(c["gap_pct"], 2), ", ".join(map(str, c["diverged"])) or "—"))
    w.append("")
    for s in SCHEMES:
        w.append("- %s: %s." % (NAMES[s], trend(cells, s)[0]))
    if noise_ref is not None:
        w.append("\n### The noise reference: bf16 against f32, the same seeds without FP8\n")
        w.append("Per seed, the loss of the same cell and seed in the other precision (`%s`) minus this study's "
                 "baseline, its root mean square over the seeds, beside the root mean square of the FP8 gap: a "
                 "change of rounding alone moves a seed's loss by about this much.\n" % noise_dir)
        w.append("| blocks | scheme | FP8 gap, rms over seeds | bf16 − f32, rms over seeds | bf16 − f32 per seed |")
        w.append("|---|---|---|---|---|")
        for k in sorted(cells, key=lambda k: (k[0], SCHEMES.index(k[1]) if k[1] in SCHEMES else 9)):
            c, d = cells[k], noise_ref.get(k)
            g = [v["gap"] for v in c["seeds"].values() if "gap" in v]
            w.append("| %d | %s | %s | %s | %s |" % (
                c["layers"], NAMES.get(c["scheme"], c["scheme"]), "%.4f (%d)" % (rms(g), len(g)) if g else "—",
                "%.4f (%d)" % (rms(d), len(d)) if d else "not run", ", ".join("%+.4f" % x for x in d) if d else "—"))
    w.append("\n### Q2, the casts' health against depth\n")
    w.append("Saturated and flushed-to-zero values, % of each tensor's values (mean over the blocks, the logged "
             "steps and the seven linears, then over seeds); deep and shallow: the deeper and the shallower "
             "half of the blocks:\n")
    w.append("| blocks | scheme | x saturated | x flushed | w saturated | w flushed | dy saturated | dy flushed | "
             "x saturated, worst block and step | dy saturated, deep / shallow half | non-finite |")
    w.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in sorted(cells, key=lambda k: (k[0], SCHEMES.index(k[1]) if k[1] in SCHEMES else 9)):
        c = cells[k]
        h = c["health"]
        if not h:
            continue
        w.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %d |" % (
            c["layers"], NAMES.get(c["scheme"], c["scheme"]), pct(h["x"]["sat"]), pct(h["x"]["flush"]),
            pct(h["w"]["sat"]), pct(h["w"]["flush"]), pct(h["dy"]["sat"]), pct(h["dy"]["flush"]),
            pct(h["x"]["sat_max"], 2), pct(h["dy"]["sat_deep"]), pct(h["dy"]["sat_shallow"]), c["nonfinite"]))
    w.append("\n### Q3, LNS and Mix-LN against Pre-LN: the difference of FP8 gaps\n")
    w.append("| blocks | scheme | its gap | Pre-LN's gap | difference ± se | Welch | |")
    w.append("|---|---|---|---|---|---|---|")
    for L in sorted({k[0] for k in cells}):
        ref = cells.get((L, "pre"))
        for s in ("lns", "mix"):
            c = cells.get((L, s))
            if not ref or not c or not ref["gap"] or not c["gap"]:
                continue
            t = study_stats.welch(ref["gap"]["values"], c["gap"]["values"])
            w.append("| %d | %s | %s | %s | %s | %s | %s |" % (
                L, NAMES[s], fmt(c["gap"], 4), fmt(ref["gap"], 4),
                ("%+.4f ± %.4f" % (t["diff"], t["se"])) if t else "%+.4f" % (c["gap"]["mean"] - ref["gap"]["mean"]),
                ("t = %s, df %.1f" % (study_stats.fmt_t(t["t"]), t["df"])) if t else "—", study_stats.verdict(t)))
    w.append("")
    w += findings(cells, noise_ref)
    w += timing(fp8_runs_of(cells))
    return "\n".join(w) + "\n"


def order(cells):
    return sorted(cells, key=lambda k: (k[0], SCHEMES.index(k[1]) if k[1] in SCHEMES else 9))


def span(xs, f="%.4f"):
    """'a to b' (or 'a' when they are equal at that precision)."""
    lo, hi = f % min(xs), f % max(xs)
    return lo if lo == hi else "%s to %s" % (lo, hi)


def findings(cells, noise_ref=None):
    """The answers as sentences, every figure from the cells above (their records), each
    difference with Welch's t over the seeds and each trend with its slope's error."""
    w = ["### What the records say\n",
         "Generated from the same records as the tables; a difference is **significant** at p < 0.05 (Welch's t "
         "over the seeds), and otherwise the records do not resolve it.\n"]
    depths = sorted({k[0] for k in cells})
    gaps = {k: c["gap"] for k, c in cells.items() if c["gap"]}
    if not gaps:
        return w + ["No FP8 cell has its baseline yet.", ""]
    trends = {s: trend(cells, s)[0] for s in SCHEMES if any(k[1] == s for k in gaps)}
    sig = [NAMES[s] for s, t in trends.items() if t.startswith("the gap's slope on log2(depth) is significant")]
    w.append("- *The loss gap against depth.* The largest mean gap (FP8 − baseline, over seeds) of any scheme: %s. "
             "Its slope on log2(depth) is significant for %s (the lines under the Q1 table)." % (
                 ", ".join("%d blocks %+.4f (%s)" % (L, *max(((g["mean"], NAMES.get(k[1], k[1])) for k, g in
                                                             gaps.items() if k[0] == L), key=lambda x: abs(x[0])))
                           for L in depths if any(k[0] == L for k in gaps)),
                 "; ".join(sig) if sig else "no scheme"))
    deep = max(depths)
    w.append("- *The gap's spread over seeds* (std) at %d blocks: %s." % (deep, ", ".join(
        "%s %s" % (NAMES.get(k[1], k[1]), "%.4f" % g["std"] if g["std"] is not None else "one seed")
        for k, g in sorted(gaps.items(), key=lambda kv: SCHEMES.index(kv[0][1]) if kv[0][1] in SCHEMES else 9)
        if k[0] == deep)))
    q3 = []
    for L in depths:
        ref = cells.get((L, "pre"))
        for sc in ("lns", "mix"):
            c = cells.get((L, sc))
            if ref and c and ref["gap"] and c["gap"]:
                q3.append((L, sc, study_stats.welch(ref["gap"]["values"], c["gap"]["values"])))
    if q3:
        w.append("- *LNS's and Mix-LN's gaps against Pre-LN's* (Q3): significant at %d of %d comparisons (%s)." % (
            sum(1 for _, _, t in q3 if t and t["significant"]), len(q3),
            "; ".join("%s %d blocks %s" % (NAMES[sc], L, "%+.4f, p = %s" % (t["diff"], study_stats.fmt_p(t["p"]))
                                           if t else "one seed") for L, sc, t in q3)))
    if noise_ref:
        for L in depths:
            n = [rms(d) for k, d in noise_ref.items() if k[0] == L and d]
            g = [rms([v["gap"] for v in cells[k]["seeds"].values() if "gap" in v]) for k in gaps if k[0] == L]
            if n and g:
                w.append("- *Against the noise reference at %d blocks:* bf16 − f32 moves a seed's loss by an rms of "
                         "%s over the schemes, FP8 by %s." % (L, span(n), span(g)))
    h = {k: c["health"] for k, c in cells.items() if c["health"]}
    if h:
        w.append("- *Saturation* (mean over the blocks, logged steps and linears, then over seeds): inputs at most "
                 "%.3f%%, weights %s%%, gradients at most %.3f%% in any cell; non-finite values: %d. The worst "
                 "single block and step of an input, mean over seeds: %s." % (
                     100 * max(v["x"]["sat"]["mean"] for v in h.values()),
                     span([100 * v["w"]["sat"]["mean"] for v in h.values()], "%.3f"),
                     100 * max(v["dy"]["sat"]["mean"] for v in h.values()),
                     sum(cells[k]["nonfinite"] for k in h),
                     "; ".join("%d blocks %s" % (L, ", ".join(
                         "%s %.2f%%" % (NAMES.get(k[1], k[1]), 100 * h[k]["x"]["sat_max"]["mean"])
                         for k in order(h) if k[0] == L)) for L in depths)))
        pre_lns = [(L, study_stats.welch(h[(L, "pre")]["x"]["sat_max"]["values"],
                                         h[(L, "lns")]["x"]["sat_max"]["values"]))
                   for L in depths if (L, "pre") in h and (L, "lns") in h]
        if pre_lns:
            w.append("  LNS's worst input saturation − Pre-LN's: %s." % ", ".join(
                "%d blocks %s" % (L, "%+.2f%% (p = %s)" % (100 * t["diff"], study_stats.fmt_p(t["p"])) if t
                                  else "one seed") for L, t in pre_lns))
        fl = [(L, study_stats.welch(h[(L, "pre")]["x"]["flush"]["values"], h[(L, "lns")]["x"]["flush"]["values"]),
               max(h[(L, "lns")]["x"]["flush"]["values"]) < min(h[(L, "pre")]["x"]["flush"]["values"]))
              for L in depths if (L, "pre") in h and (L, "lns") in h]
        by = {sc: [100 * v["x"]["flush"]["mean"] for k, v in h.items() if k[1] == sc] for sc in SCHEMES}
        w.append("- *Flushing to zero* of the inputs: %s. LNS below Pre-LN at %d of %d depths (Welch), every LNS "
                 "seed below every Pre-LN seed at %d; gradients flush %.3f%% or less." % (
                     ", ".join("%s %s%%" % (NAMES[sc], span(v, "%.3f")) for sc, v in by.items() if v),
                     sum(1 for _, t, _ in fl if t and t["significant"] and t["diff"] < 0), len(fl),
                     sum(1 for _, _, a in fl if a), 100 * max(v["dy"]["flush"]["mean"] for v in h.values())))
    w.append("")
    return w


def fp8_runs_of(cells):
    return [v for c in cells.values() for v in c["seeds"].values()]


def timing(seeds):
    """The FP8 runs' wall time per depth from their records (min, median, max): the runs
    ran under different loads and thread counts, which the records do not keep, so no
    one figure per depth is claimed."""
    by = {}
    for v in seeds:
        if isinstance(v.get("seconds"), (int, float)):
            by.setdefault(v["layers"], []).append(v["seconds"] / 60.0)
    if not by:
        return []
    parts = []
    for L in sorted(by):
        xs = sorted(by[L])
        med = xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])
        parts.append("%d blocks %.1f to %.1f min (median %.1f, %d runs)" % (L, xs[0], xs[-1], med, len(xs)))
    return ["Wall time of an FP8 run, from the records: %s. The runs shared the machine with other work under "
            "different loads and OpenBLAS thread counts, which the records do not keep; the spread is that." %
            "; ".join(parts), ""]


def plots(cells, fp8_runs, out_dir, prefix):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(out_dir, exist_ok=True)
    colors = {"pre": "tab:blue", "lns": "tab:red", "mix": "tab:green"}
    fig, ax = plt.subplots(figsize=(6, 4))
    for s in SCHEMES:
        pts = trend(cells, s)[1]
        if pts:  # the bar spans the seeds' range
            ax.errorbar([p[0] for p in pts], [p[1]["mean"] for p in pts],
                        yerr=[[p[1]["mean"] - p[1]["min"] for p in pts], [p[1]["max"] - p[1]["mean"] for p in pts]],
                        marker="o", capsize=3, color=colors[s], label=NAMES[s])
    ax.axhline(0, color="k", linewidth=0.5)
    ax.set_xscale("log", base=2)
    depths = sorted({k[0] for k in cells})
    ax.set_xticks(depths)
    ax.set_xticklabels([str(d) for d in depths])
    ax.minorticks_off()
    save(plt, fig, ax, "blocks", "FP8 − baseline validation loss (seed range)", "Q1: the FP8 loss gap against depth",
         os.path.join(out_dir, prefix + "_gap.png"))
    # the deepest depth: per-block amax of x and dy at the last logged step, mean over seeds
    deepest = max(r["cell"]["layers"] for r in fp8_runs if r.get("status") == "ok")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, t, what in ((axes[0], "x", "input x"), (axes[1], "dy", "gradient dy")):
        for s in SCHEMES:
            rs = [r for r in fp8_runs if r.get("status") == "ok" and r["cell"]["layers"] == deepest
                  and r["cell"]["scheme"] == s]
            if rs:
                prof = depth_report.per_block_mean([r["fp8_health"][t]["amax_last"] for r in rs])
                seeds = "%d seed%s" % (len(rs), "" if len(rs) == 1 else "s")
                ax.plot(range(deepest), prof, color=colors[s], label="%s (%s)" % (NAMES[s], seeds))
        ax.set_yscale("log")
        save_ax(ax, "block", "amax of %s (largest of the 7 linears)" % what, "%d blocks, last logged step" % deepest)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, prefix + "_amax.png"), dpi=120)
    plt.close(fig)
    # Q2: saturated (x, dy) and flushed (dy) fractions per block at the deepest depth
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (t, k, what) in zip(axes, (("x", "saturated_mean", "x saturated"), ("dy", "saturated_mean",
                                                                                "dy saturated"),
                                       ("dy", "flushed_mean", "dy flushed"))):
        for s in SCHEMES:
            rs = [r for r in fp8_runs if r.get("status") == "ok" and r["cell"]["layers"] == deepest
                  and r["cell"]["scheme"] == s]
            if rs:
                prof = depth_report.per_block_mean([r["fp8_health"][t][k] for r in rs])
                ax.plot(range(deepest), [100 * v for v in prof], color=colors[s], label=NAMES[s])
        save_ax(ax, "block", "%s, %% of values" % what, "%d blocks" % deepest)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, prefix + "_health.png"), dpi=120)
    plt.close(fig)


def save_ax(ax, xlabel, ylabel, title):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fp8", default="docs/fp8_depth_runs", help="the FP8 cells' records")
    ap.add_argument("--baseline", default="docs/depth_study_runs", help="the records of the cells without FP8")
    ap.add_argument("--doc", default="docs/fp8_depth.md")
    ap.add_argument("--noise", default=None, help="the other precision's records of the cells without FP8 (default: "
                    "docs/depth_study_runs_cuda for the CPU's baseline, docs/depth_study_runs for the GPU's; "
                    "empty: no noise reference)")
    ap.add_argument("--vocab", type=int, default=4096, help="the cells' vocabulary, for the budget table")
    ap.add_argument("--plots", default="", help="folder for the three figures (none without)")
    ap.add_argument("--prefix", default="fp8_depth", help="the figures' file names begin with it")
    ap.add_argument("--marker", default="fp8_depth", help="the doc's markers: <!-- MARKER:begin --> ... end")
    args = ap.parse_args(argv)
    try:
        fp8_runs = [r for r in depth_report.find_records(args.fp8) if r["cell"].get("fp8")]
        base_runs = [r for r in depth_report.find_records(args.baseline) if not r["cell"].get("fp8")]
        cells = cells_of(fp8_runs, base_runs)
        if args.noise is None:
            args.noise = "docs/depth_study_runs" if args.baseline.rstrip("/").endswith("_cuda") else \
                "docs/depth_study_runs_cuda"
        noise_ref = noise(fp8_runs, base_runs, depth_report.find_records(args.noise)) if args.noise else None
        text = render(cells, args.fp8, args.baseline, len(fp8_runs),
                      sum(1 for c in cells.values() for v in c["seeds"].values() if "base" in v), noise_ref, args.noise,
                      args.vocab)
        if args.doc:
            write_doc(args.doc, text, "<!-- %s:begin -->" % args.marker, "<!-- %s:end -->" % args.marker)
        else:
            sys.stdout.write(text)
        if args.plots and any(r.get("status") == "ok" for r in fp8_runs):
            plots(cells, fp8_runs, args.plots, args.prefix)
    except (DocError, depth_report.ReportError) as e:
        print("fp8_depth_doc: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
