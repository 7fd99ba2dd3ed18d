#!/usr/bin/env python3
"""A short bf16 run of the tiny config on the GPU follows the CPU f32 run.

Both runs train configs/tiny_lns.flags for STEPS steps on the same synthetic corpus
(sentences of a small random grammar, byte-level, written by this test: no download,
works on an offline GPU node) from the same seed. Checks, with the figures printed:
  - both losses fall by more than 1 nat (the model learns on both devices);
  - the mean gap |loss_gpu - loss_cpu| over the last 20 steps is below 3% of the CPU
    loss (bf16 activations and GEMM inputs against f32 everywhere).
Exit code 77 (ctest: skipped) when lns_train cannot use a GPU here.
"""

import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TRAIN = os.environ.get("LNS_TRAIN_BIN", os.path.join(ROOT, "build-cuda", "lns_train"))
# The SIMT emulator build (docs/cuda.md) runs fewer steps: its ctest entry sets
# LNS_TINY_RUN_STEPS=20 (tests/gpu/CMakeLists.txt), however ctest is run.
# 160 on a GPU: on the first H200 run (2026-11-26) the bf16 loss wandered around the f32
# one by up to 5% between steps 30 and 80 as the model memorised (gap over steps 61-80:
# 3.12% of a 0.30 loss, over the bound) and settled after (steps 141-160: 0.47%).
STEPS = int(os.environ.get("LNS_TINY_RUN_STEPS", "160"))
WINDOW = min(20, STEPS // 2)  # the last WINDOW steps are compared
# And smaller batches: LNS_TINY_RUN_BATCH="SEQ_LEN SEQUENCES" (the config's 128 x 16 when
# unset; the emulation build's entry sets 64 x 8, a quarter of the tokens: 20 emulated
# steps of the full batch took 278 s, the longest test in CI).
SHAPE = [int(v) for v in os.environ.get("LNS_TINY_RUN_BATCH", "128 16").split()]
NO_GPU = ("no usable CUDA device", "no CUDA device visible", "no CUDA support")


def corpus(path):
    rnd = random.Random(0)
    subjects = ["the cat", "a dog", "my neighbour", "the old sailor", "every child", "the moon"]
    verbs = ["sees", "likes", "follows", "paints", "remembers", "forgets"]
    objects = ["the river", "a red ball", "the quiet town", "its shadow", "the morning", "a song"]
    with open(path, "w") as f:
        for _ in range(6000):
            f.write(f"{rnd.choice(subjects)} {rnd.choice(verbs)} {rnd.choice(objects)}.\n")


def prepared_corpus(tmp):
    """The grammar corpus as token files under `tmp`; returns their prefix."""
    text = os.path.join(tmp, "grammar.txt")
    corpus(text)
    data = os.path.join(tmp, "grammar")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare_data.py"), "--input", text,
                    "--doc_sep", "line", "--val_fraction", "0.02", "--out", data, "--no_progress"],
                   check=True, capture_output=True)
    return data


def train(device, data, out):
    cmd = [TRAIN, f"--flagfile={ROOT}/configs/tiny_lns.flags", f"--device={device}",
           f"--data={data}.train.tok", f"--val_data={data}.val.tok", f"--out_dir={out}",
           f"--steps={STEPS}", "--warmup_steps=10", "--eval_every=0", "--eval_tokens=4096",
           "--log_every=10", f"--seq_len={SHAPE[0]}", f"--global_batch_size={SHAPE[1]}",
           f"--micro_batch_size={min(8, SHAPE[1])}"]
    losses = run_and_read_losses(cmd, device, out, f"{device} run")
    return [losses[s] for s in sorted(losses)]


def run_and_read_losses(cmd, device, out, what, env=None):
    """Runs an lns_train command line; returns {step: training loss} from its metrics.
    Exit 77 (ctest: skipped) when a CUDA run finds no GPU; any other failure exits."""
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        if device == "cuda" and any(s in r.stderr for s in NO_GPU):
            print("[ SKIPPED ] " + r.stderr.strip().splitlines()[-1])
            sys.exit(77)
        sys.exit(f"{what} failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
    losses = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if "loss" in rec and "step" in rec and rec.get("kind", "train") == "train":
                losses[rec["step"]] = rec["loss"]
    return losses


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = prepared_corpus(tmp)
        gpu = train("cuda", data, os.path.join(tmp, "gpu"))
        cpu = train("cpu", data, os.path.join(tmp, "cpu"))
    assert len(gpu) == len(cpu) == STEPS, (len(gpu), len(cpu))
    tail = range(STEPS - WINDOW, STEPS)
    gap = sum(abs(gpu[i] - cpu[i]) for i in tail) / WINDOW
    ref = sum(cpu[i] for i in tail) / WINDOW
    print(f"tiny_lns, {STEPS} steps of {SHAPE[1]} x {SHAPE[0]} tokens: CPU f32 loss {cpu[0]:.4f} -> {cpu[-1]:.4f}, "
          f"GPU bf16 {gpu[0]:.4f} -> {gpu[-1]:.4f}; mean |gap| over the last {WINDOW} steps "
          f"{gap:.4f} ({100 * gap / ref:.2f}% of the CPU loss)")
    for i in range(0, STEPS, 10):
        print(f"  step {i + 1:3d}: cpu {cpu[i]:.4f}  gpu {gpu[i]:.4f}")
    ok = cpu[0] - cpu[-1] > 1.0 and gpu[0] - gpu[-1] > 1.0 and gap < 0.03 * ref
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
