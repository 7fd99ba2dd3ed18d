#!/usr/bin/env python3
"""Curse-of-depth diagnostics as pictures.

    python3 tools/plot_depth.py runs/tiny_pre runs/tiny_lns --out depth.png

Inputs: run directories (their metrics.jsonl, written with --diag_every) or lns_eval
JSON files written with --diag. Draws (left) the residual stream's variance after
each block against depth, log scale, one line per run (its last diagnostics), and
(right) for the first run with several diagnostics records, a heat map of the
angular distance between each block's input and output over training steps.
"""
import argparse
import json
import os
import sys


def load(path):
    """Returns (name, [(step, rows)]) where rows are per-layer diagnostics."""
    name = os.path.basename(os.path.normpath(path))
    if os.path.isdir(path):
        f = os.path.join(path, "metrics.jsonl")
        if not os.path.exists(f):
            sys.exit("plot_depth: %s: no metrics.jsonl" % path)
        recs = []
        with open(f) as fh:
            for line in fh:
                r = json.loads(line)
                if "diag" in r:
                    recs.append((r["step"], r["diag"]))
        if not recs:
            sys.exit("plot_depth: %s: no diagnostics (train with --diag_every=N)" % path)
        return name, recs
    with open(path) as fh:
        j = json.load(fh)
    if "diag" not in j:
        sys.exit("plot_depth: %s: no 'diag' (run lns_eval with --diag)" % path)
    scheme, folder = j.get("norm_scheme", "?"), os.path.basename(os.path.dirname(os.path.abspath(path)))
    return (scheme if folder == scheme else "%s (%s)" % (scheme, folder)), [(None, j["diag"])]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [load(p) for p in args.runs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, recs in runs:
        step, rows = recs[-1]
        ax1.plot([r["layer"] + 1 for r in rows], [r["variance"] for r in rows], marker="o",
                 label=name if step is None else "%s (step %d)" % (name, step))
    ax1.set(xlabel="block (1-based depth)", ylabel="variance of the residual stream",
            title="Output variance vs depth")
    ax1.set_yscale("log")
    ax1.grid(alpha=0.3)
    ax1.legend()
    heat = next(((n, r) for n, r in runs if len(r) > 1), None)
    if heat:
        name, recs = heat
        grid = [[row["angular_distance"] for row in rows] for _, rows in recs]
        im = ax2.imshow(list(map(list, zip(*grid))), aspect="auto", origin="lower", cmap="viridis",
                        extent=[recs[0][0], recs[-1][0], 0.5, len(grid[0]) + 0.5])
        fig.colorbar(im, ax=ax2, label="angular distance (arccos cos / pi)")
        ax2.set(xlabel="training step", ylabel="block", title="Angular distance, %s" % name)
    else:
        for name, recs in runs:
            rows = recs[-1][1]
            ax2.plot([r["layer"] + 1 for r in rows], [r["angular_distance"] for r in rows], marker="o", label=name)
        ax2.set(xlabel="block", ylabel="angular distance", title="Input/output angular distance")
        ax2.grid(alpha=0.3)
        ax2.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print("plot_depth: wrote %s" % args.out)


if __name__ == "__main__":
    main()
