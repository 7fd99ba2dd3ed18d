"""Device memory of one lns rank under a parallel layout and activation recomputation,
and the rule that picks a layout, --recompute and the micro-batch for a flagfile.

  python3 tools/perf/memory_model.py --flagfile=configs/7b_lns.flags --nodes=4 [--gpu=h100]
      [--gpus_per_node=8] [--reserve_gib=4] [--sequence_parallel] [--table]

`activation_account()` is the one Python copy of src/model/activation_memory.cpp
(what LlamaStage plans for its activations, per micro-batch in flight and per layer,
by recompute mode); tests/python/test_memory_model.py holds it to the bytes lns_train
prints at start-up. Everything else is the model of the other buffers of a rank
(weights, gradients, optimizer state, kernel scratch) and is a projection, not a
measurement.

The rule (docs/parallelism.md, "Activation recomputation"): among the layouts of
tensor parallelism inside a node (tp in 1, 2, 4, 8) and pipeline stages (pp), with
ZeRO-1 over the data-parallel ranks, take the first that fits in device memory less
a reserve, in this order: without full recomputation before with it (full costs
about one more forward, a third of the step); then the smallest model-parallel
degree tp x pp (more data parallelism, less communication per token); then
none before selective (selective costs one attention forward per layer); then tp
before pp at equal degree (tp stays on NVLink and has no pipeline bubble). The
micro-batch is then the smallest whose linear GEMMs are at >= 2x the ridge point
(step_model.chosen_micro_batch's rule), or the largest that fits. With
--sequence_parallel (in the flagfile or on the command line) every layout with tp > 1
runs it: its split regions hold N / tp tokens, and a tp that does not divide --seq_len
is not a candidate.
"""
import os
import sys
from dataclasses import dataclass, replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import block_plan  # noqa: E402
from devices import device  # noqa: E402
from flags import get_bool, get_int, parse_flag  # noqa: E402
from model_shape import shape_from_flags  # noqa: E402

BF16, F32, I32 = 2, 4, 4
MODES = ("none", "selective", "full")


def shard(n, parts, align=1):
    """Rows a rank stores of a dimension split over `parts` ranks (parallel/shard.h):
    the padded share, rounded up to `align` (64 on CUDA: gemm_dim_align)."""
    size = (n + parts - 1) // parts
    return (size + align - 1) // align * align


def sublayer_norms(s, layer):
    """((pre, out, add) of the attention sublayer, the same of the MLP's): which norms
    each sublayer of global layer `layer` has, from its block plan (block_plan.py)."""
    return tuple(sub.norms() for sub in block_plan.of_shape(s)[layer].sublayers)


def layer_recompute(mode, recompute_layers, local):
    """lns/model/recompute.h: full on the first N layers of a stage (0: all), else as given."""
    if mode != "full" or recompute_layers == 0:
        return mode
    return "full" if local < recompute_layers else "none"


def split_layers(L, pp):
    """parallel/layout.cpp's even split: the first L % pp stages hold one more layer."""
    ranges, first = [], 0
    for p in range(pp):
        n = L // pp + (1 if p < L % pp else 0)
        ranges.append((first, first + n))
        first += n
    return ranges


def slots_for(num_micro, stage, stages):
    """PipelineSchedule1F1B::slots_for: stage s keeps min(M, P - s) micro-batches."""
    return min(num_micro, stages - stage)


@dataclass(frozen=True)
class Terms:
    """The sizes activation_account adds up, in bytes, for one micro-batch."""
    N: int            # tokens of the micro-batch
    NC: int           # one split-region buffer [NL, C] (NL = N / tp under sequence parallelism)
    stat: int         # one norm's statistics [NL] f32 (rstd, and mean for LayerNorm)
    core: int         # what selective drops: ctx [N, QD], the attention's saved statistics, act [N, F]
    qkv_gate_up: int  # q [N, QD], k v [N, KD], gate up [N, F]
    a: int            # bytes of an activation element
    C: int
    QD: int
    KD: int
    F: int            # FFN and vocabulary shards as stored (padded to the device's alignment)
    V: int


