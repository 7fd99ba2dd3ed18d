#!/usr/bin/env python3
"""The depth study (issue 20) as one resumable script: a grid of ./build/lns_train runs,
each followed by lns_eval's layer-removal sweep and diagnostics on the validation data.

    python3 tools/experiments/depth_study.py --grid session --jobs 2 --nice 19
    python3 tools/experiments/depth_study.py --grid full --list      # what it would run

Every run has its own directory OUT/<name> (name = the cell: depth, scheme, learning
rate, steps, embedding std, seed). A run is finished when OUT/<name>/result.json exists
(written after lns_eval succeeded, or after a training that stopped on a non-finite
loss: status "diverged"); finished runs are skipped, so rerunning the same command
resumes the grid, and a run cut short resumes from its newest checkpoint
(--save_every, lns_train --resume=auto). Runs are started in the grid's order, which is
the order of priority: stop it at any time and the most important cells are done.

A progress line (stderr) gives done/running/left, elapsed time and an ETA from a cost
model (steps x (blocks + head)), calibrated on the runs finished in this invocation.

On a GPU node add --device=cuda --bin=build-cuda (a -DLNS_CUDA=ON build, docs/cuda.md);
the grid is the same, a run takes 11-46 s there (one H200, 2026-11-26), and the records go
to their own folder (RECORDS: bf16 runs are a study of their own). Then run
tools/experiments/depth_report.py on OUT.
"""
import argparse
import fnmatch
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import depth_report  # noqa: E402  (a finished run's record)
# The grids, the run names and the cost model live in depth_grid.py (data, shared with the
# report); named here too, as the scripts and tests around this one ask for them here.
from depth_grid import (BASE, FP8_MODE, HEAD_BLOCKS, PAPER_EMBED_STD, SCALE_STEPS, SHAPES, SHARED_LR,  # noqa: E402,F401
                        STEPS, best_rates, cell, cost, dedupe, fp8_grid, grid, lr_name, run_name, scale_grid,
                        shape_of)

# Where each device's run records are kept (--record): a bf16 GPU run and an f32 CPU run of
# the same cell differ in rounding, so the GPU study is its own, never pooled with the CPU's.
RECORDS = {"cpu": "docs/depth_study_runs", "cuda": "docs/depth_study_runs_cuda"}

# Each study's data, vocabulary, run folder and record folders (per device: bf16 GPU runs
# and f32 CPU runs are separate studies).
STUDIES = {
    "width64": dict(data="data/fortunes_bpe4k", vocab=4096, out="runs/depth_study_v2", records=RECORDS),
    "scale": dict(data="data/realtext", vocab=32768, out="runs/depth_study_scale",
                  records={"cpu": "docs/depth_study_scale_runs", "cuda": "docs/depth_study_scale_runs_cuda"}),
    # FP8 at depth (issue 30, docs/fp8_depth.md): the width-64 models with --fp8=delayed
    # beside the same cells without it. The FP8 cells' records are this study's; the cells
    # without FP8 are the width-64 study's own (baseline: its records, its finished runs),
    # so neither study runs a cell twice.
    "fp8": dict(data="data/fortunes_bpe4k", vocab=4096, out="runs/depth_study_v2",
                records={"cpu": "docs/fp8_depth_runs", "cuda": "docs/fp8_depth_runs_cuda"}, baseline="width64"),
}
GRIDS = {"width64": ("smoke", "session", "full"), "scale": ("scale", "scale_mini"), "fp8": ("fp8", "fp8_mini")}


