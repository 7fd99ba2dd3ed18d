#!/usr/bin/env python3
"""Loss and validation-perplexity curves of one or several runs, as one PNG.

    python3 tools/plot_metrics.py runs/tiny_lns runs/tiny_pre --out runs/compare.png

Each argument is a run directory (holding metrics.jsonl) or a metrics.jsonl file.
The legend names each run by its directory.
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
    train, val = [], []
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
    name = os.path.basename(os.path.normpath(os.path.dirname(f) if not os.path.isdir(path) else path))
    return name, train, val


def smooth(ys, k):
    out, acc = [], []
    for y in ys:
        acc.append(y)
        if len(acc) > k:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--smooth", type=int, default=10, help="moving-average window for the training loss")
    args = ap.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for path in args.runs:
        name, train, val = load(path)
        if train:
            steps, losses = zip(*train)
            line, = ax1.plot(steps, smooth(losses, args.smooth), label=name)
            ax1.plot(steps, losses, color=line.get_color(), alpha=0.2, linewidth=0.8)
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
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print("plot_metrics: wrote %s" % args.out)


if __name__ == "__main__":
    main()
