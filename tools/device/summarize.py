#!/usr/bin/env python3
"""Summarises a results folder of tools/device/run_gpu.sh as markdown tables,
ready to paste into docs/BENCHMARKS.md:

    python3 tools/device/summarize.py [RESULTS_DIR]      (default ./gpu-results)

Reads (each optional; what is missing shows as "not run"):
  env.json            date, GPU, driver, nvcc, git commit
  run.log             '### step NAME' / '### done NAME rc=RC seconds=S' markers
                      and the 'RESULT {json}' lines of lns_bench_step and
                      bench_step_torch.py printed between them
  build.log           the same markers for the configure and build stages
  kernels.json        lns_bench_kernels --json
  kernels_torch.json  tools/bench/bench_kernels_torch.py --json

The tests row counts the tests ctest ran (step "test") and those the carried test
programs ran (step "test_gpu", tools/device/gtest_each.sh's verdict lines). Each lns step
variant is compared with its config's PyTorch peer (the padded one where it ran), with
the min-max of its timed steps; a variant whose GPU correctness test (CORRECTNESS) did
not pass in the same run is marked "(untested)", "(test failed)" or "(test skipped)" and
has no ratio.

Kernel figures are paired by name. Either file may be {"results": [records]},
a list of records, or a flat {name: value} mapping; a record is
{"name", "value", "metric" (GB/s, TFLOP/s, ...), optional "variant"
(PyTorch: "eager" / "compile")}. The ratio column is lns / PyTorch (for
PyTorch figures with variants, the best variant); for ms and GiB lower is
better, for every other figure higher is better.
"""

import fnmatch
import json
import os
import re
import sys

NOT_RUN = "not run"
# A bench step's name prefix -> the name its figures have in a record (bench_record.py)
PEERS = {"step_": "lns", "step_graphs_": "lns_graphs", "step_cudnn_": "lns_cudnn", "step_fp8_": "lns_fp8",
         "step_fp8bw_": "lns_fp8_blockwise",
         "step_torch_": "torch_compile", "step_torch_padded_": "torch_compile_padded"}
# The GPU test that checks each of lns's step variants against the CPU step (a gtest name
# or an fnmatch pattern over a parameterised one's names: every match must pass). A figure
# of such a variant counts only where its test passed on that GPU in the same run: a fast
# step that computes the wrong thing is no figure. The plain step (fused attention) is not
# gated: ModelStep and FusedModelStep passed on an H200 and an H100 (2026-11-26/27)
# before the records kept tests.
CORRECTNESS = {"lns_cudnn": "CudnnModelStep.GpuStepMatchesCpuStep",
               "lns_fp8": "ModelStep.Fp8GpuStepMatchesCpuFp8Step",
               "lns_fp8_blockwise": "ModelStep.Fp8BlockwiseGpuStepMatchesCpuStep",
               "lns_graphs": "Schemes/CudaGraphs.GraphedStepsEqualUngraphedBitForBit/*"}


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_steps(*logs):
    """{step name: {"rc", "seconds", "results": [RESULT dicts], "lines": [...]}} from the markers."""
    steps = {}
    for path in logs:
        try:
            lines = open(path, errors="replace").read().splitlines()
        except OSError:
            continue
        cur = None
        for line in lines:
            m = re.match(r"### step (\S+?):? ", line + " ")
            if m:
                cur = steps.setdefault(m.group(1), {"rc": None, "seconds": None, "results": [], "lines": []})
                continue
            m = re.match(r"### done (\S+) rc=(-?\d+) seconds=(\d+)", line)
            if m:
                s = steps.setdefault(m.group(1), {"rc": None, "seconds": None, "results": [], "lines": []})
                s["rc"], s["seconds"] = int(m.group(2)), int(m.group(3))
                cur = None
                continue
            if cur is None:
                continue
            cur["lines"].append(line)
            if line.startswith("RESULT "):
                try:
                    cur["results"].append(json.loads(line[len("RESULT "):]))
                except ValueError:
                    pass
    return steps


def kernel_records(data):
    """Normalises a kernels JSON into {name: {variant or "": record}}."""
    if data is None:
        return {}
    if isinstance(data, dict) and isinstance(data.get("results"), list):
        items = data["results"]
    elif isinstance(data, list):
        items = data
    elif isinstance(data, dict):
        items = []
        for k, v in data.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                items.append({"name": k, "value": v})
            elif isinstance(v, dict) and "value" in v:
                items.append(dict(v, name=v.get("name", k)))
    else:
        items = []
    out = {}
    for r in items:
        if isinstance(r, dict) and "name" in r and isinstance(r.get("value"), (int, float)):
            out.setdefault(r["name"], {})[r.get("variant") or ""] = r
    return out


def fmt(v, digits=None):
    if v is None:
        return NOT_RUN
    if isinstance(v, str):
        return v
    if digits is None:
        digits = 0 if abs(v) >= 1000 else 1 if abs(v) >= 10 else 2 if abs(v) >= 1 else 3
    return f"{v:,.{digits}f}"


