#!/usr/bin/env python3
"""The record of one GPU benchmark run, and the BENCHMARKS tables made from every record.

    python3 tools/device/bench_record.py RESULTS_DIR [--out DIR] [--commit SHA] [--update]
        reads RESULTS_DIR/env.json and run.log (tools/device/run_gpu.sh's bench stage)
        and writes DIR/<gpu>-<date>.json (default DIR: docs/benchmarks; --update rewrites
        that file, as run_gpu.sh does after each step, else a second run the same day is
        -2, -3, ...), atomically; prints its path
    python3 tools/device/bench_record.py --tables [--records docs/benchmarks] [--doc docs/BENCHMARKS.md]
        rewrites the part of the doc between '<!-- bench_records:begin -->' and
        '<!-- bench_records:end -->' from every record, newest last

A record (one per GPU run, committed; never edited by hand):
    {"gpu": "NVIDIA H100 80GB HBM3", "driver": "...", "date": "2026-11-27", "commit": "abc1234",
     "configs": {"1b_lns": {"lns": {"step_ms" (the median), "min_ms", "max_ms", "steps" (timed),
                                    "mfu", "peak_gib", "startup_s",
                                    "profile": {"step_ms", "rows", "bounds_ms": {class: ms}}},
                            "torch_compile": {"step_ms", "min_ms", "max_ms", "steps", "mfu", "peak_gib"},
                            "torch_compile_padded": {...}},
                 "130m_lns": ..., "1b_lns_seq4k": {"lns", "torch_compile"}},
     "status": {config: {run: "ok, 22 s"}}, "steps": {other step: "ok, 95 s"},
     "tests": {gtest or ctest name: "passed" | "skipped" | "failed"},
     "kernels": {name: {"value", "metric"}}}
A figure a step did not give is absent, and the step's status says why ("failed (rc 1)").
A profile's bounds_ms are the roofline model's when the record was made, so that its
ratios do not move when the model changes. A step variant whose GPU correctness test
(summarize.CORRECTNESS) did not pass in the same record is marked in the tables and left
out of the speed-up.
"""

import argparse
import glob
import json
import os
import re
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import summarize  # noqa: E402  (read_steps, kernel_records: the run.log format lives there)

sys.path.insert(0, os.path.join(ROOT, "tools"))
import doc_markers  # noqa: E402  (the generated part of docs/BENCHMARKS.md)

sys.path.insert(0, os.path.join(ROOT, "tools", "perf"))
import profile_model  # noqa: E402  (the roofline bound of each profile row)

BEGIN, END = "<!-- bench_records:begin -->", "<!-- bench_records:end -->"
MIN_STEPS = 10  # a step figure is the median of at least this many timed steps (issue 44)


def fail(msg):
    sys.exit(f"bench_record: {msg}")


def gpu_slug(name):
    m = re.search(r"\b([AHBL]\d{2,3}|GH200|GB200)\b", name, re.I)
    if m:
        return m.group(1).lower()
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "gpu"


def figures(result, profile):
    out = {}
    for key, name in (("median_ms", "step_ms"), ("min_ms", "min_ms"), ("max_ms", "max_ms"), ("steps", "steps"),
                      ("mfu", "mfu"), ("peak_mem_gib", "peak_gib"),
                      ("tokens_per_s", "tokens_per_s"), ("startup_s", "startup_s"),
                      ("intermediate_size", "intermediate_size")):
        if isinstance(result.get(key), (int, float)):
            out[name] = result[key]
    if profile:
        out["profile"] = profile
    return out


def model_bounds(cfg, gpu, peer):
    """{class of work: ms} the roofline model bounds a profiled step of PEER at CFG on GPU by
    (tools/perf/profile_model.py), or {} where the model has no such config or GPU."""
    try:
        return {c: t * 1e3 for c, t in profile_model.bounds(
            profile_model.model_for(cfg, profile_model.gpu_key(gpu), profile_model.PROFILED[peer])).items()}
    except (OSError, ValueError, KeyError):
        return {}


