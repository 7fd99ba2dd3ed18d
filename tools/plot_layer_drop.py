#!/usr/bin/env python3
"""The layer-removal study as one figure: the perplexity increase when each block is
skipped, for one or several models (e.g. Pre-LN vs LNS).

    python3 tools/plot_layer_drop.py runs/pre/eval.json runs/lns/eval.json --out drop.png

Each input is the JSON that `lns_eval --drop_layers=sweep --out=PREFIX` writes
(PREFIX.json); the legend uses each file's norm scheme and directory.
"""
import argparse
import json
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", help="lns_eval sweep JSON files")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--metric", choices=["relative_drop", "loss_delta"], default="relative_drop")
    args = ap.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    for path in args.sweeps:
        try:
            with open(path) as f:
                j = json.load(f)
            rows = j["sweep"]["layers"]
        except (OSError, KeyError, json.JSONDecodeError) as e:
            sys.exit("plot_layer_drop: %s: not an lns_eval sweep (%s)" % (path, e))
        scheme, folder = j.get("norm_scheme", "?"), os.path.basename(os.path.dirname(os.path.abspath(path)))
        label = "%s%s, intact ppl %.2f" % (scheme, "" if folder == scheme else " (%s)" % folder,
                                          j["sweep"]["intact"]["ppl"])
        xs = [r["layer"] for r in rows]
        ys = [100 * r["relative_drop"] if args.metric == "relative_drop" else r["loss_delta"] for r in rows]
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xlabel("skipped block (0-based layer)")
    ax.set_ylabel("perplexity increase (%)" if args.metric == "relative_drop" else "loss increase (nats)")
    ax.set_title("Layer removal: performance drop per skipped block")
    ax.set_yscale("symlog", linthresh=1.0 if args.metric == "relative_drop" else 0.01)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print("plot_layer_drop: wrote %s" % args.out)


if __name__ == "__main__":
    main()