def terms(s, tp, dev="cuda", align=None, sp=False):
    """activation_account's sizes (its arguments' meaning there)."""
    a = BF16 if dev == "cuda" else F32
    N, C, D = s.B * s.T, s.C, s.C // s.Hq
    NL = shard(N, tp) if sp and tp > 1 else N
    Hq = s.Hq // tp
    QD, KD = Hq * D, s.Hkv // tp * D
    if align is None:
        align = 64 if dev == "cuda" else 1
    F, V = shard(s.F, tp, align), shard(s.V, tp, align)
    saved = s.B * Hq * s.T * (s.T if dev == "cpu" else 1) * F32  # probabilities or log-sum-exp
    return Terms(N=N, NC=NL * C * a, stat=NL * F32 * (2 if s.norm_type == "layernorm" else 1),
                 core=N * QD * a + saved + N * F * a, qkv_gate_up=N * (QD + 2 * KD) * a + 2 * N * F * a,
                 a=a, C=C, QD=QD, KD=KD, F=F, V=V)


def split_regions(t, forms):
    """Bytes a kept (not full) layer holds between the tensor-parallel linears: per
    sublayer f, r and one [NL, C] per norm (u / f2 / y), and the norms' statistics.
    forms: each sublayer's (pre, out, add) (sublayer_norms)."""
    return sum((2 + sum(f)) * t.NC + sum(f) * t.stat for f in forms)


def layer_regions(s, tp, layer, dev="cuda", align=None, sp=False):
    """(split regions, tensor-parallel region): the bytes global layer `layer` keeps per
    micro-batch under --recompute=none, in the regions sequence parallelism splits and in
    the one tp already splits (q, k, v, context, the attention's saved statistics, gate,
    up and the SwiGLU product). Their sum is activation_account's per-layer bytes; the
    communication model (comm_model.py) reports the two apart."""
    t = terms(s, tp, dev, align, sp)
    return split_regions(t, sublayer_norms(s, layer)), t.qkv_gate_up + t.core


@dataclass
class Account:
    layers: list          # (global layer, mode, bytes kept per micro-batch)
    stage: int            # per micro-batch outside the layers
    workspace: int        # once: what recomputing layers share
    gradients: int        # once: backward's gradient buffers
    slots: int

    def per_micro_batch(self):
        return self.stage + sum(b for _, _, b in self.layers)

    def total(self):
        return self.slots * self.per_micro_batch() + self.workspace + self.gradients


def activation_account(s, tp, first, last, has_embedding, has_head, slots, mode="none",
                       recompute_layers=0, dev="cuda", align=None, sp=False):
    """src/model/activation_memory.cpp, term by term. s: model_shape.ModelShape. align:
    the device's padding of FFN and vocabulary shards (default: lns's, 64 on CUDA).
    sp: --sequence_parallel (with tp > 1): the split regions (norms, residual stream,
    norm statistics, h0, the final norm) hold NL = N / tp tokens (Layout::sequence_shard),
    the tensor-parallel regions, logits and ids all N."""
    sp = sp and tp > 1
    t = terms(s, tp, dev, align, sp)
    N, NC, stat, core, qkv_gate_up, a = t.N, t.NC, t.stat, t.core, t.qkv_gate_up, t.a
    C, QD, KD, F, V = t.C, t.QD, t.KD, t.F, t.V
    layers, any_sel, any_full = [], False, False
    u, f2, add, stats = [False] * 2, [False] * 2, [False] * 2, [False] * 6
    for g in range(first, last):
        m = layer_recompute(mode, recompute_layers, g - first)
        forms = sublayer_norms(s, g)
        if m == "full":
            kept, any_full = NC, True
            for k, (pre, out, ad) in enumerate(forms):
                u[k] |= pre
                f2[k] |= out
                add[k] |= ad
                for j, has in enumerate((pre, out, ad)):
                    stats[3 * k + j] |= has
        else:
            kept = split_regions(t, forms) + qkv_gate_up + (core if m == "none" else 0)
            any_sel |= m == "selective"
        layers.append((g, m, kept))
    ws = core if (any_sel or any_full) else 0
    if any_full:
        ws += qkv_gate_up
        for k in range(2):
            ws += NC * (1 + u[k] + f2[k]) + NC * ((k == 0 or add[k]) + (k == 0 and add[k]))
        ws += stat * sum(stats)
    stage = N * I32 + NC  # ids on every stage (LN-free end-of-text rows), h0
    if has_head:
        stage += stat + NC + N * V * a + 6 * N * F32  # the loss's [N] f32: lns/activation_memory.cpp
    # six split-region gradients; SP: two full-token [N, C] buffers of the tp region
    grads = 6 * NC + (2 * N * C * a if sp else 0) + 2 * N * (QD + KD) * a + 3 * N * F * a
    return Account(layers, stage, ws, grads, slots)