def spread(result):
    """" (min-max, N steps)" of a RESULT that has them, else ""."""
    if not result or not all(isinstance(result.get(k), (int, float)) for k in ("min_ms", "max_ms", "steps")):
        return ""
    return f" ({fmt(result['min_ms'])}-{fmt(result['max_ms'])}, {result['steps']} steps)"


def ratio(a, b):
    if a is None or b is None or not b:
        return "—"
    return f"{a / b:.2f}"


def missing(steps, name):
    """What to print for a figure a step should have given: "not run", or why not."""
    s = steps.get(name)
    if s is None:
        return NOT_RUN
    if s["rc"] is None:
        return "did not finish"
    return f"failed (rc {s['rc']})" if s["rc"] else "no figure"


def status_of(steps, name):
    s = steps.get(name)
    if s is None:
        return NOT_RUN
    if s["rc"] is None:
        return "did not finish"
    return ("ok" if s["rc"] == 0 else f"FAILED (rc {s['rc']})") + f", {s['seconds']} s"


def peer_of(step_name):
    """(config, record name) of a bench step ("step_cudnn_1b_lns" -> ("1b_lns", "lns_cudnn")), or None."""
    for prefix, peer in sorted(PEERS.items(), key=lambda p: -len(p[0])):  # longest prefix first
        if step_name.startswith(prefix):
            return step_name[len(prefix):], peer
    return None


# ctest's line per test: "  3/40 Test  #3: Suite.Name .......   Passed    1.2 sec" (or
# "***Failed", "***Timeout", "***Exception: ...", "***Skipped", "***Not Run")
CTEST_LINE = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+) \.*\s*(?:\*\*\*)?(\w+)")
# tools/device/gtest_each.sh's line per test
EACH_LINE = re.compile(r"^gtest_each: (passed|skipped|FAILED) (\S+)")


def test_verdicts(steps, names=("test", "test_gpu")):
    """{test name: "passed" | "skipped" | "failed"} of every test the run's test steps
    report: ctest's (step "test") and the carried test programs' (step "test_gpu",
    tools/device/gtest_each.sh). A test reported twice keeps its worst verdict."""
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    out = {}
    for name in names:
        for line in (steps.get(name) or {}).get("lines", []):
            m, e = CTEST_LINE.match(line), EACH_LINE.match(line)
            if m and name == "test":
                word = m.group(2)
                test, verdict = m.group(1), ("passed" if word == "Passed" else
                                             "skipped" if word in ("Skipped", "Not") else "failed")
            elif e and name == "test_gpu":
                test, verdict = e.group(2), e.group(1).lower()
            else:
                continue
            if rank[verdict] >= rank.get(out.get(test), -1):
                out[test] = verdict
    return out


def verdict_of(tests, pattern):
    """"passed" where every test matching PATTERN passed (and one did), "failed" where one
    failed, "skipped" where one skipped and none failed, else "untested"."""
    got = [v for n, v in tests.items() if fnmatch.fnmatchcase(n, pattern)]
    if not got:
        return "untested"
    if "failed" in got:
        return "failed"
    return "skipped" if "skipped" in got else "passed"


def gate(tests, peer):
    """"" where a figure of PEER counts in a run whose tests are TESTS (no correctness test
    for it, or its test passed), else why not, for its table cell: "(untested)",
    "(test failed)", "(test skipped)"."""
    pattern = CORRECTNESS.get(peer)
    if pattern is None:
        return ""
    v = verdict_of(tests, pattern)
    return "" if v == "passed" else {"untested": "(untested)", "failed": "(test failed)",
                                     "skipped": "(test skipped)"}[v]


def test_summary(steps):
    """The tests a run ran, ctest's and the carried programs', counted: "41/42 passed; failed: X"."""
    if "test" not in steps and "test_gpu" not in steps:
        return NOT_RUN
    parts = []
    s = steps.get("test")
    if s is not None:
        text = "\n".join(s["lines"])
        m = re.search(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)", text)
        if m:
            failed, total = int(m.group(2)), int(m.group(3))
            out = f"{total - failed}/{total} passed"
            bad = re.findall(r"^\s+\d+ - (\S+) \((\w+)\)", text, re.M)
            if bad:
                out += "; failed: " + ", ".join(f"{n} ({why})" for n, why in bad)
            parts.append(out)
        elif "No tests were found" in text:
            parts.append("no tests with that label")
        else:
            parts.append(status_of(steps, "test"))
    s = steps.get("test_gpu")
    if s is not None:
        each = test_verdicts(steps, ("test_gpu",))
        if each:
            out = f"{sum(v == 'passed' for v in each.values())}/{len(each)} passed"
            skipped = sorted(n for n, v in each.items() if v == "skipped")
            failed = sorted(n for n, v in each.items() if v == "failed")
            if skipped:
                out += "; skipped: " + ", ".join(skipped)
            if failed:
                out += "; failed: " + ", ".join(failed)
            if s["rc"] is None:
                out += "; cut off before the rest"
            parts.append(out)
        else:
            parts.append(status_of(steps, "test_gpu"))
    return "; ".join(parts)


