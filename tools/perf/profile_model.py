#!/usr/bin/env python3
"""The roofline model's bound for each row of a measured step profile.

  python3 tools/perf/profile_model.py docs/benchmarks/h100-2026-11-27.json [--gpu=h100]

For every config of a benchmark record (tools/device/bench_record.py) whose lns step has
a profile (lns_bench_step --profile; the cuDNN and --fp8 steps' too, the latter against
the model of that mode: its GEMMs at the FP8 peak, its casts a row of their own), prints
each class of work as measured beside the time step_model.py says it cannot beat on that
GPU (the model's kernels of one step, grouped into the same classes as the profile's
rows, include/lns/core/op_profile.h), and their ratio: where the step is far from its bound
is where the work is. The model's figures are projections, not measurements.
"""
import json
import os
import sys
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from devices import device  # noqa: E402
from flags import read_flagfile  # noqa: E402
from step_model import FUSED, PRESENT, StepModel, shape_from_flags  # noqa: E402

GEMMS, ATTENTION, NORMS = "GEMMs (cuBLASLt)", "attention", "norms with residual adds and LNS scale"
ELEMENTWISE, EMBED, OPTIM = "RoPE, SwiGLU, elementwise", "embedding, cross-entropy", "optimizer, gradient norm"
REST = "other device work and host gaps (the rest)"
# The casts inside --fp8's linears (a profile row of their own): 0 in the bf16 step.
FP8_CASTS = "FP8 casts (scale, amax, transpose)"
# A model kernel's class by its name (step_model.micro_batch_kernels): the CPU op that
# dispatches it in the code. Attention's batched products run inside the attention op.
ATTENTION_KERNELS = {"scores", "pv", "dp", "dv", "dq", "dk", "softmax", "softmax_bwd", "permute", "flash_fwd",
                     "flash_delta", "flash_dq", "flash_dkv"}


def class_of(kernel):
    name = kernel.name.split(".")[0]
    if kernel.part == "fp8_cast":
        return FP8_CASTS
    if name in ATTENTION_KERNELS:
        return ATTENTION
    if kernel.gemm:
        return GEMMS
    if name.startswith(("norm", "residual_norm")):
        return NORMS
    if name.startswith(("embedding", "cross_entropy")):
        return EMBED
    if name in ("rope", "swiglu", "swiglu_bwd", "copy", "axpby"):
        return ELEMENTWISE
    raise ValueError(f"step_model kernel '{kernel.name}' has no profile class (add it to profile_model.py)")


def model_for(config, gpu, fp8="none"):
    """The model of a config's step; fp8: its --fp8 mode (none, delayed, blockwise)."""
    flags = read_flagfile(os.path.join(ROOT, "configs", config + ".flags"))
    impl = PRESENT if flags.get("attention", "auto") == "materialized" else FUSED
    return StepModel(shape_from_flags(flags), replace(impl, fp8=fp8), device(gpu))


def bounds(m):
    """{class: seconds} of one step on one GPU (dp = 1)."""
    out = {c: 0.0 for c in (GEMMS, FP8_CASTS, ATTENTION, NORMS, ELEMENTWISE, EMBED, OPTIM, REST)}
    for k in m.kernels:
        out[class_of(k)] += m.t(k) * m.num_micro()
    out[OPTIM] += m.optimizer_time()
    out[FP8_CASTS] += m.fp8_weight_cast_time()
    return out


# A record's profiled lns runs (tools/device/bench_record.py's peers), each with its --fp8
# mode; cuDNN's attention is modelled as the fused kernel's (the same FLOPs and bytes).
PROFILED = {"lns": "none", "lns_cudnn": "none", "lns_fp8": "delayed", "lns_fp8_blockwise": "blockwise"}


def gpu_key(name):
    for key in ("h200", "h100", "a100"):
        if key in name.lower():
            return key
    raise ValueError(f"GPU '{name}' is not one the model knows (tools/perf/devices.py); give --gpu")


def main(argv):
    paths = [a for a in argv if not a.startswith("--")]
    gpu = next((a.split("=", 1)[1] for a in argv if a.startswith("--gpu=")), None)
    if len(paths) != 1:
        print(__doc__)
        return 2
    try:
        with open(paths[0]) as f:
            record = json.load(f)
        for config, peers in sorted(record.get("configs", {}).items()):
            for peer, fp8 in PROFILED.items():
                prof = (peers.get(peer) or {}).get("profile")
                if prof:
                    print_profile(record, config, prof, model_for(config, gpu or gpu_key(record.get("gpu", "")), fp8))
    except (OSError, ValueError, KeyError) as e:
        print(f"profile_model: {e}", file=sys.stderr)
        return 2
    return 0


def print_profile(record, config, prof, m):
    b = bounds(m)
    fp8 = "" if m.impl.fp8 == "none" else f" with --fp8={m.impl.fp8}"
    print(f"{config}{fp8} on {record.get('gpu')} ({record.get('date')}): measured profile against the "
          f"roofline bound ({m.dev.name}; projected, not measured)")
    print(f"  {'class of work':48} {'measured ms':>12} {'bound ms':>10} {'ratio':>7}")
    for row in prof["rows"]:
        bound = b.get(row["class"], 0.0) * 1e3
        ratio = f"{row['ms'] / bound:6.2f}x" if bound > 0 else "      —"
        print(f"  {row['class']:48} {row['ms']:12.1f} {bound:10.1f} {ratio}")
    total = sum(b.values()) * 1e3
    print(f"  {'the step':48} {prof['step_ms']:12.1f} {total:10.1f} {prof['step_ms'] / total:6.2f}x")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
