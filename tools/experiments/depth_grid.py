"""The depth studies' grids: their cells (depth, scheme, learning rate, steps, embedding
std, seed, model shape, FP8), in order of priority, the cells' run names and the cost
model of the ETA (block-steps). Data only: no runs, no files. depth_study.py runs the
cells and depth_report.py reads their records; both import this module, and
depth_study.py imports depth_report.py, never the reverse (tests/python/test_tool_imports.py).
"""
import math

# The paper's released code draws the token embedding from normal(0, sqrt(2/5)) instead of
# Hugging Face's 0.02 (LayerNorm-Scaling repository, peft_pretraining/modeling_llama.py,
# _init_weights); "paper-era" below.
PAPER_EMBED_STD = math.sqrt(2.0 / 5.0)

BASE = dict(hidden=64, heads=4, intermediate=176, seq=128, batch=16, micro=8)
SHARED_LR = 2e-3
STEPS = 400

# The depth study at scale (issue 31, docs/depth_study_scale.md): its cells carry their
# model shape by name (run names start with it; the width-64 cells have none and keep
# BASE). w512: 8 heads of 64, SwiGLU 8/3 x 512 rounded up to a multiple of 64, 512 tokens
# a sequence, 128 sequences a step: 65,536 tokens a step, 800 steps = 52.4M tokens.
# mini: the same grid in seconds on the CPU, for CI.
# eval_spread: the evaluated sequences spread evenly over the whole validation file
# (lns_train/lns_eval --eval_spread): real_corpus.py writes it in source order, and its
# first 131,072 tokens are 91% dictionaries (issue 45).
SHAPES = {
    "w512": dict(hidden=512, heads=8, intermediate=1408, seq=512, batch=128, micro=32, eval_tokens=131072,
                 eval_spread=True),
    "mini": dict(hidden=32, heads=2, intermediate=96, seq=32, batch=4, micro=4, eval_tokens=512, eval_spread=True),
}
SCALE_STEPS = {"w512": 800, "mini": 6}
FP8_MODE = "delayed"  # the FP8 cells' --fp8 (per-tensor delayed scaling, Transformer Engine's defaults)
# Cost of the embedding/head and the rest, in blocks' worth of a width-64 block with a
# 4096 vocabulary (3.2 of 13 GFLOP per step at 12 blocks): only for the ETA.
HEAD_BLOCKS = 4.0


def cell(group, layers, scheme, seed, lr=SHARED_LR, steps=STEPS, embed_std=0.02, shape=None, fp8=None):
    c = dict(group=group, layers=layers, scheme=scheme, seed=seed, lr=lr, steps=steps, embed_std=embed_std)
    if shape:
        c["shape"] = shape
    if fp8:  # absent, not "none", in a cell without it: the names and records of earlier runs stay
        c["fp8"] = fp8
    return c


def shape_of(c):
    return SHAPES[c["shape"]] if c.get("shape") else BASE


def lr_name(lr):
    """'2e-03', '1.6e-02': two significant digits, the trailing '.0' dropped (the names of
    the first session's runs had one digit)."""
    m, e = ("%.1e" % lr).split("e")
    return "%se%s" % (m[:-2] if m.endswith(".0") else m, e)


def run_name(c):
    emb = "" if c["embed_std"] == 0.02 else "_emb%.3g" % c["embed_std"]
    shape = c["shape"] + "_" if c.get("shape") else ""
    fp8 = "_fp8" if c.get("fp8") else ""
    return "%sL%02d_%s_lr%s_s%d%s%s_seed%d" % (shape, c["layers"], c["scheme"], lr_name(c["lr"]), c["steps"], emb,
                                               fp8, c["seed"])


def best_rates(sweep, loss):
    """{scheme: the rate of its lowest loss} for each scheme whose sweep cells have all
    finished (loss(cell) is None while one has not; a diverged run counts as inf); ties
    go to the smaller rate."""
    out = {}
    for scheme in sorted({c["scheme"] for c in sweep}):
        mine = [c for c in sweep if c["scheme"] == scheme]
        losses = [loss(c) if loss else None for c in mine]
        if all(v is not None for v in losses):
            out[scheme] = min(zip(losses, [c["lr"] for c in mine]))[1]
    return out