def make_record(results_dir, commit=None):
    env_path = os.path.join(results_dir, "env.json")
    env = summarize.load_json(env_path)
    if not isinstance(env, dict) or not env.get("gpu") or not env.get("date"):
        fail(f"{env_path}: missing or without 'gpu' and 'date' (run tools/device/run_gpu.sh first)")
    gpu, _, driver = env["gpu"].partition(",")
    m = re.match(r"(\d{4}-\d{2}-\d{2})(?: (\d{2}:\d{2}))?", env["date"])
    if not m:
        fail(f"{env_path}: date {env['date']!r} is not YYYY-MM-DD ...")
    steps = summarize.read_steps(os.path.join(results_dir, "run.log"))
    if not steps:
        fail(f"{os.path.join(results_dir, 'run.log')}: no '### step' markers")
    configs, status, others = {}, {}, {}
    for name, s in steps.items():
        got = summarize.peer_of(name)
        if not got:  # kernels, the tests, multi, ...: their status (and so their cost)
            others[name] = summarize.status_of(steps, name)
            continue
        cfg, peer = got
        status.setdefault(cfg, {})[peer] = summarize.status_of(steps, name)
        result = s["results"][-1] if s["results"] else {}
        profile = None
        for line in s["lines"]:
            if line.startswith("PROFILE "):
                try:
                    profile = json.loads(line[len("PROFILE "):])
                except ValueError:
                    pass
        if profile and peer in profile_model.PROFILED:
            # The bounds it is compared with, as the model gives them today: the record's
            # ratios stay what they were when the model changes.
            b = model_bounds(cfg, gpu.strip(), peer)
            if b:
                profile["bounds_ms"] = b
        got = figures(result, profile)
        if got:
            configs.setdefault(cfg, {})[peer] = got
    kernels = {}
    # kernels.json (1B's figures) and kernels_<config>.json (another config's step GEMMs)
    ours = {}
    for name in sorted(os.listdir(results_dir)):
        if name.startswith("kernels") and name.endswith(".json") and name != "kernels_torch.json":
            ours.update(summarize.kernel_records(summarize.load_json(os.path.join(results_dir, name))))
    for n, variants in ours.items():
        r = next(iter(variants.values()))
        kernels[n] = {"value": r["value"], "metric": r.get("metric", "")}
        if r.get("best_candidate", -1) >= 0:  # a GEMM another of cuBLASLt's candidates ran faster
            kernels[n]["best_candidate"] = r["best_candidate"]
            kernels[n]["best_candidate_ms"] = r["best_candidate_ms"]
    return {"gpu": gpu.strip(), "driver": driver.strip(), "date": m.group(1), "time": m.group(2) or "",
            "commit": commit or env.get("git", ""),
            "configs": configs, "status": status, "kernels": kernels,
            "tests": summarize.test_verdicts(steps), "steps": others}


