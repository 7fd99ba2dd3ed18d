#!/usr/bin/env python3
"""How long a call of tools/device/run_gpu.sh will run, from what its steps cost when
they were measured (tools/device/costs.json and the records it names):

    DRY_RUN=1 PRESET=tools/device/lease.env bash tools/device/run_gpu.sh
        runs nothing, writes the call's plan ($OUT/plan.tsv: step, limit, command) and
        prints this tool's prediction for it
    python3 tools/device/predict.py PLAN [--costs FILE] [--records DIR]
        the prediction for a plan; exit status 1 where it does not fit the budget
    python3 tools/device/predict.py --readme [--doc tools/device/README.md]
        rewrites the README's list of the measured costs from costs.json

A step costs what costs.json says it cost (scaled to its own step count: a median of 10
timed steps costs more than one of 5), never more than its limit (run_gpu.sh kills it
then), and its limit where it was never measured; a step with neither is unbounded, and
so is the call.
"""
import argparse
import json
import os
import re
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import doc_markers  # noqa: E402  (the generated part of the README)

COSTS = os.path.join(HERE, "costs.json")
RECORDS = os.path.join(ROOT, "docs", "benchmarks")
README = os.path.join(HERE, "README.md")
BEGIN, END = "<!-- device_costs:begin -->", "<!-- device_costs:end -->"


def fail(msg):
    sys.exit(f"predict: {msg}")


def load_costs(path=COSTS):
    try:
        with open(path) as f:
            costs = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: not readable as JSON ({e.__class__.__name__})")
    for key in ("budget_s", "kill_grace_s", "setup_s", "per_step_s", "steps"):
        if key not in costs:
            fail(f"{path}: has no '{key}'")
    return costs


class Costs:
    """The cost of each step name, resolved against the records it names."""

    def __init__(self, costs, records_dir=RECORDS):
        self.c, self.records_dir, self._records = costs, records_dir, {}

    def value(self, key):
        return float(self.c[key]["value"])

    def record(self, name):
        if name not in self._records:
            path = os.path.join(self.records_dir, name)
            try:
                with open(path) as f:
                    self._records[name] = json.load(f)
            except (OSError, ValueError) as e:
                fail(f"costs.json names {path}, which is not a readable record ({e.__class__.__name__})")
        return self._records[name]

    def measured(self, name, seen=()):
        """(fixed seconds, seconds a step, what it rests on) of step NAME, or None where
        costs.json has no cost per step for it (a 'seconds' entry, or none)."""
        e = self.c["steps"].get(name)
        if e is None or "seconds" in e:
            return None
        if name in seen:
            fail(f"costs.json: '{name}' is defined by itself ('like' / 'fixed_like' loop)")
        if "like" in e:
            got = self.measured(e["like"], seen + (name,))
            if got is None:
                fail(f"costs.json: '{name}' is like '{e['like']}', which has no cost per step")
            return got[0], got[1], f"as {e['like']}: {e['basis']}"
        rec = self.record(e["record"])
        parts = e["figure"].split(".")
        if len(parts) != 3 or parts[0] != "configs":
            fail(f"costs.json: '{name}': figure '{e['figure']}' is not configs.<config>.<run>")
        _, cfg, peer = parts
        fig = rec.get("configs", {}).get(cfg, {}).get(peer, {})
        if not isinstance(fig.get("step_ms"), (int, float)):
            fail(f"costs.json: '{name}': {e['record']} has no {e['figure']}.step_ms")
        step_s = fig["step_ms"] / 1e3
        if "fixed_like" in e:
            other = self.measured(e["fixed_like"], seen + (name,))
            if other is None:
                fail(f"costs.json: '{name}': fixed_like '{e['fixed_like']}' has no cost per step")
            return other[0], step_s, (f"{e['record']}: {fig['step_ms']:,.1f} ms a step; start-up and exit as "
                                      f"{e['fixed_like']}'s ({e['basis']})")
        status = rec.get("status", {}).get(cfg, {}).get(peer, "")
        m = re.match(r"ok, (\d+) s$", status)
        if not m:
            fail(f"costs.json: '{name}': {e['record']} status.{cfg}.{peer} is {status!r}, not 'ok, N s'")
        seconds = int(m.group(1))
        fixed = max(0.0, seconds - e["steps_run"] * step_s)
        return fixed, step_s, (f"{e['record']}: {seconds} s for {e['steps_run']} steps of {fig['step_ms']:,.1f} ms "
                               f"({e['basis']})")

    def estimate(self, name, command, env):
        """(seconds, basis) of step NAME running COMMAND, or (None, why) where not measured."""
        e = self.c["steps"].get(name)
        if e is None:
            return None, "not measured"
        if "seconds" in e:
            if e.get("only_if_unset") and env.get(e["only_if_unset"]):
                return None, f"not measured with {e['only_if_unset']} set"
            return float(e["seconds"]), e["basis"]
        fixed, step_s, basis = self.measured(name)
        n = planned_steps(command)
        if n is None:
            return None, f"cannot tell its step count from: {command}"
        return fixed + n * step_s, f"{fixed:.1f} s + {n} x {step_s:.2f} s; {basis}"


