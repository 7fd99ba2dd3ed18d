#!/usr/bin/env python3
"""lns_bench_step's output survives a kill and names the CPU kernel.

A run killed by `timeout` on the GPU machine once printed nothing at all: stdout into a
pipe was fully buffered. Here the program runs with its stdout on a pipe and is killed
(SIGKILL: nothing can flush after it) as soon as its first step line arrives; the
configuration and backend lines must have arrived before it, and the lines one by one. Then the kernel line
must name the kernel OPENBLAS_CORETYPE chose, and the generic kernel is warned about
on a CPU that has better (OpenBLAS moves CPU figures by about 2x). Last, the RESULT line's
figure is the median of the timed steps its step lines print (the middle two's mean for
an even count, as the PyTorch peer's statistics.median), with their min, max and count
beside it (run_gpu.sh's records keep all four).
"""
import json
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BENCH = os.environ.get("LNS_BENCH_STEP_BIN", os.path.join(ROOT, "build", "lns_bench_step"))
ARGS = ["--flagfile=" + os.path.join(ROOT, "configs", "tiny_lns.flags"), "--num_layers=2", "--seq_len=32",
        "--global_batch_size=8", "--micro_batch_size=8", "--bench_steps=100000", "--bench_warmup=1",
        "--device=cpu"]


def lines_until_first_step(env, limit_s=120):
    """Runs the benchmark, returns the stdout lines read up to its first step line, then kills it."""
    p = subprocess.Popen([BENCH] + ARGS, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    got, buf, end = [], b"", time.time() + limit_s
    try:
        while time.time() < end and not any(l.startswith("step ") for l in got):
            ready, _, _ = select.select([p.stdout], [], [], 1.0)
            if not ready:
                continue
            chunk = os.read(p.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            *done, buf = buf.split(b"\n")
            got += [l.decode() for l in done]
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    return got


def main():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("OPENBLAS_CORETYPE", None)
    failures = []
    got = lines_until_first_step(env)
    if not any(l.startswith("step 1/") for l in got):
        failures.append(f"no step line within the limit; got {got}")
    # Killed as soon as its first step line arrived: line by line, only a step or two
    # more can have come; a full buffer (4 KiB) would have brought over a hundred at once.
    steps = sum(l.startswith("step ") for l in got)
    if steps > 5:
        failures.append(f"{steps} step lines arrived at once: stdout is not line-buffered")
    if not any(l.startswith("config: hidden 128, layers 2,") for l in got):
        failures.append(f"no config line before the kill; got {got}")
    if not any(l.startswith("CPU: OpenBLAS") and ", kernel " in l for l in got):
        failures.append(f"no CPU kernel line before the kill; got {got}")
    env["OPENBLAS_CORETYPE"] = "Prescott"
    got = lines_until_first_step(env)
    if not any(l.startswith("CPU: OpenBLAS") and ", kernel Prescott," in l for l in got):
        failures.append(f"OPENBLAS_CORETYPE=Prescott: no line naming the Prescott kernel; got {got}")
    flags = open("/proc/cpuinfo").read().split()
    better = "avx512f" in flags or "avx2" in flags
    warned = any(l.startswith("warning: OpenBLAS uses its generic 'Prescott' kernel") for l in got)
    if warned != better:
        failures.append(f"generic-kernel warning {'missing' if better else 'given'} on a CPU "
                        f"{'with' if better else 'without'} AVX2/AVX-512; got {got}")
    # The RESULT line against the step lines it summarises: 4 timed steps (an even count)
    # after 1 warm-up; the step lines print 0.1 ms, so each figure agrees within 0.05 ms.
    args = [a for a in ARGS if not a.startswith(("--bench_steps", "--bench_warmup"))]
    r = subprocess.run([BENCH] + args + ["--bench_steps=4", "--bench_warmup=1"], capture_output=True, text=True,
                       env=env, timeout=300)
    timed = [float(m) for m in re.findall(r"^step \d+/\d+: ([0-9.]+) ms$", r.stdout, re.M)]
    result = [json.loads(l[len("RESULT "):]) for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    if r.returncode != 0 or len(timed) != 4 or len(result) != 1:
        failures.append(f"--bench_steps=4: rc {r.returncode}, {len(timed)} timed step lines, {len(result)} RESULT "
                        f"lines; stdout {r.stdout!r}, stderr {r.stderr[-2000:]!r}")
    else:
        got = result[0]
        want = {"median_ms": statistics.median(timed), "min_ms": min(timed), "max_ms": max(timed)}
        for k, v in want.items():
            if not isinstance(got.get(k), (int, float)) or abs(got[k] - v) > 0.051:
                failures.append(f"RESULT {k} {got.get(k)} is not {v:.2f} +- 0.05 from the step lines {timed}")
        if got.get("steps") != 4:
            failures.append(f"RESULT steps {got.get('steps')}, expected 4 (the timed steps)")
    for f in failures:
        print("FAIL:", f)
    print("bench output:", "FAIL" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
