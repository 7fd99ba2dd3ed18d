#!/usr/bin/env python3
"""The CPU f32 cross-check of the depth study at scale (issue 31, docs/depth_study_scale.md):
how far bf16 on the GPU moves the smallest cell's numbers.

    python3 tools/experiments/scale_crosscheck.py [--grid scale] [--steps 4] \\
        [--cpu_bin build] [--cuda_bin build-cuda] [--record docs/depth_study_scale_crosscheck.json]

The smallest cell (the shallowest depth, Pre-LN, seed 1, at the rate the GPU study's sweep
chose, or the sweep's middle rate while it has not finished) is trained for its first --steps
steps twice, from the same initial weights and the same batches: on the CPU in f32, and with
--device=cuda (bf16 matrices and activations, f32 master weights). The learning rate follows
the whole cell's schedule (its warm-up is kept, so the first steps run at the cell's rates).
The whole cell on the CPU would take about 33 hours on a 2-core machine (2026-11-28); its
first steps show how far apart the two devices start and whether the gap moves as training
begins. Prints each step's losses, gap and gradient norms, and writes the record (--record),
which docs/depth_study_scale.md shows (depth_scale_doc.py).

--cpu_only runs the CPU side alone and records each step's loss, wall time and tokens/s
(the record the page's sentence on the CPU's speed at width 512 comes from:
docs/depth_study_scale_runs/measurements/cpu_steps.json). --label names what the CUDA
side ran on in the record ("emulator" for the SIMT emulation build: the figures the page
gives for the emulated cross-check come from such a record, crosscheck_emulated.json).

Exit status 77 when the CUDA binary has no GPU to run on (ctest: skipped); every other
failure is one line "scale_crosscheck: ..." and exit status 1.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import depth_report  # noqa: E402
import depth_study  # noqa: E402

NO_GPU = ("no usable CUDA device", "no CUDA device visible", "no CUDA support")
# Flags of the cell that a short run of its first steps replaces (depth_study.train_flags).
REPLACED = ("--steps=", "--warmup_steps=", "--eval_every=", "--eval_tokens=", "--val_data=", "--diag_every=",
            "--log_every=", "--save_every=", "--keep_checkpoints=", "--out_dir=", "--resume=", "--device=",
            "--exit_code_on_signal=")


class CheckError(Exception):
    pass


def smallest_cell(grid, record_dir, out):
    """The shallowest Pre-LN cell of seed 1: the depth cell at the sweep's winner when the
    sweep has finished, else the sweep's own cell at its middle rate."""
    loss = lambda c: depth_study.finished_loss(c, out, record_dir)
    cells = depth_study.grid(grid, loss)
    first = min(c["layers"] for c in cells)
    mine = [c for c in cells if c["layers"] == first and c["scheme"] == "pre" and c["seed"] == 1]
    # the sweep's winner; its seed-1 cell is listed once, under the sweep's group (the grid
    # drops the depth group's copy of the same run), so the rate decides, not the group
    best = depth_study.best_rates([c for c in mine if c["group"] == "lr"], loss)
    if "pre" in best:
        return [c for c in mine if c["lr"] == best["pre"]][0]
    rates = sorted(c["lr"] for c in mine)
    return [c for c in mine if c["lr"] == rates[len(rates) // 2]][0]


def flags_for(c, device, steps, run_dir, data, vocab):
    args = argparse.Namespace(vocab=vocab, data=data, device=device, eval_tokens=0)
    flags = [f for f in depth_study.train_flags(c, run_dir, args) if not f.startswith(REPLACED)]
    return flags + ["--steps=%d" % steps, "--warmup_steps=%d" % max(1, c["steps"] // 10), "--val_data=",
                    "--eval_every=0", "--log_every=1", "--out_dir=%s" % run_dir, "--device=%s" % device]


MARK = ".scale_crosscheck"  # in --out: the folder is this script's, and its runs may be replaced


def claim(out):
    """Makes --out this script's folder: a new or empty one, or one it made before. Never
    anyone else's: its runs are deleted and replaced."""
    if os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, MARK)):
        raise CheckError("--out=%s: exists and was not made by scale_crosscheck.py (its runs would be replaced); "
                         "give a new folder" % out)
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, MARK), "w").close()