def stage_params(s, tp, first, last, has_embedding, has_head):
    """Parameters one rank of a stage stores (its tensor-parallel shard, padded)."""
    D = s.C // s.Hq
    QD, KD, F, V = s.Hq // tp * D, s.Hkv // tp * D, shard(s.F, tp, 64), shard(s.V, tp, 64)
    norm = s.norm()
    per_layer = 2 * s.C * QD + 2 * s.C * KD + 3 * s.C * F
    p = (last - first) * per_layer + s.block_norms(first, last) * norm
    if has_embedding:
        p += V * s.C
    if has_head:
        p += norm + (0 if s.tied and has_embedding else V * s.C)
    return p


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    mode: str
    B: int
    sp: bool = False  # --sequence_parallel (only ever True with tp > 1)


def rank_memory(s, lay, zero=True, dev="cuda"):
    """Bytes by category on the busiest rank (the first stage: most micro-batches in
    flight, and the embedding). CUDA: f32 master + bf16 copy and f32 gradients on every
    rank (ParamSet), f32 m and v (sharded over dp with --zero: AdamW's range), bf16
    activations; projected kernel scratch."""
    s = replace(s, B=lay.B)
    num_micro = s.global_batch // (lay.B * lay.dp)
    worst, worst_total = None, -1
    for p, (first, last) in enumerate(split_layers(s.L, lay.pp)):
        P = stage_params(s, lay.tp, first, last, p == 0, p == lay.pp - 1)
        acc = activation_account(s, lay.tp, first, last, p == 0, p == lay.pp - 1,
                                 slots_for(num_micro, p, lay.pp), lay.mode, 0, dev, sp=lay.sp)
        Hq = s.Hq // lay.tp
        mem = {
            "weights (f32 master + bf16 copy)": (F32 + BF16) * P,
            "gradients (f32)": F32 * P,
            "optimizer state (m, v)": 2 * F32 * P / (lay.dp if zero else 1),
            "activations": acc.slots * acc.per_micro_batch(),
            "recompute workspace + gradient buffers": acc.workspace + acc.gradients,
            "kernel scratch": F32 * s.B * Hq * s.T + (32 << 20) + 512 * 2 * s.C * F32,
        }
        if sum(mem.values()) > worst_total:
            worst, worst_total = mem, sum(mem.values())
    return worst


def fits(s, lay, gpu, reserve_gib, zero=True):
    return sum(rank_memory(s, lay, zero).values()) <= (gpu.memory_gib - reserve_gib) * 2**30


def candidates(s, world, gpus_per_node, sp=False):
    """Every layout the rule considers, in its order of preference (micro-batch 1).
    sp: sequence parallelism on every layout with tp > 1 (which must divide seq_len)."""
    out = []
    for tp in (1, 2, 4, 8):
        if tp > gpus_per_node or s.Hq % tp or s.Hkv % tp or (sp and s.T % tp):
            continue
        pp = 1
        while tp * pp <= world and pp <= s.L:
            if world % (tp * pp) == 0:
                dp = world // (tp * pp)
                if s.global_batch % dp == 0:
                    for mode in MODES:
                        out.append(Layout(tp, pp, dp, mode, 1, sp and tp > 1))
            pp *= 2
    rank = {m: i for i, m in enumerate(MODES)}
    out.sort(key=lambda l: (l.mode == "full", l.tp * l.pp, rank[l.mode], l.pp))
    return out


