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

Kernel figures are paired by name. Either file may be {"results": [records]},
a list of records, or a flat {name: value} mapping; a record is
{"name", "value", "metric" (GB/s, TFLOP/s, ...), optional "variant"
(PyTorch: "eager" / "compile")}. The ratio column is lns / PyTorch (for
PyTorch figures with variants, the best variant); for ms and GiB lower is
better, for every other figure higher is better.
"""

import json
import os
import re
import sys

NOT_RUN = "not run"


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


def test_summary(steps):
    s = steps.get("test")
    if s is None:
        return NOT_RUN
    text = "\n".join(s["lines"])
    m = re.search(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)", text)
    if m:
        failed, total = int(m.group(2)), int(m.group(3))
        out = f"{total - failed}/{total} passed"
        bad = re.findall(r"^\s+\d+ - (\S+) \((\w+)\)", text, re.M)
        if bad:
            out += "; failed: " + ", ".join(f"{n} ({why})" for n, why in bad)
        return out
    if "No tests were found" in text:
        return "no tests with that label"
    return status_of(steps, "test")


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
    out.append(f"| tests (ctest -L {env.get('test_label') or 'gpu'}) | {test_summary(steps)} |")
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

    # ---- training steps ----------------------------------------------------------
    cfgs = []
    for n in steps:
        m = re.match(r"step_(?:torch_(?:padded_)?)?(.+)$", n)
        if m and m.group(1) not in cfgs:
            cfgs.append(m.group(1))
    figures = (("median_ms", "step, median ms (lower is better)"), ("tokens_per_s", "tokens/s"),
               ("mfu", "MFU"), ("peak_mem_gib", "peak memory GiB (lower is better)"))
    out.append("| training step | lns | PyTorch | ratio lns/PyTorch |")
    out.append("|---|---|---|---|")
    if not cfgs:
        out.append(f"| steps | {NOT_RUN} | {NOT_RUN} | — |")
    for cfg in cfgs:
        lns = (steps.get(f"step_{cfg}") or {}).get("results") or [None]
        ref = (steps.get(f"step_torch_{cfg}") or {}).get("results") or [None]
        lns, ref = lns[-1], ref[-1]
        for key, label in figures:
            a = lns.get(key) if lns else None
            b = ref.get(key) if ref else None
            if key == "mfu":
                sa = f"{100 * a:.1f}%" if a is not None else None
                sb = f"{100 * b:.1f}%" if b is not None else None
            else:
                sa, sb = (fmt(a) if a is not None else None), (fmt(b) if b is not None else None)
            sa = sa or ("—" if lns is not None else missing(steps, f"step_{cfg}"))
            sb = sb or ("—" if ref is not None else missing(steps, f"step_torch_{cfg}"))
            out.append(f"| {cfg}: {label} | {fmt(sa)} | {fmt(sb)} | {ratio(a, b)} |")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv)
