#!/usr/bin/env python3
"""Projected (roofline) cost of an lns CUDA training step, from a flagfile.

  python3 tools/perf/roofline.py --flagfile=configs/1b_lns.flags --gpu=h100 --dp=8
      [--impl=before|nozero|present|fused] [--micro_batch_size=N] [--kernels] [--compare]

Prints per kernel and per GEMM the FLOPs, bytes and roofline time of one micro-batch,
the micro-batch and per-step time and MFU bounds, the device memory footprint and
the largest micro-batch that fits. Every figure is a model (step_model.py), not a
measurement: labelled "projected" wherever it is written down.
"""
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from devices import device  # noqa: E402
from flags import get_int, parse_flag  # noqa: E402
from step_model import (IMPLS, StepModel, chosen_micro_batch, largest_micro_batch,  # noqa: E402
                        shape_from_flags)

OWN = ("gpu", "dp", "impl", "kernels", "compare", "misaligned_efficiency", "reserve_gib")


def parse(argv):
    flags = {}
    for a in argv:
        if a in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        if a in ("--kernels", "--compare"):
            a += "=true"
        parse_flag(a, flags)
    if "flagfile" in flags:  # parse_flag already expanded it
        del flags["flagfile"]
    return flags


def build(flags, impl_name=None, micro_batch=None):
    impl_name = impl_name or flags.get("impl", "present")
    if impl_name not in IMPLS:
        raise ValueError(f"--impl: expected one of {', '.join(IMPLS)}, got '{impl_name}'")
    try:
        eff = float(flags.get("misaligned_efficiency", "1.0"))
    except ValueError:
        raise ValueError("--misaligned_efficiency: expected a number in (0, 1]") from None
    shape = shape_from_flags(flags, micro_batch)
    return StepModel(shape, IMPLS[impl_name], device(flags.get("gpu", "h100")),
                     get_int(flags, "dp", 1, hi=1 << 16), eff)


def kernel_table(m):
    rows = OrderedDict()
    for k in m.kernels:
        key = (k.phase, k.name)
        r = rows.setdefault(key, [0, 0.0, 0.0, 0.0, k.gemm, False])
        r[0] += k.launches
        r[1] += k.flops
        r[2] += k.bytes
        r[3] += m.t(k)
        r[5] = r[5] or k.misaligned
    total = m.micro_batch_time()
    print(f"{'phase':5} {'kernel':20} {'launches':>8} {'GFLOP':>9} {'GB':>8} {'ms':>8} {'share':>6}  bound")
    for (phase, name), (n, fl, by, t, gemm, mis) in rows.items():
        bound = "compute" if gemm and fl / max(by, 1) > m.dev.ridge else "memory"
        if mis:
            bound += ", unaligned pitch"
        print(f"{phase:5} {name:20} {n:8d} {fl / 1e9:9.1f} {by / 1e9:8.3f} {t * 1e3:8.3f} "
              f"{100 * t / total:5.1f}%  {bound}")


def summary(m, flags):
    s = m.shape
    print(f"projected by the roofline model (not measured): {m.dev.name}, dp={m.dp}, "
          f"micro-batch {s.B} x {s.T} tokens, {m.num_micro()} micro-batches per step per rank")
    print(f"  GEMM FLOPs per micro-batch      {m.gemm_flops() / 1e12:8.2f} TFLOP")
    print(f"  other traffic per micro-batch   {m.other_bytes() / 1e9:8.2f} GB")
    print(f"  kernel launches per micro-batch {m.launches():8d}   ({m.own_launches()} of our kernels, "
          f"{m.launches() - m.own_launches()} cuBLASLt)")
    print(f"  micro-batch time bound          {m.micro_batch_time() * 1e3:8.2f} ms   "
          f"MFU bound {100 * m.mfu_micro_batch():.1f}%")
    print(f"  attention core (no projections) {100 * m.share('attention'):8.1f} % of the micro-batch")
    print(f"  optimizer                       {m.optimizer_time() * 1e3:8.2f} ms   "
          f"({m.optimizer_bytes() / 1e9:.1f} GB)")
    ov, after = m.comm_time()
    print(f"  gradient comm (overlapped, after update) {ov * 1e3:.2f} ms, {after * 1e3:.2f} ms")
    print(f"  step time bound                 {m.step_time() * 1e3:8.2f} ms   MFU bound {100 * m.mfu_step():.1f}%")
    mem = m.memory()
    print("  device memory:")
    for k, v in mem.items():
        print(f"    {k:34} {v / 2**30:8.2f} GiB")
    print(f"    {'total':34} {sum(mem.values()) / 2**30:8.2f} GiB of {m.dev.memory_gib:.0f}")
    reserve = float(flags.get("reserve_gib", "2"))
    big = largest_micro_batch(s, m.impl, m.dev, m.dp, reserve)
    chosen = chosen_micro_batch(s, m.impl, m.dev, m.dp, reserve)
    print(f"  largest micro-batch that fits   {big}  (dividing {s.global_batch // m.dp} per rank, "
          f"{reserve:g} GiB reserved)")
    print(f"  chosen micro-batch              {chosen}  (smallest with every linear GEMM at >= 2x the "
          f"ridge point, {m.dev.ridge:.0f} FLOP/B)")


def compare(flags):
    print("projected MFU bounds (roofline model, not measured)")
    print(f"{'impl':8} {'micro':>5} {'mb ms':>8} {'MFU mb':>7} {'step ms':>8} {'MFU step':>8} {'attn':>6} {'mem GiB':>8}")
    for name in IMPLS:
        m = build(flags, name)
        print(f"{name:8} {m.shape.B:5d} {m.micro_batch_time() * 1e3:8.2f} {100 * m.mfu_micro_batch():6.1f}% "
              f"{m.step_time() * 1e3:8.1f} {100 * m.mfu_step():7.1f}% {100 * m.share('attention'):5.1f}% "
              f"{sum(m.memory().values()) / 2**30:8.2f}")


def main(argv):
    try:
        flags = parse(argv)
        if flags.get("compare") == "true":
            compare(flags)
            return 0
        m = build(flags)
        if flags.get("kernels") == "true":
            kernel_table(m)
        summary(m, flags)
    except ValueError as e:
        print(f"roofline: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