def gemm_intensity_ok(s, tp, gpu, margin=2.0):
    """The linear GEMMs' FLOPs per byte (bf16 operands, f32 weight gradients) at >= margin
    x the ridge point: the smallest is the one with the fewest output columns."""
    N, C = s.B * s.T, s.C
    narrow = min(s.Hkv // tp * (C // s.Hq), shard(s.F, tp), C)
    # forward x[N,C] . w[narrow,C]^T: 2 N C narrow FLOPs over the two operands and the output
    fl = 2 * N * C * narrow
    by = BF16 * (N * C + narrow * C + N * narrow)
    return fl / by >= margin * gpu.ridge


def choose(s, world, gpu, gpus_per_node=8, reserve_gib=4.0, zero=True, sp=False):
    """(layout, memory by category) the rule picks, or (None, None) if nothing fits."""
    for lay in candidates(s, world, gpus_per_node, sp):
        if not fits(s, lay, gpu, reserve_gib, zero):
            continue
        per_rank = s.global_batch // lay.dp
        best = lay
        for B in range(1, per_rank + 1):
            if per_rank % B:
                continue
            cand = replace(lay, B=B)
            if not fits(s, cand, gpu, reserve_gib, zero):
                break
            best = cand
            if gemm_intensity_ok(replace(s, B=B), lay.tp, gpu):
                break
        return best, rank_memory(s, best, zero)
    return None, None


def main(argv):
    flags = {}
    try:
        for a in argv:
            if a in ("-h", "--help"):
                print(__doc__)
                return 0
            parse_flag(a if a not in ("--table", "--sequence_parallel") else a + "=true", flags)
        flags.pop("flagfile", None)
        nodes = get_int(flags, "nodes", 1, hi=1 << 14)
        gpn = get_int(flags, "gpus_per_node", 8, hi=64)
        try:
            reserve = float(flags.get("reserve_gib", "4"))
        except ValueError:
            raise ValueError("--reserve_gib: expected a number of GiB") from None
        gpu = device(flags.get("gpu", "h100"))
        s = shape_from_flags(flags, 1)
        zero = get_bool(flags, "zero", True)
        sp = get_bool(flags, "sequence_parallel")
        world = nodes * gpn
        if flags.get("table") == "true":
            print(f"{'tp':>3} {'pp':>3} {'dp':>4} {'recompute':9} {'GiB':>7}  fits")
            for lay in candidates(s, world, gpn, sp):
                tot = sum(rank_memory(s, lay, zero).values()) / 2**30
                print(f"{lay.tp:3d} {lay.pp:3d} {lay.dp:4d} {lay.mode:9} {tot:7.2f}  "
                      f"{'yes' if fits(s, lay, gpu, reserve, zero) else 'no'}")
        lay, mem = choose(s, world, gpu, gpn, reserve, zero, sp)
        if lay is None:
            print(f"memory_model: no layout of {world} GPUs fits this model", file=sys.stderr)
            return 1
        print(f"projected by the memory model (not measured): {gpu.name}, {nodes} node(s) x {gpn} GPUs, "
              f"{reserve:g} GiB reserved")
        print(f"chosen: --tp={lay.tp} --pp={lay.pp} (dp={lay.dp}) --recompute={lay.mode} "
              f"--micro_batch_size={lay.B}{' --zero' if zero else ''}{' --sequence_parallel' if lay.sp else ''}")
        for k, v in mem.items():
            print(f"  {k:40} {v / 2**30:8.2f} GiB")
        print(f"  {'total (busiest rank)':40} {sum(mem.values()) / 2**30:8.2f} GiB of {gpu.memory_gib:.0f}")
    except ValueError as e:
        print(f"memory_model: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