def train_flags(c, run_dir, args):
    scheme, b = c["scheme"], shape_of(c)
    flags = ["--flagfile=configs/tiny_lns.flags",
             "--vocab_size=%d" % args.vocab, "--data=%s.train.tok" % args.data, "--val_data=%s.val.tok" % args.data,
             "--num_layers=%d" % c["layers"], "--hidden_size=%d" % b["hidden"], "--num_heads=%d" % b["heads"],
             "--num_kv_heads=%d" % b["heads"], "--intermediate_size=%d" % b["intermediate"],
             "--seq_len=%d" % b["seq"], "--global_batch_size=%d" % b["batch"],
             "--micro_batch_size=%d" % b["micro"], "--steps=%d" % c["steps"],
             "--warmup_steps=%d" % max(1, c["steps"] // 10), "--lr=%g" % c["lr"], "--min_lr_ratio=0.1",
             "--embed_init_std=%.6g" % c["embed_std"], "--seed=%d" % c["seed"],
             "--eval_every=%d" % max(1, c["steps"] // 4), "--eval_tokens=%d" % eval_tokens(c, args),
             "--diag_every=%d" % max(1, c["steps"] // 8), "--log_every=%d" % max(1, c["steps"] // 8),
             "--save_every=%d" % max(1, c["steps"] // 4), "--keep_checkpoints=1",
             "--out_dir=%s" % run_dir, "--resume=auto",
             "--device=%s" % args.device,
             "--exit_code_on_signal=143"]  # a run stopped by a signal is not finished
    if c.get("fp8"):
        flags.append("--fp8=%s" % c["fp8"])
    if b.get("eval_spread"):
        flags.append("--eval_spread")
    if scheme == "mix":
        flags += ["--norm_scheme=mix", "--post_layers=%d" % max(1, c["layers"] // 4)]  # the paper's 25%
    elif scheme == "lns_scaled_init":
        flags += ["--norm_scheme=lns", "--init_from=%s" % os.path.join(run_dir, "init", "hf", "model.safetensors")]
    else:
        flags += ["--norm_scheme=%s" % scheme]
    return flags


def eval_tokens(c, args):
    return shape_of(c).get("eval_tokens", args.eval_tokens)


def eval_flags(run_dir, args, c=None):
    """lns_eval's flags but --checkpoint (the newest one, found when the training ends)."""
    b = shape_of(c) if c else BASE
    micro = b["micro"] if c and c.get("shape") else 8
    return ["--data=%s.val.tok" % args.data, "--seq_len=%d" % b["seq"], "--micro_batch_size=%d" % micro,
            "--eval_tokens=%d" % (eval_tokens(c, args) if c else args.eval_tokens), "--drop_layers=sweep", "--diag",
            "--out=%s" % os.path.join(run_dir, "eval"), "--plot=false", "--device=%s" % args.device] + \
        (["--eval_spread"] if c and b.get("eval_spread") else [])


def script_for(c, run_dir, args):
    """The shell commands of one run: (init for lns_scaled_init), train, evaluate."""
    nice = ["nice", "-n", str(args.nice)] if args.nice else []
    q = lambda xs: " ".join("'%s'" % x.replace("'", "'\\''") for x in xs)
    train = os.path.join(args.bin, "lns_train")
    lines = ["set -o pipefail", "cd '%s'" % ROOT]
    if c["scheme"] == "lns_scaled_init":
        # scaled_init's weights (o_proj and down_proj at init_std/sqrt(2L)) with LNS on top: the
        # two schemes share every parameter name, so a scaled_init model saved at step 0 and
        # exported is LNS's initialisation with the paper's scaled init (no C++ scheme needed).
        init = dict(c, scheme="scaled_init")
        init_dir = os.path.join(run_dir, "init")
        flags = [f for f in train_flags(init, init_dir + "/run", args)
                 if not f.startswith(("--steps=", "--resume", "--val_data="))]
        lines.append("if [ ! -f '%s/hf/model.safetensors' ]; then" % init_dir)
        lines.append("  rm -rf '%s'" % init_dir)
        lines.append("  %s --steps=0 --val_data= > '%s/init.log' 2>&1 || exit 3"
                     % (q(nice + [train] + flags), run_dir))
        lines.append("  ck=$(ls -d '%s'/run/checkpoints/step_* | tail -1)" % init_dir)
        lines.append("  %s export-hf --in=\"$ck\" --out='%s/hf' >> '%s/init.log' 2>&1 || exit 3"
                     % (q([os.path.join(args.bin, "lns_convert")]), init_dir, run_dir))
        lines.append("fi")
    lines.append("%s >> '%s/train.log' 2>&1 || exit 1" % (q(nice + [train] + train_flags(c, run_dir, args)),
                                                        run_dir))
    lines.append("ck=$(ls -d '%s'/checkpoints/step_* | tail -1)" % run_dir)
    lines.append("%s \"--checkpoint=$ck\" > '%s/eval.log' 2>&1 || exit 2"
                 % (q(nice + [os.path.join(args.bin, "lns_eval")] + eval_flags(run_dir, args, c)), run_dir))
    return "\n".join(lines) + "\n"


def diverged(run_dir):
    """True when the training stopped on a non-finite loss or norm (docs/training.md)."""
    try:
        with open(os.path.join(run_dir, "train.log"), errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    return "training diverged" in text or "non-finite" in text


def mpi_session_dir():
    """A private folder for one run's Open MPI session files (OMPI_MCA_orte_tmpdir_base).
    lns_train and lns_eval started without mpirun are Open MPI singletons, and every
    singleton creates, then removes when it ends, the same top folder
    TMPDIR/ompi.HOST.UID. Open MPI 4.1's mkdir-then-stat is not atomic against that
    removal: a process that starts while another ends can find the folder gone between
    the two calls and fail in MPI_Init ("A call to mkdir was unable to create the desired
    directory: /tmp/ompi.HOST.0, File exists"), exit 1. With --jobs 2 a training ending
    beside an evaluation starting hit it in 3 of 7 miniature FP8 grids on this project's
    VM (2026-11-29), under every OpenBLAS kernel. Inside the caller's own base, if set."""
    return tempfile.mkdtemp(prefix="lns_mpi_", dir=os.environ.get("OMPI_MCA_orte_tmpdir_base") or None)


LOG_STAGE = {1: "train.log", 2: "eval.log", 3: "init.log"}  # script_for's exit status -> the log of that stage


def log_tail(run_dir, rc, lines=25):
    """The last lines of the failed stage's log (every log of the run if the status names
    no stage), for the failure message: a run folder may not outlive its caller."""
    names = [LOG_STAGE[rc]] if rc in LOG_STAGE else sorted(n for n in os.listdir(run_dir) if n.endswith(".log"))
    out = []
    for n in names:
        try:
            with open(os.path.join(run_dir, n), errors="replace") as f:
                text = f.read().splitlines()
        except OSError:
            continue
        out.append("--- %s (last %d of %d lines) ---" % (os.path.join(run_dir, n), min(lines, len(text)), len(text)))
        out += text[-lines:]
    return "\n".join(out) + "\n" if out else "(no log in %s)\n" % run_dir


def write_json(path, obj, indent=1):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=indent, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def finish(c, run_dir, rc, seconds, record_dir="", jobs=1, device="cpu"):
    """result.json in the run directory and, with record_dir, the run's record there (the
    small JSON the report needs, kept in the repository: runs/ is not)."""
    if rc == 0:
        with open(os.path.join(run_dir, "eval.json")) as f:
            ev = json.load(f)
        res = dict(c, status="ok", val_ppl=ev["ppl"], seconds=seconds, device=device)
    elif rc == 1 and diverged(run_dir):
        res = dict(c, status="diverged", val_ppl=None, seconds=seconds, device=device)
    else:
        return None
    write_json(os.path.join(run_dir, "result.json"), res)
    if record_dir:
        os.makedirs(record_dir, exist_ok=True)
        write_json(os.path.join(record_dir, run_name(c) + ".json"),
                   depth_report.record_of(depth_report.read_run(run_dir), jobs), indent=None)
    return res


def prior_names(record_dir):
    """Run names of the earlier sessions whose runs were not kept, only summarised
    (RECORD_DIR/prior_*.json): finished, unless --rerun_prior."""
    names = set()
    if record_dir and os.path.isdir(record_dir):
        for n in os.listdir(record_dir):
            if n.startswith("prior_") and n.endswith(".json"):
                with open(os.path.join(record_dir, n)) as f:
                    names.update(run_name(r) for r in json.load(f).get("runs", []))
    return names


def finished(c, out, record_dir, prior=()):
    """The one rule for a finished cell: its result in OUT, its record, or a summarised run."""
    name = run_name(c)
    return (name in prior or os.path.exists(os.path.join(out, name, "result.json"))
            or bool(record_dir) and os.path.exists(os.path.join(record_dir, name + ".json")))


def finished_loss(c, out, record_dir):
    """The validation loss of a finished cell (inf if it diverged), else None: from its
    record, or from its result.json (loss = log ppl)."""
    name = run_name(c)
    for path, key in ((os.path.join(record_dir, name + ".json") if record_dir else "", "loss"),
                      (os.path.join(out, name, "result.json"), "val_ppl")):
        if path and os.path.exists(path):
            with open(path) as f:
                r = json.load(f)
            if r.get("status") == "diverged":
                return math.inf
            v = r.get(key)
            if isinstance(v, (int, float)):
                return math.log(v) if key == "val_ppl" else float(v)
    return None


def fmt_s(s):
    if s is None:
        return "?"
    s = int(s)
    return "%dh%02dm" % (s // 3600, s % 3600 // 60) if s >= 3600 else "%dm%02ds" % (s // 60, s % 60)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--study", default="width64", choices=sorted(STUDIES),
                    help="width64 (docs/depth_study.md) or scale (width 512 on the real corpus, "
                         "docs/depth_study_scale.md): the defaults of --grid, --out, --data, --vocab, --record")
    ap.add_argument("--grid", default=None, help="width64: smoke, session (priority order; hours on 2 busy cores) "
                    "or full; scale: scale, or scale_mini (the same grid in seconds, for tests)")
    ap.add_argument("--out", default=None, help="directory of the run directories")
    ap.add_argument("--data", default=None, help="token files prefix (tools/experiments/bpe_corpus.py; for the "
                    "scale study real_corpus.py)")
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--eval_tokens", type=int, default=16384)
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (each gets cores/jobs OpenBLAS threads)")
    ap.add_argument("--nice", type=int, default=0, help="nice level of the trainings (19: only idle CPU)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--bin", default="build", help="the folder of lns_train, lns_eval and lns_convert (a CUDA "
                    "build for --device=cuda)")
    ap.add_argument("--only", default="", help="comma-separated groups to run (depth, lr, budget, schemes, embed)")
    ap.add_argument("--cells", default="", help="comma-separated run names or shell patterns to run (e.g. 'L12_*_lr3*')")
    ap.add_argument("--max_runs", type=int, default=0, help="start at most this many runs (0 = all)")
    ap.add_argument("--list", action="store_true", help="print the grid and what is done, run nothing")
    ap.add_argument("--print_record", action="store_true", help="print the record folder (--record, or the "
                    "device's) and exit: the scripts around this one ask here")
    ap.add_argument("--record", default=None,
                    help="keep each finished run's summary here (JSON, no checkpoint; empty: none); a cell "
                         "with a record is finished (default: RECORDS[device], as the two are separate studies)")
    ap.add_argument("--baseline_record", default=None,
                    help="--study=fp8: the records of the cells without FP8 (default: the width-64 study's, "
                         "for the device)")
    ap.add_argument("--rerun_prior", action="store_true",
                    help="rerun the cells only summarised in RECORD/prior_*.json (their runs were not kept)")
    ap.add_argument("--threads", type=int, default=0,
                    help="OpenBLAS threads per run (0: cores / jobs; 1 on a machine busy with other work)")
    args = ap.parse_args(argv)
    if args.device not in RECORDS:
        raise SystemExit("depth_study: --device=%s: expected cpu or cuda" % args.device)
    study = STUDIES[args.study]
    args.grid = args.grid or GRIDS[args.study][1 if args.study == "width64" else 0]  # width64: session
    if args.grid not in GRIDS[args.study]:
        raise SystemExit("depth_study: --grid=%s is not a grid of --study=%s (%s)" % (
            args.grid, args.study, ", ".join(GRIDS[args.study])))
    args.out = args.out or study["out"]
    args.data = args.data or study["data"]
    args.vocab = args.vocab or study["vocab"]
    if args.record is None:
        args.record = study["records"][args.device]
    if study.get("baseline") and args.baseline_record is None:
        args.baseline_record = STUDIES[study["baseline"]]["records"][args.device]
    if args.print_record:
        print(args.record)
        return 0
    if args.jobs < 1:
        raise SystemExit("depth_study: --jobs=%d: expected >= 1" % args.jobs)
    os.chdir(ROOT)
    out = os.path.abspath(args.out)
    record = os.path.abspath(args.record) if args.record else ""
    baseline = os.path.abspath(args.baseline_record) if args.baseline_record else ""

    def record_for(c):
        """Where a cell's record is kept: the FP8 study keeps its cells without FP8 in the
        baseline study's folder (they are that study's cells)."""
        return baseline if baseline and not c.get("fp8") else record

    # The FP8 study pairs each FP8 run with its baseline seed by seed, which an earlier
    # session's summary (no per-seed loss) cannot do: it reruns the summarised baselines.
    prior = set() if args.rerun_prior or baseline else prior_names(record)

    def select():
        cells = grid(args.grid, lambda c: finished_loss(c, out, record_for(c)))
        if args.only:
            groups = set(args.only.split(","))
            cells = [c for c in cells if c["group"] in groups]
        if args.cells:
            pats = args.cells.split(",")
            cells = [c for c in cells if any(fnmatch.fnmatchcase(run_name(c), p) for p in pats)]
        return cells, [c for c in cells if not finished(c, out, record_for(c), prior)]

    cells, todo = select()
    if args.list:
        for c in cells:
            done = finished(c, out, record_for(c), prior)
            print("%-8s %-44s %s" % (c["group"], run_name(c), ("summarised" if run_name(c) in prior else "done")
                                     if done else "-"))
        print("depth_study: %d cells, %d to run, cost %.0f block-steps left" % (len(cells), len(todo),
                                                                              sum(cost(c) for c in todo)))
        return 0
    args.bin = os.path.abspath(args.bin)
    for p in (args.data + ".train.tok", args.data + ".val.tok", os.path.join(args.bin, "lns_train"),
              os.path.join(args.bin, "lns_eval")):
        if not os.path.exists(p):
            raise SystemExit("depth_study: %s missing (bash tools/experiments/depth_study.sh builds and prepares it)" % p)
    if args.max_runs:
        todo = todo[:args.max_runs]
    env = dict(os.environ)
    threads = str(args.threads or max(1, (os.cpu_count() or 1) // args.jobs))
    env.update(OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads)
    t0 = time.time()
    running = {}  # pid -> (cell, popen, start)
    done_cost, done_time, failed = 0.0, 0.0, []
    total_cost = sum(cost(c) for c in todo)
    n_total, n_done = len(todo), 0
    stopping = [False]

    def on_signal(signum, frame):
        stopping[0] = True
        for _, p, _, _ in running.values():
            try:
                os.killpg(p.pid, signal.SIGTERM)  # lns_train saves a checkpoint on SIGTERM
            except OSError:
                pass

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    queue = list(todo)
    started = {run_name(c) for c in queue}
    last_line = 0.0
    while (queue or running) and not stopping[0]:
        while queue and len(running) < args.jobs and not stopping[0]:
            c = queue.pop(0)
            run_dir = os.path.join(out, run_name(c))
            os.makedirs(run_dir, exist_ok=True)
            with open(os.path.join(run_dir, "cell.json"), "w") as f:
                json.dump(c, f, indent=1, sort_keys=True)
            sh = os.path.join(run_dir, "run.sh")
            with open(sh, "w") as f:
                f.write(script_for(c, run_dir, args))
            session = mpi_session_dir()
            p = subprocess.Popen(["bash", sh], env=dict(env, OMPI_MCA_orte_tmpdir_base=session),
                                 start_new_session=True)
            running[p.pid] = (c, p, time.time(), session)
        time.sleep(1.0)
        for pid in list(running):
            c, p, start, session = running[pid]
            rc = p.poll()
            if rc is None:
                continue
            del running[pid]
            shutil.rmtree(session, ignore_errors=True)
            n_done += 1
            secs = time.time() - start
            run_dir = os.path.join(out, run_name(c))
            res = finish(c, run_dir, rc, secs, record_for(c), args.jobs, args.device) if not stopping[0] else None
            if stopping[0]:
                sys.stderr.write("\ndepth_study: %s stopped; it resumes from its checkpoint\n" % run_name(c))
            elif res is None:
                failed.append(run_name(c))
                sys.stderr.write("\ndepth_study: %s failed (exit %d; see %s/*.log)\n%s" % (
                    run_name(c), rc, run_dir, log_tail(run_dir, rc)))
            else:
                done_cost += cost(c)
                done_time += secs
                sys.stderr.write("\ndepth_study: %s %s ppl %s in %s\n" % (
                    run_name(c), res["status"], "%.4f" % res["val_ppl"] if res["val_ppl"] else "-", fmt_s(secs)))
        if not queue and not running and not stopping[0] and not args.max_runs:
            # a finished sweep may have added the cells that wait on its winner
            new = [c for c in select()[1] if run_name(c) not in started]
            started.update(run_name(c) for c in new)
            queue += new
            n_total += len(new)
            total_cost += sum(cost(c) for c in new)
        now = time.time()
        if now - last_line >= 10 or not (queue or running):
            last_line = now
            left = sum(cost(c) for c in queue) + sum(cost(c) * 0.5 for c, _, _, _ in running.values())
            # per-job seconds per cost unit, times the cost left, over the jobs in parallel
            eta = left * (done_time / done_cost) / args.jobs if done_cost else None
            sys.stderr.write("\r[depth_study] %d/%d done, %d running, %d queued, %d failed | elapsed %s | ETA %s   "
                             % (n_done, n_total, len(running), len(queue), len(failed), fmt_s(now - t0), fmt_s(eta)))
            sys.stderr.flush()
    for _, p, _, session in running.values():
        p.wait()
        shutil.rmtree(session, ignore_errors=True)
    sys.stderr.write("\ndepth_study: %s; %d runs finished, %d failed, %s of %.0f block-steps in %s\n" % (
        "stopped" if stopping[0] else "grid done", n_done - len(failed), len(failed),
        "%.0f" % done_cost, total_cost, fmt_s(time.time() - t0)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