def scale_grid(shape, loss):
    """The depth study at scale (issue 31), in order of priority. Pre-LN and LNS at every
    depth, each at its own best rate: 3 rates at the shallowest depth (seed 1), whose
    winner also serves the middle depth; at the deepest, the winner and one rate below and
    above it (seed 1), then its own winner. Mix-LN and Post-LN at the middle depth, at
    Pre-LN's rate. 3 seeds per cell. Cells that wait on a sweep appear once it has
    finished (loss: a finished cell's validation loss, else None)."""
    depths, rates, seeds = ((12, 24, 48), (1e-3, 2e-3, 4e-3), (1, 2, 3)) if shape == "w512" else \
        ((2, 3, 4), (2e-3, 4e-3, 8e-3), (1, 2))
    steps = SCALE_STEPS[shape]
    mk = lambda group, layers, scheme, seed, lr: cell(group, layers, scheme, seed, lr=lr, steps=steps, shape=shape)
    first, middle, deep = depths
    sweep = [mk("lr", first, s, 1, lr) for lr in rates for s in ("pre", "lns")]
    out = list(sweep)
    best = best_rates(sweep, loss)
    for layers in (first, middle):
        for seed in seeds:
            for s in ("pre", "lns"):
                if s in best:
                    out.append(mk("depth", layers, s, seed, best[s]))
    sweep_deep = [mk("lr", deep, s, 1, best[s] * f) for f in (1.0, 0.5, 2.0) for s in ("pre", "lns") if s in best]
    out += sweep_deep
    best_deep = best_rates(sweep_deep, loss) if len(sweep_deep) == 6 else {}
    for seed in seeds:
        for s in ("pre", "lns"):
            if s in best_deep:
                out.append(mk("depth", deep, s, seed, best_deep[s]))
    if "pre" in best:
        for seed in seeds:
            for s in ("mix", "post"):
                out.append(mk("schemes", middle, s, seed, best["pre"]))
    return out


def fp8_grid(mini):
    """FP8 at depth (issue 30), in order of priority: a seed at a time (so that a stopped
    session leaves whole seeds), within it the cheaper depths first; each FP8 cell beside
    its baseline without FP8 (the width-64 study's cell, already run where it has one).
    Pre-LN, LNS and Mix-LN at the width-64 study's shared rate and budget."""
    depths, seeds, steps, shape = ((2, 4), (1, 2), 6, "mini") if mini else ((12, 24, 48), (1, 2, 3), STEPS, None)
    out = []
    for seed in seeds:
        for layers in depths:
            for s in ("pre", "lns", "mix"):
                out.append(cell("fp8", layers, s, seed, steps=steps, shape=shape, fp8=FP8_MODE))
                out.append(cell("fp8", layers, s, seed, steps=steps, shape=shape))
    return out


