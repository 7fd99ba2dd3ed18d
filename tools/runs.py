#!/usr/bin/env python3
"""Lists the runs under one or more directories: last step, loss, throughput,
validation perplexity, newest checkpoint, layout and source revision.

    python3 tools/runs.py runs/            # every directory below holding metrics.jsonl
    python3 tools/runs.py runs/ --json     # the same as JSON lines
"""
import argparse
import json
import os
import sys


def summarize(run_dir):
    last, val = None, None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
            if "loss" in r:
                last = r
            if "val_ppl" in r:
                val = r
    info = {"run": run_dir, "step": last["step"] if last else 0, "loss": last["loss"] if last else None,
            "tokens_per_s": last.get("tokens_per_s") if last else None, "val_ppl": val["val_ppl"] if val else None}
    run_json = os.path.join(run_dir, "run.json")
    if os.path.exists(run_json):
        with open(run_json) as f:
            r = json.load(f)
        l = r.get("layout", {})
        info["layout"] = "tp%d pp%d dp%d" % (l.get("tp", 1), l.get("pp", 1), l.get("dp", 1))
        if l.get("virtual_stages", 1) > 1:  # interleaved pipeline
            info["layout"] += " vp%d" % l["virtual_stages"]
        info["hosts"] = len(set(r.get("hosts", [])))
        info["revision"] = r.get("source_revision")
        info["started"] = r.get("started")
    ck = os.path.join(run_dir, "checkpoints", "latest")
    if os.path.exists(ck):
        with open(ck) as f:
            info["checkpoint"] = f.read().strip()
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="+")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    runs = []
    for root in args.roots:
        if not os.path.isdir(root):
            sys.exit("runs: %s: not a directory" % root)
        for d, _, files in os.walk(root):
            if "metrics.jsonl" in files:
                runs.append(summarize(d))
    runs.sort(key=lambda r: r["run"])
    if args.json:
        for r in runs:
            print(json.dumps(r))
        return
    fmt = "%-36s %8s %8s %10s %8s %-14s %-13s %s"
    print(fmt % ("run", "step", "loss", "tok/s", "val_ppl", "layout", "checkpoint", "revision"))
    for r in runs:
        f = lambda v, spec: (spec % v) if v is not None else "-"
        print(fmt % (r["run"], r["step"], f(r["loss"], "%.4f"), f(r["tokens_per_s"], "%.0f"), f(r["val_ppl"], "%.2f"),
                     r.get("layout", "-"), r.get("checkpoint", "-"), r.get("revision", "-")))


if __name__ == "__main__":
    main()
