#!/usr/bin/env python3
"""How long a checkpoint save stops training, synchronous against --async_save.

Runs lns_train on the CPU at a model size (default: configs/350m_lns.flags, 352M
parameters, a 4.2 GB checkpoint of weights and AdamW moments) for two steps with a save
after the first, --reps times per mode, and reads each run's "save_stall_s" (the time
the step loop waited for the save: for a synchronous save the whole write; for an
asynchronous one the copy to host memory) and, for the asynchronous runs, the
background write's time ("save_write_s"). The batch is one short sequence: the step
itself does not matter here. Prints min / median / max per mode and writes a record.

  python3 tools/bench/checkpoint_stall.py --train build/lns_train --reps 3 \\
      --record docs/benchmarks/cpu-checkpoint-stall-2026-11-29.json
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def one_run(train, flagfile, out, async_save, extra):
    cmd = [train, "--flagfile=" + flagfile, "--device=cpu", "--data=random", "--val_data=", "--seq_len=16",
           "--micro_batch_size=1", "--global_batch_size=1", "--steps=2", "--save_every=1", "--keep_checkpoints=1",
           "--warmup_steps=0", "--straggler_every=0", "--out_dir=" + out, "--async_save=%s" % str(async_save).lower(),
           *extra]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("checkpoint_stall: lns_train failed (%d):\n%s" % (r.returncode, r.stderr[-3000:]))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(l) for l in f]
    stall = [x["save_stall_s"] for x in recs if "save_stall_s" in x]
    write = [x["save_write_s"] for x in recs if "save_write_s" in x]
    size = sum(os.path.getsize(os.path.join(dp, n)) for dp, _, ns in os.walk(os.path.join(out, "checkpoints"))
               for n in ns)
    return {"stall_s": stall[0], "write_s": write[0] if write else None, "run_s": time.time() - t0,
            "checkpoint_bytes": size}


def summary(xs):
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=os.path.join(ROOT, "build", "lns_train"))
    ap.add_argument("--flagfile", default=os.path.join(ROOT, "configs", "350m_lns.flags"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the runs write (default: a temporary folder, removed)")
    ap.add_argument("--record", default=None, help="write the figures to this JSON file")
    ap.add_argument("extra", nargs="*", help="more lns_train flags")
    a = ap.parse_args(argv)
    if a.reps < 1:
        ap.error("--reps must be >= 1")
    base = a.dir or tempfile.mkdtemp(prefix="lns_ckpt_stall_")
    runs = {"sync": [], "async": []}
    try:
        for rep in range(a.reps):  # alternate, so that drift in the machine's load hits both
            for mode in ("sync", "async"):
                out = os.path.join(base, "%s_%d" % (mode, rep))
                r = one_run(a.train, a.flagfile, out, mode == "async", a.extra)
                runs[mode].append(r)
                print("%-5s rep %d: stall %.3f s%s (checkpoint %.2f GB)" % (
                    mode, rep, r["stall_s"], "" if r["write_s"] is None else ", background write %.3f s" % r["write_s"],
                    r["checkpoint_bytes"] / 1e9), flush=True)
                shutil.rmtree(out, ignore_errors=True)
    finally:
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)
    s, y = summary([r["stall_s"] for r in runs["sync"]]), summary([r["stall_s"] for r in runs["async"]])
    w = summary([r["write_s"] for r in runs["async"]])
    ratio = [x["stall_s"] / z["stall_s"] for x, z in zip(runs["async"], runs["sync"])]
    print("sync  stall s: min %.3f median %.3f max %.3f" % (s["min"], s["median"], s["max"]))
    print("async stall s: min %.3f median %.3f max %.3f (background write median %.3f s)" % (
        y["min"], y["median"], y["max"], w["median"]))
    print("async / sync stall, per pair: " + ", ".join("%.3f" % r for r in ratio))
    if a.record:
        rec = {"what": "checkpoint save stall, synchronous vs --async_save, on the CPU (tools/bench/checkpoint_stall.py)",
               "date": time.strftime("%Y-%m-%d"), "flagfile": os.path.relpath(a.flagfile, ROOT),
               "host": {"machine": platform.machine(), "cpus": os.cpu_count()},
               "checkpoint_bytes": runs["sync"][0]["checkpoint_bytes"],
               "sync_stall_s": s, "async_stall_s": y, "async_write_s": w, "async_over_sync_per_pair": ratio,
               "runs": runs}
        with open(a.record, "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")
        print("record: " + a.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