def grid(name, loss=None):
    """Cells in order of priority, no duplicates. loss(cell): a finished cell's validation
    loss, else None (the scale grids choose their rates from their sweeps)."""
    seeds3 = (1, 2, 3)
    out = []
    if name in ("scale", "scale_mini"):
        return dedupe(scale_grid("w512" if name == "scale" else "mini", loss))
    if name in ("fp8", "fp8_mini"):
        return dedupe(fp8_grid(name == "fp8_mini"))
    if name == "smoke":  # seconds: checks the machinery end to end
        for s in ("pre", "lns", "mix", "lns_scaled_init"):
            out.append(cell("depth", 2, s, 1, steps=6))
        return out
    # session: what 2 busy cores give in about 1.5 hours, in order of priority: 3 seeds
    # at 6 and 12 blocks, one at 24, one seed of each other axis, then more seeds
    n_seeds = seeds3 if name == "full" else (1,)
    # 1. depth at the shared learning rate, 3 seeds (24 blocks: seed 1 first, then the
    # other schemes' and rates' first seed, then 24 blocks' seeds 2 and 3)
    for layers in (6, 12):
        for seed in seeds3:
            for s in ("pre", "lns"):
                out.append(cell("depth", layers, s, seed))
    for s in ("pre", "lns"):
        out.append(cell("depth", 24, s, 1))
    # 2. learning-rate sweep at 12 blocks: 1e-3 to 3.2e-2 (2e-3 is in 1.). The first session
    # ran 1e-3..8e-3 and found both schemes best at the largest, 8e-3; 1.6e-2 and 3.2e-2
    # bracket the optimum (LNS shrinks what deep blocks write, much as a smaller step would)
    for seed in n_seeds:
        for lr in (4e-3, 8e-3, 1e-3, 1.6e-2, 3.2e-2):
            for s in ("pre", "lns"):
                out.append(cell("lr", 12, s, seed, lr=lr))
    # 3. the other schemes at 12 blocks (scaled_init alone in 7.: it only tells whether the
    # init by itself does what LNS does)
    for seed in n_seeds:
        for s in ("mix", "post", "lns_scaled_init"):
            out.append(cell("schemes", 12, s, seed))
    # 4. the paper-era embedding std (it reverses the ordering at 12 blocks, one seed)
    for seed in n_seeds:
        for s in ("pre", "lns"):
            out.append(cell("embed", 12, s, seed, embed_std=PAPER_EMBED_STD))
    # 5. seeds 2 and 3 at 24 blocks: depth with a spread at every point
    for seed in (2, 3):
        for s in ("pre", "lns"):
            out.append(cell("depth", 24, s, seed))
    # 6. budget: 4x the steps at 6 blocks (1x is in 1.; 6 blocks: the cheapest depth)
    for seed in n_seeds:
        for s in ("pre", "lns"):
            out.append(cell("budget", 6, s, seed, steps=4 * STEPS))
    # 7. 48 blocks, then scaled_init alone
    for seed in n_seeds:
        for s in ("pre", "lns"):
            out.append(cell("depth", 48, s, seed))
    for seed in n_seeds:
        out.append(cell("schemes", 12, "scaled_init", seed))
    # 8. each scheme at its best rate of the one-seed sweep at 12 blocks (Pre-LN 8e-3, LNS
    # 1.6e-2), seeds 2 and 3: the spread of the best-rate comparison
    for seed in (2, 3):
        out.append(cell("lr", 12, "pre", seed, lr=8e-3))
        out.append(cell("lr", 12, "lns", seed, lr=1.6e-2))
    if name == "full":  # the same axes at 24 blocks too
        for seed in seeds3:
            for lr in (1e-3, 4e-3, 8e-3, 1.6e-2):
                for s in ("pre", "lns"):
                    out.append(cell("lr", 24, s, seed, lr=lr))
            for s in ("post", "mix"):
                out.append(cell("schemes", 24, s, seed))
        # the budget axis where the gap is larger: 4x the steps at 24, then 12 blocks
        for layers in (24, 12):
            for seed in seeds3:
                for s in ("pre", "lns"):
                    out.append(cell("budget", layers, s, seed, steps=4 * STEPS))
        # the learning-rate sweep at 6 blocks too, so that every depth has one (added after
        # the GPU run of 2026-11-26)
        for seed in seeds3:
            for lr in (1e-3, 4e-3, 8e-3, 1.6e-2):
                for s in ("pre", "lns"):
                    out.append(cell("lr", 6, s, seed, lr=lr))
        # and at 48 blocks, the best rate at 12 and 24 blocks (8e-3) first
        for seed in seeds3:
            for lr in (8e-3, 4e-3, 1.6e-2, 1e-3):
                for s in ("pre", "lns"):
                    out.append(cell("lr", 48, s, seed, lr=lr))
    elif name != "session":
        raise SystemExit("depth_study: --grid=%s: expected smoke, session, full, scale, scale_mini, fp8 or fp8_mini"
                         % name)
    return dedupe(out)


def dedupe(out):
    seen, uniq = set(), []
    for c in out:
        if run_name(c) not in seen:
            seen.add(run_name(c))
            uniq.append(c)
    return uniq


def cost(c):
    return c["steps"] * (c["layers"] + HEAD_BLOCKS)