def planned_steps(command):
    """Steps a bench command runs: warm-up + timed (+ 1 profiled), or None."""
    words = command.split()
    flags = {}
    for i, w in enumerate(words):
        name, eq, value = w.partition("=")
        if not eq and i + 1 < len(words):
            value = words[i + 1]
        flags.setdefault(name, value)
    if "--bench_steps" in flags:  # lns_bench_step
        try:
            return int(flags["--bench_steps"]) + int(flags.get("--bench_warmup", 2)) + ("--profile" in words)
        except ValueError:
            return None
    if "--steps" in flags:  # bench_step_torch.py
        try:
            return int(flags["--steps"]) + int(flags.get("--warmup", 2))
        except ValueError:
            return None
    return None


def read_plan(path):
    plan = []
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        fail(f"{path}: cannot read the plan ({e.strerror})")
    for n, line in enumerate(lines, 1):
        parts = line.split("\t", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            fail(f"{path}:{n}: expected 'step<TAB>limit seconds<TAB>command', got {line!r}")
        plan.append((parts[0], int(parts[1]), parts[2]))
    return plan


def predict(plan, costs, env=None):
    """{"rows": [(step, seconds or None, basis)], "total_s" (None: unbounded), "budget_s", "fits"}."""
    env = os.environ if env is None else env
    grace, per_step = costs.value("kill_grace_s"), costs.value("per_step_s")
    rows = [("set-up", costs.value("setup_s"), costs.c["setup_s"]["basis"])]
    for name, limit, command in plan:
        est, basis = costs.estimate(name, command, env)
        if est is None and limit > 0:
            s, basis = limit + grace, f"its limit, {limit} s + {grace:.0f} ({basis})"
        elif est is None:
            s, basis = None, f"unbounded: {basis} and no limit (TIMEOUT_{name} or STEP_TIMEOUT)"
        elif limit > 0 and est > limit + grace:
            s, basis = limit + grace, f"its limit, {limit} s + {grace:.0f} (measured: {est:.0f} s)"
        else:
            s = est
        rows.append((name, None if s is None else s + per_step, basis))
    total = None if any(s is None for _, s, _ in rows) else sum(s for _, s, _ in rows)
    budget = costs.value("budget_s")
    return {"rows": rows, "total_s": total, "budget_s": budget, "fits": total is not None and total <= budget}


def report(p):
    out = ["| step | predicted s | from |", "|---|---|---|"]
    for name, s, basis in p["rows"]:
        out.append(f"| {name} | {'unbounded' if s is None else f'{s:.0f}'} | {basis} |")
    if p["total_s"] is None:
        out.append(f"predicted: unbounded (a step with no measured cost and no limit); the budget is "
                   f"{p['budget_s']:.0f} s")
    else:
        out.append(f"predicted: {p['total_s']:.0f} s ({p['total_s'] / 60:.1f} min) against a budget of "
                   f"{p['budget_s']:.0f} s: {'fits' if p['fits'] else 'DOES NOT FIT'}")
    return "\n".join(out)


def readme_block(costs):
    """The README's list of the measured costs, from costs.json."""
    out = ["Each step's cost, as `tools/device/predict.py` takes it (from `tools/device/costs.json` and the "
           "records it names; generated by `python3 tools/device/predict.py --readme`):", ""]
    for key, label in (("setup_s", "set-up"), ("per_step_s", "after each step")):
        out.append(f"- {label}: {costs.value(key):g} s ({costs.c[key]['basis']})")
    for name, e in costs.c["steps"].items():
        if "seconds" in e:
            out.append(f"- `{name}`: {e['seconds']} s ({e['basis']})")
            continue
        fixed, step_s, basis = costs.measured(name)
        out.append(f"- `{name}`: {fixed:.1f} s + {step_s:.2f} s a step ({basis})")
    out.append(f"- a step not listed: its limit, plus {costs.value('kill_grace_s'):g} s; budget of a call "
               f"{costs.value('budget_s'):g} s ({costs.c['budget_s']['basis']})")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan", nargs="?", help="a plan.tsv of DRY_RUN=1 bash tools/device/run_gpu.sh")
    ap.add_argument("--costs", default=COSTS)
    ap.add_argument("--records", default=RECORDS)
    ap.add_argument("--readme", action="store_true", help="rewrite the README's list of costs")
    ap.add_argument("--doc", default=README)
    a = ap.parse_args(argv)
    costs = Costs(load_costs(a.costs), a.records)
    if a.readme:
        try:
            doc_markers.replace_between(a.doc, BEGIN, END, readme_block(costs))
        except ValueError as e:
            fail(str(e))
        except OSError as e:
            fail(f"{a.doc}: cannot read ({e.strerror})")
        print(f"predict: {a.doc}: costs from {a.costs}")
        return 0
    if not a.plan:
        ap.error("give a plan (DRY_RUN=1 bash tools/device/run_gpu.sh writes one), or --readme")
    p = predict(read_plan(a.plan), costs)
    print(report(p))
    return 0 if p["fits"] else 1


if __name__ == "__main__":
    sys.exit(main())
