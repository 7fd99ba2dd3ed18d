#!/usr/bin/env python3
"""The scale study's CPU f32 cross-check (tools/experiments/scale_crosscheck.py, issue 31)
on its miniature grid: the smallest mini cell's first 4 steps on the CPU and with
--device=cuda (a GPU, or the SIMT emulator), on a byte-level corpus written here.

Checks the record against the two runs' own metrics (the script reads the right steps and
devices), that the two devices agree as bf16 against f32 should at the start of training
(every step's loss within 0.1%: measured 0.007% at most under emulation, 2026-11-28; a
wrong initialisation or batch on one side moves the fourth step's loss by about 1%), and
the one-line errors for bad input. LNS_TRAIN_BIN: an lns_train with both devices (a CUDA
or emulation build); exit 77 (skipped) when it has no GPU. LNS_CROSSCHECK_KEEP=PATH keeps the
record there when every check passed (docs/depth_study_scale_runs/measurements/
crosscheck_emulated.json, whose figures docs/depth_study_scale.md gives).
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TRAIN = os.path.abspath(os.environ.get("LNS_TRAIN_BIN", os.path.join(ROOT, "build-cuda", "lns_train")))
SCRIPT = os.path.join(ROOT, "tools", "experiments", "scale_crosscheck.py")


def corpus(tmp):
    rnd = random.Random(3)
    words = ["river", "stone", "light", "garden", "winter", "letter", "bridge", "candle", "harbour"]
    text = os.path.join(tmp, "words.txt")
    with open(text, "w") as f:
        for _ in range(3000):
            f.write(" ".join(rnd.choice(words) for _ in range(rnd.randint(3, 9))) + ".\n")
    data = os.path.join(tmp, "words")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare_data.py"), "--input", text, "--doc_sep",
                    "line", "--val_fraction", "0.05", "--out", data, "--no_progress"], check=True, capture_output=True)
    return data


def label():
    """What the CUDA side runs on: the emulator when lns_train's build has LNS_CUDA_SIM on."""
    try:
        with open(os.path.join(os.path.dirname(TRAIN), "CMakeCache.txt")) as f:
            return "emulator" if "LNS_CUDA_SIM:BOOL=ON" in f.read() else "gpu"
    except OSError:
        return "gpu"


def crosscheck(tmp, data, *extra):
    bindir = os.path.dirname(TRAIN)
    cmd = [sys.executable, SCRIPT, "--grid", "scale_mini", "--steps", "4", "--cpu_bin", bindir, "--cuda_bin", bindir,
           "--data", data, "--vocab", "257", "--out", os.path.join(tmp, "runs"), "--threads", "2",
           "--records", os.path.join(tmp, "no_records")] + list(extra)
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)


def losses(run_dir):
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r and r.get("kind", "train") == "train":
                out[r["step"]] = r["loss"]
    return out


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        data = corpus(tmp)
        record = os.path.join(tmp, "crosscheck.json")
        r = crosscheck(tmp, data, "--record", record, "--label", label())
        if r.returncode == 77:
            print(r.stdout.strip())
            return 77
        print(r.stdout + r.stderr)
        if r.returncode != 0:
            return 1
        with open(record) as f:
            rec = json.load(f)
        if rec["name"] != "mini_L02_pre_lr4e-03_s6_seed1":  # the shallowest Pre-LN cell, the sweep's middle rate
            failures.append("cell %s" % rec["name"])
        for device, key in (("cpu", "cpu_loss"), ("cuda", "cuda_loss")):
            mine = losses(os.path.join(tmp, "runs", device))
            got = {row["step"]: row[key] for row in rec["rows"]}
            if got != {s: mine[s] for s in (1, 2, 3, 4)}:
                failures.append("%s losses in the record %s, in the run %s" % (device, got, mine))
        for row in rec["rows"]:
            if not row["rel_gap"] < 1e-3:
                failures.append("step %d: |gap| %.4f%% of the loss, bound 0.1%%" % (row["step"], 100 * row["rel_gap"]))
            if not row["grad_norm_rel"] < 0.02:
                failures.append("step %d: grad norms %s and %s" % (row["step"], row["cpu_grad_norm"],
                                                                  row["cuda_grad_norm"]))
        if abs(rec["rows"][3]["cpu_loss"] - rec["rows"][0]["cpu_loss"]) < 0.05:
            failures.append("the loss did not move in 4 steps: %s" % rec["rows"])
        # bad input: one line naming what is wrong, exit 1 (a repeated option's last value counts);
        # a folder the script did not make is refused and left as it was
        theirs = os.path.join(tmp, "theirs")
        os.makedirs(os.path.join(theirs, "cpu"))
        with open(os.path.join(theirs, "cpu", "notes.txt"), "w") as f:
            f.write("keep")
        for extra, want in ((["--steps", "0"], "--steps=0: expected at least 1"),
                            (["--data", os.path.join(tmp, "nothing")], "nothing.train.tok: no such file"),
                            (["--cpu_bin", os.path.join(tmp, "nowhere")], "nowhere/lns_train: not an executable"),
                            (["--out", theirs], "was not made by scale_crosscheck.py")):
            b = crosscheck(tmp, data, *extra)
            lines = b.stderr.strip().splitlines()
            if b.returncode != 1 or len(lines) != 1 or not lines[0].startswith("scale_crosscheck: ") or \
                    want not in lines[0]:
                failures.append("%s: exit %d, stderr %r" % (extra, b.returncode, b.stderr))
        if not os.path.exists(os.path.join(theirs, "cpu", "notes.txt")):
            failures.append("a folder the script did not make lost a file")
        keep = os.environ.get("LNS_CROSSCHECK_KEEP")
        if keep and not failures:
            os.makedirs(os.path.dirname(os.path.abspath(keep)), exist_ok=True)
            shutil.copy(record, keep)
            print("kept the record in %s" % keep)
    for f in failures:
        print("FAILED: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
