#!/usr/bin/env python3
"""Loss and validation-perplexity curves of one or several runs, as one PNG.

    python3 tools/plot_metrics.py runs/tiny_lns runs/tiny_pre --out runs/compare.png

Each argument is a run directory (holding metrics.jsonl) or a metrics.jsonl file.
The legend names each run by its directory. LN-free runs (--ln_free, docs/ln_free.md)
have each replacement marked on the loss curve: a dotted vertical line at the first
step trained with the new divisors, labelled with the schedule entry.
"""
import argparse
import json
import math
import os
import sys


def load(path):
    f = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    if not os.path.exists(f):
        sys.exit("plot_metrics: %s: no metrics.jsonl" % path)
    train, val, events = [], [], []
    with open(f) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                sys.exit("plot_metrics: %s:%d: not JSON" % (f, lineno))
            if "loss" in r:
                train.append((r["step"], r["loss"]))
            if "val_loss" in r:
                val.append((r["step"], r["val_ppl"]))
            if "ln_free_event" in r:
                events.append((r["step"], r["ln_free_event"].get("entry", "?")))
    name = os.path.basename(os.path.normpath(os.path.dirname(f) if not os.path.isdir(path) else path))
    return name, train, val, events


def smooth(ys, k):
    out, acc = [], []
    for y in ys:
        acc.append(y)
        if len(acc) > k:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def draw(runs, smooth_k):
    """The figure: training loss (with LN-free replacement markers) and validation perplexity."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for path in runs:
        name, train, val, events = load(path)
        color = None
        if train:
            steps, losses = zip(*train)
            line, = ax1.plot(steps, smooth(losses, smooth_k), label=name)
            color = line.get_color()
            ax1.plot(steps, losses, color=color, alpha=0.2, linewidth=0.8)
        for step, entry in events:  # LN-free replacements
            ax1.axvline(step, color=color or "gray", linestyle=":", linewidth=1.0, alpha=0.8)
            ax1.annotate(entry.split("@")[0], xy=(step, 1.0), xycoords=("data", "axes fraction"),
                         rotation=90, va="top", ha="right", fontsize=7, color=color or "gray")
        if val:
            vs, ppl = zip(*val)
            ax2.plot(vs, ppl, marker="o", label=name)
    ax1.set(xlabel="step", ylabel="training loss (nats/token)", title="Training loss")
    ax2.set(xlabel="step", ylabel="validation perplexity", title="Validation perplexity")
    ax2.set_yscale("log")
    ax2.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax2.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--smooth", type=int, default=10, help="moving-average window for the training loss")
    args = ap.parse_args(argv)
    fig = draw(args.runs, args.smooth)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print("plot_metrics: wrote %s" % args.out)


if __name__ == "__main__":
    main()
