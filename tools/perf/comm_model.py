#!/usr/bin/env python3
"""What a parallel layout sends and what sequence parallelism saves: a projection.

Bytes one rank sends per optimizer step, by group and collective, for the step that
src/model/stage.cpp and src/train run, under the ring model the communicator counts
(parallel/communicator.h, CommCounts): an all-reduce of S bytes over p ranks sends
2(p-1)/p*S per rank, an all-gather or reduce-scatter (p-1)/p*S (S the full buffer), a
pipeline send S. The same count, written out in tests/mpi/test_parallel.cpp
(CommCounter.*), equals the counter on the CPU; tests/python/test_comm_model.py checks
this file against the values the counter measured there. Larger shapes are
projections: nothing here is measured.

Also the activation bytes a layer keeps per micro-batch in the regions sequence
parallelism splits (the residual stream and every norm's input and output), which
divide by tp, beside those of the tensor-parallel region (q, k, v, attention context,
FFN), which tp already divides.

    python3 tools/perf/comm_model.py --flagfile=configs/1b_lns.flags --tp=8 --pp=2 --dp=4 \\
        --sequence_parallel=true [--device=cuda]
"""
import sys
from dataclasses import dataclass

from flags import get_bool, get_int, parse_flag
from memory_model import layer_regions
from model_shape import ModelShape, shape_from_flags


def ring(p):
    return (p - 1) / p if p > 1 else 0.0


def ceil_div(a, b):
    return (a + b - 1) // b


@dataclass
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    sp: bool = False
    zero: bool = True  # lns_train's default (--zero=false: replicated update); no effect with dp = 1
    act_bytes: int = 4  # f32 on the CPU, bf16 (2) on CUDA

    @property
    def sp_on(self):
        return self.sp and self.tp > 1


def stage_layers(s: ModelShape, pp, stage):
    """The even split of src/model (extra layers on the first stages)."""
    first = sum(s.L // pp + (1 if q < s.L % pp else 0) for q in range(stage))
    return first, first + s.L // pp + (1 if stage < s.L % pp else 0)


def stage_params(s: ModelShape, lay: Layout, stage):
    """Elements of one tp rank's flat parameter buffer on `stage` (padded shards;
    alignment padding between tensors left out). Replicated: the norms'."""
    first, last = stage_layers(s, lay.pp, stage)
    t = lay.tp
    norm = s.norm()
    F = ceil_div(s.F, t)
    V = ceil_div(s.V, t)
    per_layer = s.C * (s.QD // t) * 2 + s.C * (s.KD // t) * 2 + 3 * s.C * F
    split = (last - first) * per_layer
    replicated = s.block_norms(first, last) * norm  # the norms the stage's block plans own
    if stage == 0:
        split += V * s.C
    if stage == lay.pp - 1:
        replicated += norm
        if not s.tied or lay.pp > 1:
            split += V * s.C
    return split, replicated


def step_bytes(s: ModelShape, lay: Layout, stage=0):
    """{"tp.all_reduce": bytes, ...} one rank of `stage` sends per optimizer step."""
    first, last = stage_layers(s, lay.pp, stage)
    L = last - first
    emb, head = stage == 0, stage == lay.pp - 1
    M = s.global_batch // (s.B * lay.dp)
    N, f = s.N, ring(lay.tp)
    act = N * s.C * lay.act_bytes
    out = {}

    def add(key, v):
        if v:
            out[key] = out.get(key, 0.0) + v

    if lay.tp > 1:
        if head:  # loss: row max, sum of exponentials, target logit, f32 [N] each
            add("tp.all_reduce", M * 3 * 2 * f * N * 4)
        if not lay.sp_on:
            add("tp.all_reduce", M * 2 * f * act * (4 * L + emb + head))
        else:
            # per sublayer: forward all-gather + reduce-scatter; backward all-gather of
            # the output gradient, the input gathered again, reduce-scatter.
            add("tp.all_gather", M * f * act * (6 * L + emb + 2 * head))
            add("tp.reduce_scatter", M * f * act * (4 * L + emb + head))
            _, replicated = stage_params(s, lay, stage)
            add("tp.all_reduce", 2 * f * replicated * 4)  # norm gradients, once per step
    hidden = act / lay.tp if lay.sp_on else act
    add("pp.send", M * hidden * ((0 if head else 1) + (0 if emb else 1)))
    if lay.dp > 1:
        split, replicated = stage_params(s, lay, stage)
        n = (split + replicated) * 4  # f32 gradients
        if lay.zero:  # bucket pieces reduced to their owners; the updated shards gathered
            add("dp.reduce", ring(lay.dp) * n)
            padded = ceil_div(split + replicated, lay.dp) * lay.dp
            if lay.act_bytes == 4:  # CPU: the f32 weights
                add("dp.all_gather", ring(lay.dp) * padded * 4)
            else:  # CUDA: the bf16 copy, and the f32 norm gains in one packed gather
                add("dp.all_gather", ring(lay.dp) * (padded * 2 + ceil_div(replicated, lay.dp) * lay.dp * 4))
        else:
            add("dp.all_reduce", 2 * ring(lay.dp) * n)
    if s.tied and lay.pp > 1 and (emb or head):
        add("embed.all_reduce", 2 * ring(2) * ceil_div(s.V, lay.tp) * s.C * 4)
    return out


def split_region_bytes(s: ModelShape, lay: Layout, layer):
    """Activation bytes layer `layer` keeps per micro-batch between the tensor-parallel
    linears (divided by tp under sequence parallelism), and in the tensor-parallel
    region (q, k, v, context, gate, up, SwiGLU output, the attention's f32 statistics):
    the activation account's terms (memory_model.layer_regions), not a second count."""
    return layer_regions(s, lay.tp, layer, dev="cuda" if lay.act_bytes == 2 else "cpu", sp=lay.sp_on)


def main(argv):
    flags = {}
    for a in argv:
        parse_flag(a, flags)
    s = shape_from_flags(flags)
    lay = Layout(tp=get_int(flags, "tp", 1), pp=get_int(flags, "pp", 1), dp=get_int(flags, "dp", 1),
                 sp=get_bool(flags, "sequence_parallel"), zero=get_bool(flags, "zero", True),
                 act_bytes=2 if flags.get("device", "cpu") == "cuda" else 4)
    if lay.sp_on and s.T % lay.tp:
        raise ValueError(f"--sequence_parallel needs --seq_len divisible by --tp, got {s.T} and {lay.tp}")
    print(f"tp={lay.tp} pp={lay.pp} dp={lay.dp}{' zero' if lay.zero else ''}{' sp' if lay.sp_on else ''}: "
          f"bytes sent per step per rank (projected, ring model)")
    for stage in range(lay.pp):
        b = step_bytes(s, lay, stage)
        total = sum(b.values())
        parts = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(b.items()))
        print(f"  stage {stage}: {total / 1e6:.1f} MB ({parts})")
    split, tp_region = split_region_bytes(s, lay, s.L - 1)
    print(f"activations kept per layer per micro-batch: split regions {split / 1e6:.1f} MB, "
          f"tensor-parallel region {tp_region / 1e6:.1f} MB")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ValueError as e:
        print(f"comm_model.py: error: {e}", file=sys.stderr)
        sys.exit(1)