def write_record(record, out_dir, update=False):
    """Writes RECORD as DIR/<gpu>-<date>.json, atomically (a reader, or a kill, sees the old
    file or the new one, never part of one). update: rewrites that file (run_gpu.sh, after
    each step of a run); else a second run the same day keeps the first (-2, -3, ...)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{gpu_slug(record['gpu'])}-{record['date']}.json")
    n = 2
    while os.path.exists(path) and not update:
        path = os.path.join(out_dir, f"{gpu_slug(record['gpu'])}-{record['date']}-{n}.json")
        n += 1
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)
    return path


def cell(d, key, fmt, status=None, mark=""):
    """A figure (with MARK: why it does not count; and its step count where under
    MIN_STEPS), or why there is none (the step's status: "did not finish"), or a dash."""
    v = (d or {}).get(key)
    if isinstance(v, (int, float)):
        text = fmt.format(v)
        n = d.get("steps")
        if key == "step_ms" and isinstance(n, int) and n < MIN_STEPS:
            text += f" ({n} steps)"
        return f"{text} {mark}" if mark else text
    return status if status and not status.startswith("ok") else "—"


def tables(records):
    out = ["| GPU, date (UTC), commit | config | lns step ms | lns MFU | with --cuda_graphs ms | "
           "with --attention=cudnn ms | with --fp8=delayed ms | with --fp8=blockwise ms | start-up s | "
           "torch.compile ms | padded FFN ms | "
           "lns speed-up (its fastest bf16 run, against the padded peer where there is one) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for path, r in records:
        tests = r.get("tests") or {}  # a record before 2026-12 kept none: its gated figures are "(untested)"
        for cfg in sorted(set(r.get("configs", {})) | set(r.get("status", {}))):
            c, st = r.get("configs", {}).get(cfg, {}), r.get("status", {}).get(cfg, {})
            lns, tc, tp = c.get("lns"), c.get("torch_compile"), c.get("torch_compile_padded")
            graphs, cudnn, fp8 = c.get("lns_graphs"), c.get("lns_cudnn"), c.get("lns_fp8")
            fp8bw = c.get("lns_fp8_blockwise")
            mark = {p: summarize.gate(tests, p) for p in c}
            peer = tp or tc
            ours = [d["step_ms"] for p, d in (("lns", lns), ("lns_graphs", graphs), ("lns_cudnn", cudnn))
                    if d and d.get("step_ms") and not mark[p]]  # only figures that count
            speed = "—"
            if ours and peer and peer.get("step_ms"):
                speed = f"{peer['step_ms'] / min(ours):.2f}x"
            out.append(f"| {r['gpu']}, {r['date']} {r.get('time', '')}, {r.get('commit', '')} | {cfg} | "
                       f"{cell(lns, 'step_ms', '{:,.1f}', st.get('lns'))} | "
                       f"{cell(lns, 'mfu', '{:.1%}')} | "
                       f"{cell(graphs, 'step_ms', '{:,.1f}', st.get('lns_graphs'), mark.get('lns_graphs'))} | "
                       f"{cell(cudnn, 'step_ms', '{:,.1f}', st.get('lns_cudnn'), mark.get('lns_cudnn'))} | "
                       f"{cell(fp8, 'step_ms', '{:,.1f}', st.get('lns_fp8'), mark.get('lns_fp8'))} | "
                       f"{cell(fp8bw, 'step_ms', '{:,.1f}', st.get('lns_fp8_blockwise'), mark.get('lns_fp8_blockwise'))} | "
                       f"{cell(lns, 'startup_s', '{:.1f}')} | "
                       f"{cell(tc, 'step_ms', '{:,.1f}', st.get('torch_compile'))} | "
                       f"{cell(tp, 'step_ms', '{:,.1f}', st.get('torch_compile_padded'))} | {speed} |")
    out += ["", "A figure marked (untested), (test failed) or (test skipped) is a step whose GPU test against "
                "the CPU step (" + ", ".join(f"{p}: `{t}`" for p, t in summarize.CORRECTNESS.items()) +
                ") did not pass in the same record; it is left out of the speed-up. (N steps): a median of "
                f"fewer than {MIN_STEPS} timed steps."]
    # Each config's profiles from the newest record that has them (a short run that
    # measured one variant does not hide the last full run's map).
    newest = {}
    for path, r in records:
        for cfg, c in r.get("configs", {}).items():
            for peer in profile_model.PROFILED:
                if (c.get(peer) or {}).get("profile"):
                    newest[(cfg, peer)] = r
    for (cfg, peer), r in sorted(newest.items()):
        prof = r["configs"][cfg][peer]["profile"]
        # the roofline model's bound per row (tools/perf/profile_model.py; projected): the one
        # the record stored when it was made, else (a record before 2026-12) today's model's
        bound = prof.get("bounds_ms") or model_bounds(cfg, r["gpu"], peer)
        what = cfg + {"lns_cudnn": " with --attention=cudnn", "lns_fp8": " with --fp8=delayed",
                      "lns_fp8_blockwise": " with --fp8=blockwise"}.get(peer, "")
        out += ["", f"Where the step goes, {what} on {r['gpu']} ({r['date']}): one profiled step of "
                    f"{prof['step_ms']:,.1f} ms (CUDA events around every op; the unprofiled median is "
                    f"{cell(r['configs'][cfg][peer], 'step_ms', '{:,.1f}')} ms), beside the roofline "
                    f"model's bound for the same work (tools/perf/profile_model.py: projected, not measured"
                    f"{'; the model of that mode: FP8 GEMMs at the FP8 peak, each cast pass at the memory bandwidth' if profile_model.PROFILED[peer] != 'none' else ''}).",
                "",
                "| class of work | ms | share | ops | bound ms (projected) | measured / bound |",
                "|---|---|---|---|---|---|"]
        for row in prof["rows"]:
            share = row["ms"] / prof["step_ms"] if prof["step_ms"] else 0
            b = bound.get(row["class"])
            b_text = f"{b:,.1f}" if b is not None else "—"
            ratio = f"{row['ms'] / b:.2f}x" if b else "—"
            out.append(f"| {row['class']} | {row['ms']:,.1f} | {share:.1%} | {row.get('ops', '—')} | "
                       f"{b_text} | {ratio} |")
    return "\n".join(out)


def write_tables(records_dir, doc):
    paths = sorted(glob.glob(os.path.join(records_dir, "*.json")))
    records = []
    for p in paths:
        try:
            with open(p) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            fail(f"{p}: not a readable record ({e.__class__.__name__})")
        if not isinstance(r, dict) or not isinstance(r.get("configs"), dict) or "date" not in r or "gpu" not in r:
            fail(f"{p}: not a record (needs 'gpu', 'date' and a 'configs' object)")
        records.append((p, r))
    records.sort(key=lambda pr: (pr[1]["date"], pr[1].get("time", ""), pr[0]))
    body = tables(records) if records else "(no GPU benchmark record yet)"
    try:
        doc_markers.replace_between(doc, BEGIN, END, body)
    except ValueError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{doc}: cannot read ({e.strerror})")
    return len(records)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", help="a results folder of tools/device/run_gpu.sh")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks"), help="where the record goes")
    ap.add_argument("--commit", help="the commit the measured binaries were built from, where env.json's git "
                                     "is not it (a run cut short before run_gpu.sh wrote the record)")
    ap.add_argument("--update", action="store_true",
                    help="rewrite DIR/<gpu>-<date>.json (run_gpu.sh, after each step), not a new -2 file")
    ap.add_argument("--tables", action="store_true", help="regenerate the BENCHMARKS tables from the records")
    ap.add_argument("--records", default=os.path.join(ROOT, "docs", "benchmarks"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "BENCHMARKS.md"))
    a = ap.parse_args(argv)
    if a.tables:
        n = write_tables(a.records, a.doc)
        print(f"bench_record: {a.doc}: tables from {n} record(s)")
        return 0
    if not a.results:
        ap.error("give a results folder, or --tables")
    print(write_record(make_record(a.results, a.commit), a.out, a.update))
    return 0


if __name__ == "__main__":
    sys.exit(main())
