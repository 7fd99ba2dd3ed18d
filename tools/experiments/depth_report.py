#!/usr/bin/env python3
"""Statistics and figures of the depth study (tools/experiments/depth_study.py).

    python3 tools/experiments/depth_report.py runs/depth_study_v2 [--json report.json] [--plots docs/images]

Reads every run directory under the study directory that holds cell.json and
result.json (eval.json of lns_eval --drop_layers=sweep --diag, metrics.jsonl of
lns_train) and writes one JSON report:

- cells: per configuration (blocks, scheme, learning rate, steps, embedding std), over
  its seeds: validation loss mean, sample standard deviation (n - 1), min and max;
  perplexity exp(mean loss); diverged seeds; per block the mean over seeds of the
  perplexity increase when the block is skipped (%), the angular distance between its
  input and output (units of pi) and the residual-stream variance after it; the
  variance growth (last block / first block) and the mean skip cost of the deeper and
  the shallower half of the blocks.
- comparisons: LNS against Pre-LN (and each other scheme against Pre-LN) in the same
  configuration: difference of mean losses, its standard error
  sqrt(s_a^2/n_a + s_b^2/n_b), and whether it exceeds the spread: the two seed ranges
  [min, max] do not overlap (needs >= 2 seeds on each side); and paired by seed (same
  initial shared weights, same batches): mean and std of the per-seed differences and
  whether they all have the same sign.
- best_lr: per (blocks, scheme, steps, embedding std), the learning rate of the lowest
  mean loss among those tried.

--plots DIR draws depth_study_*.png there (--prefix names them otherwise). Runs of one
device only: the report refuses CPU (f32) and GPU (bf16) runs together. Every failure is one line
"depth_report: ..." and exit status 1.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from depth_grid import cost, run_name  # noqa: E402  (the cost model of the ETA, in block-steps; run names)


class ReportError(Exception):
    pass


KEY = ("layers", "scheme", "lr", "steps", "embed_std")


def key_of(c):
    return tuple(c[k] for k in KEY)


def key_name(k):
    d = dict(zip(KEY, k))
    emb = "" if abs(d["embed_std"] - 0.02) < 1e-12 else " emb %.3g" % d["embed_std"]
    return "%d blocks %s lr %g %d steps%s" % (d["layers"], d["scheme"], d["lr"], d["steps"], emb)


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise ReportError("%s: cannot read (%s)" % (path, e.strerror))
    except json.JSONDecodeError as e:
        raise ReportError("%s: not JSON (%s)" % (path, e))


def finite(x, what):
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        raise ReportError("%s: expected a finite number, got %r" % (what, x))
    return float(x)


def jsonl_records(path):
    """The records of a metrics.jsonl, skipping a line cut short by a stop."""
    with open(path) as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def read_curve(path):
    """Validation loss by step from metrics.jsonl; a resumed run repeats steps: last wins."""
    curve = {}
    if not os.path.exists(path):
        return []
    for r in jsonl_records(path):
        if "val_loss" in r and isinstance(r.get("step"), int):
            curve[r["step"]] = r["val_loss"]
    return sorted(curve.items())


FP8_TENSORS = ("x", "w", "dy")  # the FP8 health rows' tensors (lns/model/fp8_state.h): input, weight, gradient


def read_fp8_health(path, layers):
    """An FP8 run's health (metrics.jsonl's {"step", "fp8": [{layer, linear, tensor, amax,
    scale, saturated, flushed, nonfinite}]} records, one per --log_every step; a resumed run
    repeats steps: last wins), per block and tensor over its seven linears: the amax at the
    last record (the largest of the linears'), the saturated and flushed fractions (mean
    over the records and the linears; saturated also its largest), and the non-finite
    count summed. Lists have one number per block. Step 1's record is left out when there
    are others: every scale starts at 1 there (Transformer Engine's start), so its casts
    flush most small gradients whatever the depth or scheme."""
    by_step = {}
    for r in jsonl_records(path):
        if isinstance(r.get("fp8"), list) and isinstance(r.get("step"), int):
            by_step[r["step"]] = r["fp8"]
    if not by_step:
        raise ReportError("%s: no FP8 health records (an --fp8 run logs them every --log_every steps)" % path)
    if len(by_step) > 1:
        by_step.pop(1, None)
    out = dict(steps=sorted(by_step), nonfinite=0.0)
    for t in FP8_TENSORS:
        sums = {k: [[] for _ in range(layers)] for k in ("saturated", "flushed")}
        for step in sorted(by_step):
            for h in by_step[step]:
                if h.get("tensor") != t:
                    continue
                l = h.get("layer")
                if not isinstance(l, int) or not 0 <= l < layers:
                    raise ReportError("%s: step %d: FP8 health row of layer %r, expected 0..%d" % (
                        path, step, l, layers - 1))
                for k in sums:
                    sums[k][l].append(finite(h.get(k), "%s: step %d: %s" % (path, step, k)))
                out["nonfinite"] += finite(h.get("nonfinite"), "%s: step %d: nonfinite" % (path, step))
        last = [h for h in by_step[max(by_step)] if h.get("tensor") == t]
        amax = [0.0] * layers
        for h in last:
            amax[h["layer"]] = max(amax[h["layer"]], finite(h.get("amax"), "%s: amax" % path))
        if any(not v for v in sums["saturated"]):
            raise ReportError("%s: FP8 health of tensor %s does not cover blocks 0..%d" % (path, t, layers - 1))
        out[t] = dict(amax_last=amax, saturated_mean=[mean(v) for v in sums["saturated"]],
                      saturated_max=[max(v) for v in sums["saturated"]],
                      flushed_mean=[mean(v) for v in sums["flushed"]])
    return out


def read_run(d):
    cell = load_json(os.path.join(d, "cell.json"))
    res = load_json(os.path.join(d, "result.json"))
    for k in KEY + ("seed",):
        if k not in cell:
            raise ReportError("%s/cell.json: no '%s'" % (d, k))
    # device: cpu (f32) or cuda (bf16 matrices): the two are separate studies, never pooled
    run = dict(cell=cell, status=res.get("status"), dir=d, seconds=res.get("seconds"),
               device=res.get("device", "cpu"))
    if run["status"] == "diverged":
        return run
    if run["status"] != "ok":
        raise ReportError("%s/result.json: status %r, expected 'ok' or 'diverged'" % (d, run["status"]))
    ev = load_json(os.path.join(d, "eval.json"))
    where = os.path.join(d, "eval.json")
    L = cell["layers"]
    if ev.get("num_layers") != L:
        raise ReportError("%s: num_layers %r, cell.json says %d" % (where, ev.get("num_layers"), L))
    run["loss"] = finite(ev.get("loss"), where + ": loss")
    # which validation tokens the loss is over: the first ones, or spread over the file
    run["eval"] = dict(tokens=ev.get("tokens"), spread=bool(ev.get("eval_spread", False)))
    drops = {r["layer"]: finite(r["relative_drop"], where + ": relative_drop") for r in ev["sweep"]["layers"]}
    diag = {r["layer"]: r for r in ev["diag"]}
    if sorted(drops) != list(range(L)) or sorted(diag) != list(range(L)):
        raise ReportError("%s: the sweep and the diagnostics must cover blocks 0..%d" % (where, L - 1))
    run["drop_pct"] = [100.0 * drops[l] for l in range(L)]
    run["angular"] = [finite(diag[l]["angular_distance"], where + ": angular_distance") for l in range(L)]
    run["variance"] = [finite(diag[l]["variance"], where + ": variance") for l in range(L)]
    run["curve"] = read_curve(os.path.join(d, "metrics.jsonl"))
    if cell.get("fp8"):
        run["fp8_health"] = read_fp8_health(os.path.join(d, "metrics.jsonl"), L)
    return run


def find_runs(root, fp8=False):
    """The finished runs under ROOT; fp8: those of the FP8 study (cells with --fp8), else
    the others (the FP8 study shares the width-64 study's run folder)."""
    if not os.path.isdir(root):
        raise ReportError("%s: not a directory" % root)
    runs = []
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if os.path.isfile(os.path.join(d, "result.json")) and os.path.isfile(os.path.join(d, "cell.json")):
            if bool(load_json(os.path.join(d, "cell.json")).get("fp8")) == fp8:
                runs.append(read_run(d))
    return runs


def record_of(run, jobs):
    """The run as the small JSON kept in the repository (depth_study.py --record): what the
    report needs of it, no checkpoint, so a later session reuses it."""
    rec = {k: v for k, v in run.items() if k != "dir"}
    rec["jobs"] = jobs
    return rec


def read_record(path):
    """A record written by record_of, checked as read_run checks a run directory."""
    rec = load_json(path)
    cell = rec.get("cell")
    if not isinstance(cell, dict) or any(k not in cell for k in KEY + ("seed",)):
        raise ReportError("%s: 'cell' must hold %s" % (path, ", ".join(KEY + ("seed",))))
    if rec.get("status") == "diverged":
        return dict(rec, dir=path)
    if rec.get("status") != "ok":
        raise ReportError("%s: status %r, expected 'ok' or 'diverged'" % (path, rec.get("status")))
    L = cell["layers"]
    finite(rec.get("loss"), path + ": loss")
    for k in ("drop_pct", "angular", "variance"):
        v = rec.get(k)
        if not isinstance(v, list) or len(v) != L:
            raise ReportError("%s: '%s' must have one number per block (%d)" % (path, k, L))
        for x in v:
            finite(x, "%s: %s" % (path, k))
    rec["curve"] = [tuple(p) for p in rec.get("curve", [])]
    if cell.get("fp8"):
        h = rec.get("fp8_health")
        if not isinstance(h, dict):
            raise ReportError("%s: an FP8 cell's record needs 'fp8_health'" % path)
        for t in FP8_TENSORS:
            for k in ("amax_last", "saturated_mean", "saturated_max", "flushed_mean"):
                v = (h.get(t) or {}).get(k)
                if not isinstance(v, list) or len(v) != L:
                    raise ReportError("%s: fp8_health.%s.%s must have one number per block (%d)" % (path, t, k, L))
                for x in v:
                    finite(x, "%s: fp8_health.%s.%s" % (path, t, k))
    return dict(rec, dir=path)


def find_records(records):
    """The run records under RECORDS (every *.json but the prior_*.json summaries)."""
    if not records or not os.path.isdir(records):
        return []
    return [read_record(os.path.join(records, n)) for n in sorted(os.listdir(records))
            if n.endswith(".json") and not n.startswith("prior_")]


def load_prior(records):
    """Summaries of configurations whose runs were not kept (RECORDS/prior_*.json,
    transcribed from the doc's tables): cells, comparisons, run names, timing."""
    out = []
    if not records or not os.path.isdir(records):
        return out
    for n in sorted(os.listdir(records)):
        if n.startswith("prior_") and n.endswith(".json"):
            p = load_json(os.path.join(records, n))
            for c in p.get("cells", []):
                if any(k not in c for k in KEY + ("n", "mean")):
                    raise ReportError("%s: a cell must hold %s, n and mean" % (os.path.join(records, n), ", ".join(KEY)))
                finite(c["mean"], os.path.join(records, n) + ": mean")
            p["file"] = n
            out.append(p)
    return out


def prior_seed_runs(prior):
    """The single-seed summaries of earlier sessions (n = 1: the summary is that seed's run)
    as run records, so that new seeds of the same configuration join them in one cell
    instead of replacing them. Their per-block lists are kept when the summary has them;
    they have no curve and no wall time. Summaries over several seeds cannot be split and
    stay cells of their own (build_report)."""
    out = []
    for p in prior:
        for c in p.get("cells", []):
            if c["n"] != 1:
                continue
            where = "%s: the cell %s" % (p["file"], key_name(key_of(c)))
            seeds = c.get("seeds")
            if not isinstance(seeds, list) or len(seeds) != 1 or not isinstance(seeds[0], int):
                raise ReportError("%s: n = 1 needs 'seeds' with one seed, got %r" % (where, seeds))
            run = dict(cell=dict({k: c[k] for k in KEY}, seed=seeds[0]), status="ok", seconds=None, curve=[],
                       loss=finite(c["mean"], where + ": mean"), prior=p["file"], dir=p["file"])
            for k in ("drop_pct", "angular", "variance"):
                if k in c:
                    if not isinstance(c[k], list) or len(c[k]) != c["layers"]:
                        raise ReportError("%s: '%s' must have one number per block (%d)" % (where, k, c["layers"]))
                    run[k] = [finite(x, "%s: %s" % (where, k)) for x in c[k]]
            out.append(run)
    return out


def mean(xs):
    return sum(xs) / len(xs)


def sample_std(xs):
    if len(xs) < 2:
        return None
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def per_block_mean(rows):
    return [mean(col) for col in zip(*rows)]


def summarize_cell(k, runs):
    ok = [r for r in runs if r["status"] == "ok"]
    c = dict(zip(KEY, k))
    c["name"] = key_name(k)
    c["seeds"] = sorted(r["cell"]["seed"] for r in ok)
    c["diverged_seeds"] = sorted(r["cell"]["seed"] for r in runs if r["status"] == "diverged")
    c["n"] = len(ok)
    if not ok:
        return c
    losses = [r["loss"] for r in sorted(ok, key=lambda r: r["cell"]["seed"])]
    c["losses"] = losses
    c["mean"] = mean(losses)
    c["std"] = sample_std(losses)
    c["min"], c["max"] = min(losses), max(losses)
    c["ppl"] = math.exp(c["mean"])
    prior = [r for r in ok if r.get("prior")]
    if prior:  # seeds summarised by an earlier session (prior_seed_runs)
        c["prior_seeds"] = sorted(r["cell"]["seed"] for r in prior)
        c["prior_files"] = sorted({r["prior"] for r in prior})
        if len(prior) == len(ok):
            c["prior"] = prior[0]["prior"]
    c["curves"] = {str(r["cell"]["seed"]): r["curve"] for r in ok if r["curve"]}
    # Per block: over the seeds that have the lists (an earlier session's summary may not)
    diag = [r for r in ok if "drop_pct" in r]
    c["n_diag"] = len(diag)
    if not diag:
        return c
    c["drop_pct"] = per_block_mean([r["drop_pct"] for r in diag])
    c["angular"] = per_block_mean([r["angular"] for r in diag])
    c["variance"] = per_block_mean([r["variance"] for r in diag])
    c["variance_growth"] = mean([r["variance"][-1] / r["variance"][0] for r in diag])
    L = k[0]
    half = L // 2
    c["drop_shallow_half"] = mean(c["drop_pct"][:half])
    c["drop_deep_half"] = mean(c["drop_pct"][half:])
    # per seed (seed order), for the pages' tests of a difference over the seeds
    diag.sort(key=lambda r: r["cell"]["seed"])
    c["diag_seeds"] = [r["cell"]["seed"] for r in diag]
    c["growth_by_seed"] = [r["variance"][-1] / r["variance"][0] for r in diag]
    c["deep_half_by_seed"] = [mean(r["drop_pct"][half:]) for r in diag]
    return c


def compare(a, b):
    """b against a: difference of mean losses, its standard error, and whether it exceeds
    the spread (the seed ranges do not overlap)."""
    out = dict(a=a["name"], b=b["name"], n_a=a["n"], n_b=b["n"])
    if not a["n"] or not b["n"]:
        return out
    out["diff"] = b["mean"] - a["mean"]
    if a["std"] is not None and b["std"] is not None:
        out["se"] = math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"])
        # a transcribed summary (prior) has no seed range: not known then
        out["beyond_spread"] = b["max"] < a["min"] or a["max"] < b["min"] if "max" in a and "max" in b else None
    else:
        out["se"] = None
        out["beyond_spread"] = None  # one seed: no spread to compare against
    # Paired by seed (same initialisation of the shared weights, same batches): the
    # per-seed differences, and whether they all have the same sign.
    la, lb = dict(zip(a["seeds"], a.get("losses", []))), dict(zip(b["seeds"], b.get("losses", [])))
    d = [lb[s] - la[s] for s in sorted(set(la) & set(lb))]
    if d:
        out["paired"] = dict(n=len(d), mean=mean(d), std=sample_std(d),
                             same_sign=len(d) > 1 and (all(x < 0 for x in d) or all(x > 0 for x in d)))
    return out


def build_report(runs, prior=()):
    """runs: read_run/read_record dicts (one per run name; the first of a name counts);
    prior: load_prior's summaries, used for the configurations no run covers."""
    # The one device of the report: bf16 GPU runs and f32 CPU runs differ in rounding, so a
    # cell never pools them (a GPU study keeps its records in their own folder). The prior
    # summaries are CPU runs.
    devices = sorted({r.get("device", "cpu") for r in runs} | ({"cpu"} if prior else set()))
    if len(devices) > 1:
        where = sorted({os.path.dirname(r["dir"]) for r in runs if "dir" in r})
        raise ReportError("%s: runs of devices %s in one report; keep each device's records in their own folder "
                          "(docs/depth_study_runs, docs/depth_study_runs_cuda)" % (", ".join(where) or "records",
                                                                                   " and ".join(devices)))
    groups, seen, uniq = {}, set(), []
    # a run both in the study directory and in the records counts once; a run of this study
    # wins over an earlier session's summary of the same seed (--rerun_prior)
    for r in list(runs) + prior_seed_runs(prior):
        name = run_name(r["cell"])
        if name not in seen:
            seen.add(name)
            uniq.append(r)
            groups.setdefault(key_of(r["cell"]), []).append(r)
    runs = [r for r in uniq if not r.get("prior")]
    cells = {k: summarize_cell(k, v) for k, v in groups.items()}
    prior_cmp = {}
    for p in prior:
        for c in p.get("cells", []):
            k = key_of(c)
            if c["n"] != 1 and k not in cells:  # n = 1: a run record above
                cells[k] = dict(c, name=key_name(k), prior=p["file"])
        for cmp in p.get("comparisons", []):
            prior_cmp[(cmp["layers"], cmp["lr"], cmp["steps"], cmp["embed_std"])] = cmp
    order = sorted(cells, key=lambda k: (k[0], k[3], k[4], k[2], k[1]))
    comparisons = []
    for k in order:
        if k[1] == "pre":
            continue
        ref = (k[0], "pre") + k[2:]
        if ref in cells:
            cmp = compare(cells[ref], cells[k])
            pc = prior_cmp.get((k[0], k[2], k[3], k[4]))
            if k[1] == "lns" and pc and cells[ref].get("prior") and cells[k].get("prior"):
                # both transcribed: the comparison as the earlier session computed it from the runs
                cmp.update({f: pc[f] for f in ("diff", "se", "beyond_spread", "paired") if f in pc})
            comparisons.append(cmp)
        # the paper's caveat: does scaled_init undermine LNS? (the same scheme from two inits)
        lns = (k[0], "lns") + k[2:]
        if k[1] == "lns_scaled_init" and lns in cells:
            comparisons.append(compare(cells[lns], cells[k]))
    best = {}
    for k in order:
        c = cells[k]
        if not c["n"]:
            continue
        g = (k[0], k[1], k[3], k[4])
        if g not in best or c["mean"] < best[g]["mean"]:
            best[g] = dict(layers=k[0], scheme=k[1], steps=k[3], embed_std=k[4], lr=k[2], mean=c["mean"],
                           n=c["n"], tried=sorted(kk[2] for kk in cells if (kk[0], kk[1], kk[3], kk[4]) == g))
    # Wall time per block-step (steps x (blocks + head), depth_grid.cost) of the runs that
    # finished, for the projected time of the cells still missing.
    timed = [r for r in runs if isinstance(r.get("seconds"), (int, float))]
    by_shape = {}
    for r in timed:
        by_shape.setdefault((r["cell"]["layers"], r["cell"]["steps"]), []).append(r["seconds"])
    timing = dict(runs=len(timed), seconds=sum(r["seconds"] for r in timed),
                  block_steps=sum(cost(r["cell"]) for r in timed),
                  jobs=max([r.get("jobs", 1) for r in timed] or [1]),
                  by_shape=[[L, steps, min(v), max(v), len(v)] for (L, steps), v in sorted(by_shape.items())])
    return dict(device=devices[0] if devices else "cpu", runs=len(runs),
                prior_runs=sum(len(p.get("runs", [])) for p in prior),
                cells=[cells[k] for k in order], comparisons=comparisons,
                best_lr=[b for b in best.values() if len(b["tried"]) > 1], timing=timing,
                prior_timing=[dict(p.get("timing", {}), file=p["file"]) for p in prior])


def plots(report, out_dir, prefix="depth_study"):
    """The figures, PREFIX_*.png in OUT_DIR (depth_study_cuda_* for the GPU study)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(out_dir, exist_ok=True)
    cells = [c for c in report["cells"] if c["n"]]
    colors = {"pre": "tab:blue", "lns": "tab:red", "mix": "tab:green", "post": "tab:purple",
              "scaled_init": "tab:gray", "lns_scaled_init": "tab:orange"}
    shared = [c for c in cells if c["steps"] == 400 and abs(c["lr"] - 2e-3) < 1e-12 and abs(c["embed_std"] - 0.02) < 1e-12]

    # 1. validation loss against depth (shared learning rate)
    fig, ax = plt.subplots(figsize=(6, 4))
    for s in ("pre", "lns"):
        pts = sorted((c["layers"], c["mean"], c["std"] or 0.0, c["n"]) for c in shared if c["scheme"] == s)
        if pts:
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                        color=colors[s], label=s)
            for p in pts:
                ax.annotate("n=%d" % p[3], (p[0], p[1]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("blocks")
    ax.set_ylabel("validation loss (mean over seeds, +- std)")
    ax.set_title("Depth at the shared learning rate")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "%s_depth.png" % prefix), dpi=110)
    plt.close(fig)

    # 2-4. per block: skip cost, angular distance, variance, for each depth (pre, lns)
    depths = sorted({c["layers"] for c in shared})
    for metric, fname, label, logy in (("drop_pct", "layer_drop", "perplexity increase when skipped (%)", True),
                                       ("angular", "angular", "angular distance, input to output (pi)", False),
                                       ("variance", "variance", "residual variance after the block", True)):
        fig, axes = plt.subplots(1, max(1, len(depths)), figsize=(4 * max(1, len(depths)), 3.4), squeeze=False)
        for ax, L in zip(axes[0], depths):
            for c in sorted(shared, key=lambda c: c["scheme"] != "pre"):  # pre first
                if c["layers"] == L and c["scheme"] in ("pre", "lns") and c.get(metric):
                    ax.plot(range(L), c[metric], marker=".", color=colors[c["scheme"]],
                            label="%s (n=%d)" % (c["scheme"], c["n"]))
            ax.set_title("%d blocks" % L)
            ax.set_xlabel("block")
            if logy:  # symlog: skipping a block can also lower the perplexity (a negative cost)
                ax.set_yscale("symlog", linthresh=0.1) if metric == "drop_pct" else ax.set_yscale("log")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        axes[0][0].set_ylabel(label)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "%s_%s.png" % (prefix, fname)), dpi=110)
        plt.close(fig)

    # 5. validation loss during training: every run with a kept curve at 12 blocks (one line
    # style per learning rate) and the budget axis (dashed); summarised configurations have none
    fig, ax = plt.subplots(figsize=(6, 4))
    styles = ["-", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1))]
    lrs12 = sorted({c["lr"] for c in cells if c["layers"] == 12 and c.get("curves")})
    drawn = 0
    for c in cells:
        if not c.get("curves") or c["scheme"] not in colors or not (c["layers"] == 12 or c["steps"] != 400):
            continue
        ls = "--" if c["steps"] != 400 else styles[lrs12.index(c["lr"]) % len(styles)]
        if abs(c["embed_std"] - 0.02) > 1e-12:
            ls = (0, (1, 1))  # dotted: the paper-era embedding
        for i, (seed, curve) in enumerate(sorted(c["curves"].items())):
            if curve:
                ax.plot([p[0] for p in curve], [p[1] for p in curve], color=colors[c["scheme"]], linestyle=ls,
                        alpha=0.8, label=None if i else "%s %d blocks lr %g %d steps%s" % (
                            c["scheme"], c["layers"], c["lr"], c["steps"],
                            "" if abs(c["embed_std"] - 0.02) < 1e-12 else " emb %.3g" % c["embed_std"]))
                drawn += 1
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss")
    ax.set_ylim(top=7.0)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)
    fig.tight_layout()
    if drawn:  # else the figure on disk stays
        fig.savefig(os.path.join(out_dir, "%s_loss.png" % prefix), dpi=110)
    plt.close(fig)

    # 5b. the schemes at 12 blocks, shared rate: residual variance and skip cost per block
    sch = [c for c in shared if c["layers"] == 12 and c.get("variance")]
    if len({c["scheme"] for c in sch}) > 2:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
        for c in sorted(sch, key=lambda c: list(colors).index(c["scheme"]) if c["scheme"] in colors else 99):
            kw = dict(marker=".", color=colors.get(c["scheme"], "black"), label="%s (n=%d)" % (c["scheme"], c["n"]))
            axes[0].plot(range(12), c["variance"], **kw)
            axes[1].plot(range(12), c["drop_pct"], **kw)
        axes[0].set_yscale("log")
        axes[0].set_ylabel("residual variance after the block")
        axes[1].set_yscale("symlog", linthresh=0.1)
        axes[1].set_ylabel("perplexity increase when skipped (%)")
        for ax in axes:
            ax.set_xlabel("block")
        axes[1].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "%s_schemes.png" % prefix), dpi=110)
        plt.close(fig)

    # 5c. the budget axis: validation loss along the longest runs, one panel per depth, each
    # seed a thin line and the mean over seeds a thick one (does the gap close with training?)
    longest = max([c["steps"] for c in cells] or [0])
    long_cells = [c for c in cells if c["steps"] == longest > 400 and c["scheme"] in ("pre", "lns")
                  and c.get("curves") and abs(c["lr"] - 2e-3) < 1e-12 and abs(c["embed_std"] - 0.02) < 1e-12]
    budget_depths = sorted({c["layers"] for c in long_cells})
    if budget_depths:
        fig, axes = plt.subplots(1, len(budget_depths), figsize=(4 * len(budget_depths), 3.4), squeeze=False,
                                 sharey=True)
        for ax, L in zip(axes[0], budget_depths):
            for c in sorted((c for c in long_cells if c["layers"] == L), key=lambda c: c["scheme"] != "pre"):
                curves = [cv for _, cv in sorted(c["curves"].items())]
                for cv in curves:
                    ax.plot([p[0] for p in cv], [p[1] for p in cv], color=colors[c["scheme"]], lw=0.6, alpha=0.5)
                steps = sorted(set.intersection(*[{p[0] for p in cv} for cv in curves]))
                means = [sum(dict(cv)[st] for cv in curves) / len(curves) for st in steps]
                ax.plot(steps, means, color=colors[c["scheme"]], lw=2, label="%s (n=%d)" % (c["scheme"], len(curves)))
            ax.set_title("%d blocks, %d steps" % (L, longest))
            ax.set_xlabel("step")
            ax.legend(fontsize=7)
        axes[0][0].set_ylabel("validation loss")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "%s_budget.png" % prefix), dpi=110)
        plt.close(fig)

    # 6. learning-rate sweep
    sweep = [c for c in cells if c["steps"] == 400 and abs(c["embed_std"] - 0.02) < 1e-12 and c["scheme"] in ("pre", "lns")]
    by = {}
    for c in sweep:
        by.setdefault((c["layers"], c["scheme"]), []).append((c["lr"], c["mean"]))
    if any(len(v) > 1 for v in by.values()):
        fig, ax = plt.subplots(figsize=(6, 4))
        for (L, s), pts in sorted(by.items()):
            if len(pts) > 1:
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colors[s],
                        linestyle="-" if L == 12 else ":", label="%s, %d blocks" % (s, L))
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel("validation loss (mean over seeds)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "%s_lr.png" % prefix), dpi=110)
        plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("study", help="the study directory (depth_study.py --out)")
    ap.add_argument("--json", default="", help="write the report here (default STUDY/report.json)")
    ap.add_argument("--plots", default="", help="draw the figures into this directory")
    ap.add_argument("--prefix", default="depth_study", help="the figures' file names: PREFIX_depth.png, ...")
    ap.add_argument("--records", default="", help="also the run records and prior_*.json summaries kept here "
                    "(depth_study.py --record, e.g. docs/depth_study_runs)")
    args = ap.parse_args(argv)
    try:
        runs = (find_runs(args.study) if os.path.isdir(args.study) or not args.records else []) \
            + find_records(args.records)
        prior = load_prior(args.records)
        if not runs and not prior:
            raise ReportError("%s: no finished runs (cell.json and result.json)" % args.study)
        report = build_report(runs, prior)
        path = args.json or os.path.join(args.study, "report.json")
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
        if args.plots:
            plots(report, args.plots, args.prefix)
    except ReportError as e:
        print("depth_report: %s" % e, file=sys.stderr)
        return 1
    print("depth_report: %d runs (and %d summarised), %d configurations -> %s" % (
        report["runs"], report["prior_runs"], len(report["cells"]), path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