def main(argv):
    d = argv[1] if len(argv) > 1 else "gpu-results"
    env = load_json(os.path.join(d, "env.json")) or {}
    steps = read_steps(os.path.join(d, "build.log"), os.path.join(d, "run.log"))
    out = []
    gpu = env.get("gpu", "unknown GPU")
    out.append(f"**{gpu}** (name, driver) — {env.get('date', 'date unknown')}, nvcc "
               f"{env.get('nvcc') or '?'}, lns {env.get('git') or '?'}")
    out.append("")
    out.append("| stage | status |")
    out.append("|---|---|")
    for name in ("configure", "build"):
        out.append(f"| {name} | {status_of(steps, name)} |")
    out.append(f"| tests (ctest -L {env.get('test_label') or 'gpu'}, or the carried test programs) | "
               f"{test_summary(steps)} |")
    for name in (n for n in steps if n not in ("configure", "build", "test")):  # in run order
        out.append(f"| {name} | {status_of(steps, name)} |")
    out.append("")

    # ---- kernels -----------------------------------------------------------------
    ours = kernel_records(load_json(os.path.join(d, "kernels.json")))
    theirs = kernel_records(load_json(os.path.join(d, "kernels_torch.json")))
    names = list(ours) + [n for n in theirs if n not in ours]
    out.append("| kernel figure | lns | PyTorch | ratio lns/PyTorch |")
    out.append("|---|---|---|---|")
    if not names:
        out.append(f"| kernels | {missing(steps, 'kernels')} | {missing(steps, 'kernels_torch')} | — |")
    for n in names:
        o = next(iter(ours[n].values()), None) if n in ours else None
        variants = theirs.get(n, {})
        metric = (o or {}).get("metric") or next(iter(variants.values()), {}).get("metric", "")
        lower_better = metric in ("ms", "us", "GiB", "s")
        best = None
        parts = []
        for var, r in sorted(variants.items()):
            parts.append(f"{fmt(r['value'])}" + (f" ({var})" if var else ""))
            if best is None or (r["value"] < best if lower_better else r["value"] > best):
                best = r["value"]
        label = f"{n} ({metric})" if metric else n
        out.append(f"| {label} | {fmt(o['value']) if o else missing(steps, 'kernels')} | "
                   f"{', '.join(parts) if parts else missing(steps, 'kernels_torch')} | "
                   f"{ratio(o['value'] if o else None, best)} |")
    out.append("")

    # ---- training steps: each lns run of a config against its PyTorch peer (the padded
    # one where it ran); a run whose correctness test did not pass in this run is marked
    # and has no ratio (CORRECTNESS) ------------------------------------------------------
    tests = test_verdicts(steps)
    runs = {}  # config -> {record name: step name}, in run order
    for n in steps:
        got = peer_of(n)
        if got:
            runs.setdefault(got[0], {})[got[1]] = n
    figures = (("median_ms", "step, median ms (lower is better)"), ("tokens_per_s", "tokens/s"),
               ("mfu", "MFU"), ("peak_mem_gib", "peak memory GiB (lower is better)"))
    out.append("| training step | lns | PyTorch | ratio lns/PyTorch |")
    out.append("|---|---|---|---|")
    if not runs:
        out.append(f"| steps | {NOT_RUN} | {NOT_RUN} | — |")
    for cfg, peers in runs.items():
        ref_step = peers.get("torch_compile_padded") or peers.get("torch_compile") or f"step_torch_{cfg}"
        ref = ((steps.get(ref_step) or {}).get("results") or [None])[-1]
        for peer, name in peers.items():
            if peer.startswith("torch"):
                continue
            lns = ((steps.get(name) or {}).get("results") or [None])[-1]
            mark = gate(tests, peer)
            what = cfg if peer == "lns" else f"{cfg} ({peer})"
            for key, label in figures:
                a = lns.get(key) if lns else None
                b = ref.get(key) if ref else None
                if key == "mfu":
                    sa = f"{100 * a:.1f}%" if a is not None else None
                    sb = f"{100 * b:.1f}%" if b is not None else None
                else:
                    sa, sb = (fmt(a) if a is not None else None), (fmt(b) if b is not None else None)
                if key == "median_ms":  # the spread of the timed steps it is the median of
                    sa = sa and sa + spread(lns)
                    sb = sb and sb + spread(ref)
                sa = sa or ("—" if lns is not None else missing(steps, name))
                sb = sb or ("—" if ref is not None else missing(steps, ref_step))
                if a is not None and mark:
                    sa, a = f"{sa} {mark}", None  # no ratio: the figure does not count
                out.append(f"| {what}: {label} | {fmt(sa)} | {fmt(sb)} | {ratio(a, b)} |")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv)
