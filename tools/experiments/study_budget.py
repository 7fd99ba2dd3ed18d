#!/usr/bin/env python3
"""A study's confound in numbers (issue 45): each cell's parameters and training tokens,
and their ratio, beside the budgets of the paper's own models (this repository's
transcription of its setup: configs/{130m,250m,350m,1b}_lns.flags).

Parameters of a LLaMA model with untied embedding and head:
  vocab x hidden x 2 (embedding, head) + hidden (final norm)
  + layers x (hidden x hidden x 2 (q, o) + hidden x kv_width x 2 (k, v)
              + 3 x hidden x intermediate (gate, up, down) + norms x hidden)
with kv_width = hidden x kv_heads / heads and 2 norms a block (4 under sandwich).
Tokens: steps x global batch x sequence length; the paper's configs train in document
mode (--data_mode=document), where a sequence may end in padding, so their token counts
are upper bounds and their ratios too. tests/python/test_depth_scale.py checks the count against
a checkpoint's tensors.
"""
import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PAPER_SIZES = ("130m", "250m", "350m", "1b")


def params(hidden, intermediate, layers, vocab, heads=1, kv_heads=None, scheme="pre", tied=False):
    kv_width = hidden * (kv_heads or heads) // heads
    norms = 4 if scheme == "sandwich" else 2
    block = 2 * hidden * hidden + 2 * hidden * kv_width + 3 * hidden * intermediate + norms * hidden
    return vocab * hidden * (1 if tied else 2) + hidden + layers * block


def read_flagfile(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("--") and "=" in line:
                k, v = line[2:].split("=", 1)
                out[k] = v
    return out


def paper_budgets(root=ROOT):
    """[{size, params, tokens, tokens_per_param, flagfile}] of the paper's model sizes."""
    rows = []
    for size in PAPER_SIZES:
        path = os.path.join(root, "configs", "%s_lns.flags" % size)
        f = read_flagfile(path)
        n = params(int(f["hidden_size"]), int(f["intermediate_size"]), int(f["num_layers"]), int(f["vocab_size"]),
                   int(f["num_heads"]), int(f.get("num_kv_heads", f["num_heads"])))
        tokens = int(f["steps"]) * int(f["global_batch_size"]) * int(f["seq_len"])
        rows.append(dict(size=size, params=n, tokens=tokens, tokens_per_param=tokens / n,
                         flagfile=os.path.relpath(path, root)))
    return rows


def cell_budget(cell, shape, vocab):
    """A depth_study cell's parameters, tokens and tokens per parameter (shape: its model
    shape, depth_study.shape_of)."""
    n = params(shape["hidden"], shape["intermediate"], cell["layers"], vocab, shape["heads"], shape["heads"],
               "pre" if cell["scheme"] in ("lns", "mix", "post", "scaled_init", "lns_scaled_init") else
               cell["scheme"])
    tokens = cell["steps"] * shape["batch"] * shape["seq"]
    return dict(params=n, tokens=tokens, tokens_per_param=tokens / n)


def table(cells, shape_of, vocab_of, title):
    """Markdown rows: one per (shape, depth, steps) of CELLS, then the paper's budgets."""
    seen = {}
    for c in cells:
        k = (c.get("shape") or "", c["layers"], c["steps"])
        if k not in seen:
            seen[k] = dict(cell_budget(c, shape_of(c), vocab_of(c)), shape=shape_of(c), vocab=vocab_of(c), **{
                "layers": c["layers"], "steps": c["steps"]})
    w = ["%s: parameters and training tokens per cell (embedding and head included), against the paper's "
         "budgets (`configs/<size>_lns.flags`; document mode pads, so theirs are upper bounds):\n" % title,
         "| model | blocks | steps | parameters | training tokens | tokens per parameter |", "|---|---|---|---|---|---|"]
    for k in sorted(seen):
        r = seen[k]
        w.append("| width %d, vocabulary %d | %d | %d | %s | %s | %.2f |" % (
            r["shape"]["hidden"], r["vocab"], r["layers"], r["steps"], format(r["params"], ","),
            format(r["tokens"], ","), r["tokens_per_param"]))
    for p in paper_budgets():
        w.append("| the paper's %s (`%s`) | | | %s | %s | %.1f |" % (
            p["size"], p["flagfile"], format(p["params"], ","), format(p["tokens"], ","), p["tokens_per_param"]))
    w.append("")
    return w
