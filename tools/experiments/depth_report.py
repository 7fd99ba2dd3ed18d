#!/usr/bin/env python3
"""Markdown tables from lns_eval JSON files (--drop_layers=sweep --diag):
perplexity per model, the layer-removal drop per block, and variance per block."""
import json
import sys


def main(paths):
    evals = []
    for p in paths:
        with open(p) as f:
            evals.append(json.load(f))
    print("| model | validation perplexity | tokens |\n|---|---|---|")
    for j in evals:
        print("| %s | %.3f | %d |" % (j["norm_scheme"], j["ppl"], j["tokens"]))
    L = max(j["num_layers"] for j in evals)
    print("\nPerplexity increase when one block is skipped (%):\n")
    print("| block | " + " | ".join(j["norm_scheme"] for j in evals) + " |")
    print("|---" * (len(evals) + 1) + "|")
    for l in range(L):
        cells = []
        for j in evals:
            rows = {r["layer"]: r for r in j["sweep"]["layers"]}
            cells.append("%.2f" % (100 * rows[l]["relative_drop"]) if l in rows else "")
        print("| %d | %s |" % (l, " | ".join(cells)))
    print("\nVariance of the residual stream after each block:\n")
    print("| block | " + " | ".join(j["norm_scheme"] for j in evals) + " |")
    print("|---" * (len(evals) + 1) + "|")
    for l in range(L):
        print("| %d | %s |" % (l, " | ".join("%.4g" % j["diag"][l]["variance"] for j in evals)))
    print("\nAngular distance between each block's input and output (mean over tokens):\n")
    print("| block | " + " | ".join(j["norm_scheme"] for j in evals) + " |")
    print("|---" * (len(evals) + 1) + "|")
    for l in range(L):
        print("| %d | %s |" % (l, " | ".join("%.4f" % j["diag"][l]["angular_distance"] for j in evals)))
    print("\nSweep run time (s): " + ", ".join("%s %.1f" % (j["norm_scheme"], j["sweep"]["seconds"]) for j in evals))


if __name__ == "__main__":
    main(sys.argv[1:])
