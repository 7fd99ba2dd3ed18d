"""The roofline model (tools/perf/step_model.py) against the SIMT emulator's counts.

Runs lns_bench_step --device=cuda in the emulation build (-DLNS_CUDA_SIM=ON) on small
configs and compares what the emulator counts with what the model says for the same
flags (the model's `present` code, the attention path choose_attention_impl() takes):
- kernel launches per micro-batch: the step with 2 micro-batches less the step with 1,
  against StepModel.own_launches() (our kernels; cuBLASLt GEMMs are not launches under
  the emulator). Tolerance 0: the model lists every kernel the stage launches, so a
  kernel added to or removed from the code without the model fails here.
- device-memory high-water mark against StepModel.memory() (weights, gradients, AdamW
  state, activations, workspace): within 5% (the model counts the planned buffers, not
  small ones: RoPE tables, per-slot ids and targets, the reduction scratch).

usage: test_emulator_counts.py <lns_bench_step> <tools/perf dir>
"""
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace

BENCH, PERF = sys.argv[1], sys.argv[2]
sys.path.insert(0, PERF)
from devices import device  # noqa: E402
from flags import read_flagfile  # noqa: E402
from step_model import PRESENT, StepModel, shape_from_flags  # noqa: E402

MEMORY_TOLERANCE = 0.05

BASE = """--vocab_size=1000
--intermediate_size=341
--num_layers=2
--num_heads=4
--num_kv_heads=2
--seq_len=64
--micro_batch_size=2
--global_batch_size=2
"""
CASES = {  # name: extra flags
    "lns, head dim 32 (materialised attention), F = 341 stored as 384": "--hidden_size=128\n--norm_scheme=lns\n",
    "lns, head dim 64 (fused attention)": "--hidden_size=256\n--norm_scheme=lns\n",
    "sandwich, head dim 64": "--hidden_size=256\n--norm_scheme=sandwich\n",
}


def emulated(flagfile, global_batch):
    out = subprocess.run([BENCH, f"--flagfile={flagfile}", "--device=cuda", "--bench_warmup=1", "--bench_steps=1",
                          f"--global_batch_size={global_batch}"], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"lns_bench_step failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"lns_bench_step printed no RESULT line:\n{out.stdout}")
    return json.loads(line[len("RESULT "):])


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in CASES.items():
            path = os.path.join(tmp, "case.flags")
            with open(path, "w") as f:
                f.write(BASE + extra)
            flags = read_flagfile(path)
            shape = shape_from_flags(flags)
            # choose_attention_impl(): fused on CUDA for head dims 64 and 128
            impl = replace(PRESENT, fused_attention=shape.D in (64, 128))
            model = StepModel(shape, impl, device("h100"), dp=1)
            one, two = emulated(path, shape.B), emulated(path, 2 * shape.B)
            launches = two["launches_per_step"] - one["launches_per_step"]
            mib = one["peak_device_mib"]
            model_mib = sum(model.memory().values()) / 2**20
            err = abs(mib - model_mib) / model_mib
            print(f"{name}: launches per micro-batch emulator {launches}, model {model.own_launches()}; "
                  f"device memory high-water emulator {mib:.1f} MiB, model {model_mib:.1f} MiB "
                  f"({100 * err:.1f}%, tolerance {100 * MEMORY_TOLERANCE:.0f}%)")
            if launches != model.own_launches():
                failures.append(f"{name}: launches per micro-batch {launches} != model {model.own_launches()}")
            if err > MEMORY_TOLERANCE:
                failures.append(f"{name}: memory {mib:.1f} MiB vs model {model_mib:.1f} MiB")
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
