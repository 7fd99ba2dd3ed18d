#!/usr/bin/env python3
"""The FP8 loss gap of issue 30 (docs/fp8.md): one model trained twice on the same data
and seed, with --fp8=none and --fp8=delayed, and the gap after the fixed budget.

    python3 tools/experiments/fp8_gap.py --lns_train build-gpu/lns_train \\
        --flagfile configs/130m_lns.flags --out /tmp/fp8gap --json gpu-results/fp8_gap.json \\
        -- --data=data/realtext.train.tok --val_data=data/realtext.val.tok --vocab_size=32768 \\
           --data_mode=packed --global_batch_size=64 --micro_batch_size=64 --steps=2000

Flags after "--" go to both runs (the later of two equal flags wins, as in gflags). Each
run writes its own out_dir (OUT/none, OUT/delayed); the record holds, per run, the last
evaluation's val_loss, the mean training loss of the last tenth of the steps and the
median step time, and for the FP8 run the worst saturated and flushed fractions of its
last health record. The gap is (fp8 - bf16) / bf16 of the final val_loss (issue 30 asks
for it within 1%); the speed-up bf16 step time / fp8 step time.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def fail(msg):
    sys.exit(f"fp8_gap: {msg}")


def read_metrics(path):
    if not os.path.exists(path):
        fail(f"{path}: missing (did the run start?)")
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                fail(f"{path}:{n}: not JSON ({e})")
    return rows


def summarize(rows, path):
    steps = [r for r in rows if "loss" in r and "step_time_s" in r]
    evals = [r for r in rows if "val_loss" in r]
    if not steps:
        fail(f"{path}: no training steps recorded")
    if not evals:
        fail(f"{path}: no evaluation recorded (the run needs --val_data and --eval_tokens > 0)")
    tail = steps[-max(1, len(steps) // 10):]
    out = {"steps": steps[-1]["step"], "val_loss": evals[-1]["val_loss"], "val_step": evals[-1]["step"],
           "train_loss_last_tenth": statistics.fmean(r["loss"] for r in tail),
           "step_ms_median": 1e3 * statistics.median(r["step_time_s"] for r in steps[1:] or steps)}
    health = [r for r in rows if "fp8" in r]
    if health:
        last = health[-1]["fp8"]
        worst = lambda key: max(last, key=lambda h: h[key])  # noqa: E731
        s, fl = worst("saturated"), worst("flushed")
        out["fp8_health_step"] = health[-1]["step"]
        out["most_saturated"] = {"fraction": s["saturated"], "layer": s["layer"], "linear": s["linear"],
                                 "tensor": s["tensor"]}
        out["most_flushed"] = {"fraction": fl["flushed"], "layer": fl["layer"], "linear": fl["linear"],
                               "tensor": fl["tensor"]}
        out["nonfinite"] = sum(h["nonfinite"] for h in last)
    return out


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lns_train", required=True)
    ap.add_argument("--flagfile", required=True)
    ap.add_argument("--out", required=True, help="folder for the two runs (OUT/none, OUT/delayed)")
    ap.add_argument("--json", required=True, help="the record to write")
    args = ap.parse_args(argv)
    for p, what in ((args.lns_train, "--lns_train"), (args.flagfile, "--flagfile")):
        if not os.path.isfile(p):
            fail(f"{what}={p}: not a file")
    runs = {}
    for mode in ("none", "delayed"):
        out_dir = os.path.join(args.out, mode)
        cmd = [args.lns_train, f"--flagfile={args.flagfile}", *extra, f"--fp8={mode}", f"--out_dir={out_dir}",
               "--resume=auto"]
        print("fp8_gap:", " ".join(cmd), flush=True)
        r = subprocess.run(cmd)
        if r.returncode != 0:
            fail(f"the --fp8={mode} run failed (exit {r.returncode}); its log is above, its metrics in {out_dir}")
        runs[mode] = summarize(read_metrics(os.path.join(out_dir, "metrics.jsonl")), out_dir)
    bf, f8 = runs["none"], runs["delayed"]
    record = {"flagfile": args.flagfile, "flags": extra, "bf16": bf, "fp8": f8,
              "val_loss_gap": (f8["val_loss"] - bf["val_loss"]) / bf["val_loss"],
              "speedup": bf["step_ms_median"] / f8["step_ms_median"] if f8["step_ms_median"] > 0 else None}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"fp8_gap: {bf['steps']} steps: val_loss bf16 {bf['val_loss']:.4f}, fp8 {f8['val_loss']:.4f} "
          f"(gap {100 * record['val_loss_gap']:+.2f}%); step {bf['step_ms_median']:.1f} ms vs "
          f"{f8['step_ms_median']:.1f} ms ({record['speedup']:.2f}x); record {args.json}")


if __name__ == "__main__":
    main()