def train(binary, flags, run_dir, device, threads):
    """Runs lns_train; returns ({step: (loss, grad_norm)}, seconds). Exit 77 when a CUDA
    run finds no GPU."""
    shutil.rmtree(run_dir, ignore_errors=True)  # a run of ours, in the folder claim() checked
    env = dict(os.environ, OMP_NUM_THREADS=str(threads)) if threads else None
    t0 = time.time()
    r = subprocess.run([binary] + flags, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.time() - t0
    if r.returncode != 0:
        if device == "cuda" and any(s in r.stderr for s in NO_GPU):
            print("[ SKIPPED ] " + r.stderr.strip().splitlines()[-1])
            sys.exit(77)
        tail = r.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise CheckError("the %s run failed (exit %d): %s" % (device, r.returncode, tail[0]))
    out = {}
    for rec in depth_report.jsonl_records(os.path.join(run_dir, "metrics.jsonl")):
        if rec.get("kind", "train") == "train" and "loss" in rec and "step" in rec:
            out[rec["step"]] = (rec["loss"], rec.get("grad_norm"), rec.get("step_time_s"), rec.get("tokens_per_s"))
    shutil.rmtree(os.path.join(run_dir, "checkpoints"), ignore_errors=True)  # the end-of-run save: not needed
    return out, seconds


def compare(cpu, cuda, steps):
    missing = [s for s in range(1, steps + 1) if s not in cpu or s not in cuda]
    if missing:
        raise CheckError("no loss for step(s) %s in the runs' metrics.jsonl" % missing)
    rows = []
    for s in range(1, steps + 1):
        (lc, gc), (lg, gg) = cpu[s][:2], cuda[s][:2]
        rows.append(dict(step=s, cpu_loss=lc, cuda_loss=lg, gap=lg - lc, rel_gap=abs(lg - lc) / abs(lc),
                         cpu_grad_norm=gc, cuda_grad_norm=gg,
                         grad_norm_rel=abs(gg - gc) / abs(gc) if gc and gg is not None else None))
    return rows


def cpu_steps(c, name, run, args):
    """The CPU side alone: each step's loss, wall time and tokens/s, printed and recorded."""
    steps, seconds = run
    missing = [s for s in range(1, args.steps + 1) if s not in steps]
    if missing:
        raise CheckError("no loss for step(s) %s in the run's metrics.jsonl" % missing)
    rows = [dict(step=s, loss=steps[s][0], grad_norm=steps[s][1], step_time_s=steps[s][2], tokens_per_s=steps[s][3])
            for s in range(1, args.steps + 1)]
    for r in rows:
        print("  step %d: loss %.4f, %.0f s, %.0f tokens/s" % (r["step"], r["loss"], r["step_time_s"] or 0,
                                                               r["tokens_per_s"] or 0))
    if args.record:
        depth_study.write_json(args.record, dict(
            kind="cpu_steps", cell=c, name=name, vocab=args.vocab, steps=args.steps, cpu_threads=args.threads, cores=os.cpu_count(),
            nice=os.nice(0), load_average=round(os.getloadavg()[1], 1),  # the machine's other work, 5 minutes
            seconds=round(seconds, 1), rows=rows, date=time.strftime("%Y-%m-%d"),
            cpu_flags=flags_for(c, "cpu", args.steps, os.path.join(args.out, "cpu"), args.data, args.vocab)))
        print("scale_crosscheck: record in %s" % args.record)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", default="scale", choices=("scale", "scale_mini"))
    ap.add_argument("--steps", type=int, default=4, help="the cell's first steps to run on both devices")
    ap.add_argument("--cpu_bin", default=os.path.join(ROOT, "build"), help="folder of the CPU lns_train")
    ap.add_argument("--cuda_bin", default=os.path.join(ROOT, "build-cuda"), help="folder of the CUDA lns_train")
    ap.add_argument("--data", default=depth_study.STUDIES["scale"]["data"], help="token files' prefix")
    ap.add_argument("--vocab", type=int, default=depth_study.STUDIES["scale"]["vocab"])
    ap.add_argument("--records", default=depth_study.STUDIES["scale"]["records"]["cuda"],
                    help="the GPU study's records (their sweep decides the cell's rate)")
    ap.add_argument("--out", default="runs/scale_crosscheck",
                    help="the two runs' folder: new, or one this script made (its runs are replaced)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="OpenMP threads of the CPU run")
    ap.add_argument("--record", default="", help="write the record here (JSON)")
    ap.add_argument("--cpu_only", action="store_true", help="run the CPU side alone: its steps' losses and speed")
    ap.add_argument("--label", default="gpu", help="what the CUDA side runs on, for the record (gpu, emulator)")
    args = ap.parse_args(argv)
    # the runs start in the checkout: paths as given, from here
    args.data, args.cpu_bin, args.cuda_bin, args.out = (os.path.abspath(p) for p in (args.data, args.cpu_bin,
                                                                                   args.cuda_bin, args.out))
    try:
        if args.steps < 1:
            raise CheckError("--steps=%d: expected at least 1" % args.steps)
        for d in (args.cpu_bin,) if args.cpu_only else (args.cpu_bin, args.cuda_bin):
            if not os.access(os.path.join(d, "lns_train"), os.X_OK):
                raise CheckError("%s/lns_train: not an executable (build it, or name its folder)" % d)
        for part in ("train", "val"):
            if not os.path.exists("%s.%s.tok" % (args.data, part)):
                raise CheckError("%s.%s.tok: no such file (tools/experiments/real_corpus.py builds the corpus)"
                                 % (args.data, part))
        claim(args.out)
        c = smallest_cell(args.grid, args.records, os.path.join(ROOT, depth_study.STUDIES["scale"]["out"]))
        name = depth_study.run_name(c)
        print("scale_crosscheck: %s, its first %d steps on the CPU (f32, %d threads)%s"
              % (name, args.steps, args.threads, "" if args.cpu_only else " and on CUDA (bf16)"), flush=True)
        runs = {}
        for device, binary in (("cpu", args.cpu_bin),) if args.cpu_only else (("cuda", args.cuda_bin),
                                                                              ("cpu", args.cpu_bin)):
            run_dir = os.path.abspath(os.path.join(args.out, device))
            flags = flags_for(c, device, args.steps, run_dir, args.data, args.vocab)
            runs[device] = train(os.path.join(binary, "lns_train"), flags, run_dir, device,
                                 args.threads if device == "cpu" else 0)
            print("  %s: %.1f s" % (device, runs[device][1]), flush=True)
        if args.cpu_only:
            return cpu_steps(c, name, runs["cpu"], args)
        rows = compare(runs["cpu"][0], runs["cuda"][0], args.steps)
        print("  step  CPU f32 loss  CUDA bf16 loss      gap  |gap|/loss  grad norm CPU / CUDA")
        for r in rows:
            print("  %4d  %12.5f  %14.5f  %+8.5f  %9.3f%%  %.4f / %.4f" % (
                r["step"], r["cpu_loss"], r["cuda_loss"], r["gap"], 100 * r["rel_gap"], r["cpu_grad_norm"] or 0,
                r["cuda_grad_norm"] or 0))
        worst = max(r["rel_gap"] for r in rows)
        print("scale_crosscheck: the largest |gap| is %.3f%% of the CPU loss" % (100 * worst))
        if args.record:
            rec = dict(kind="crosscheck", cuda_on=args.label, cell=c, name=name, steps=args.steps,
                       cpu_threads=args.threads,
                       seconds={d: round(v[1], 1) for d, v in runs.items()}, rows=rows, max_rel_gap=worst,
                       date=time.strftime("%Y-%m-%d"),
                       cpu_flags=flags_for(c, "cpu", args.steps, os.path.join(args.out, "cpu"), args.data, args.vocab))
            depth_study.write_json(args.record, rec)
            print("scale_crosscheck: record in %s" % args.record)
    except (CheckError, OSError, ValueError) as e:
        print("scale_crosscheck: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
