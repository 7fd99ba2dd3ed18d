#!/usr/bin/env python3
"""lns_bench_kernels runs every figure under the emulator (tiny shapes, one call each: a
check that it runs, not a timing), its operands are random and shaped like a trained
model's, not constants (a constant operand toggles fewer bits and runs faster than real
data), and its --json holds every figure it has printed, so a run killed at its limit
keeps what finished.

    test_bench_kernels_operands.py LNS_BENCH_KERNELS   (an emulation build's: tiny shapes)

--operand_stats prints each operand's mean and standard deviation as the device holds it
(after the bf16 cast). A weight must have std 0.02 and mean 0, an activation, attention
input or gradient unit std and mean 0, a norm gain mean 1: each within 6 standard errors
of its sample (n values: the mean's is std / sqrt(n), the std's std / sqrt(2 n)), plus
bf16's rounding (2^-8 relative).
"""
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
ARGS = ["--flagfile=" + os.path.join(ROOT, "configs", "tiny_lns.flags"), "--tokens=128", "--norm_shapes=128x256",
        "--copy_mib=1", "--iters=1", "--warmup=0", "--long_seq=0"]
OPERAND = re.compile(r"^operand (.+) \[(\d+)\]: mean (\S+) std (\S+)$")
FIGURE = re.compile(r"^(\S+)\s+[0-9.]+ (?:TFLOP/s|GB/s)\s")


def expected(what):
    """(mean, std) an operand must have, by what it stands for."""
    if what.endswith(" w"):
        return 0.0, 0.02
    if what.endswith(" gain"):
        return 1.0, 0.02
    return 0.0, 1.0


# A figure of each section (the FP8 GEMMs and casts, cuDNN's attention stand-in too)
FIGURES = ("copy_1MiB", "rmsnorm_bwd_128x256", "gemm_qkvo_128x128x128", "gemm_wgrad_gate_up_fused_768x128x1024",
           "gemm_fp8bw_qkvo_128x128x128", "fp8_tiles_cols_128x256", "attention_cudnn_bwd_8x128x4x2x32",
           "attention_materialized_bwd_8x128x4x2x32")


def check_operands(bench):
    failures = []
    r = subprocess.run([bench] + ARGS + ["--operand_stats"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return [f"rc {r.returncode}: {r.stderr[-2000:]}"]
    printed = {m.group(1) for m in (FIGURE.match(l) for l in r.stdout.splitlines()) if m}
    failures += [f"no figure {f}; got {sorted(printed)}" for f in FIGURES if f not in printed]
    seen = {}
    for line in r.stdout.splitlines():
        m = OPERAND.match(line)
        if not m:
            continue
        what, n, mean, std = m.group(1), int(m.group(2)), float(m.group(3)), float(m.group(4))
        want_mean, want_std = expected(what)
        seen[what] = seen.get(what, 0) + 1
        tol_mean = 6 * want_std / math.sqrt(n) + abs(want_mean) * 2 ** -8
        tol_std = 6 * want_std / math.sqrt(2 * n) + want_std * 2 ** -8
        if abs(mean - want_mean) > tol_mean or abs(std - want_std) > tol_std:
            failures.append(f"{line}: expected mean {want_mean} +- {tol_mean:.2g}, std {want_std} +- {tol_std:.2g}")
    for what in ("norm res", "norm gain", "gemm x", "gemm w", "step_gemm x", "step_gemm w", "step_gemm dy",
                 "fp8_cast x", "attention q", "attention k", "attention v", "attention dout"):
        if what not in seen:
            failures.append(f"no operand line for '{what}'; got {sorted(seen)}")
    print(f"operands: {sum(seen.values())} checked")
    return failures


def check_json_survives_a_kill(bench):
    """Killed (SIGKILL) once its third figure is printed: --json parses and holds every
    figure printed, and at most one more (written, not yet printed)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernels.json")
        p = subprocess.Popen([bench] + ARGS + ["--sections=step_gemm", f"--json={path}"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
        printed, buf = [], b""
        try:
            while len(printed) < 3:
                ready, _, _ = select.select([p.stdout], [], [], 60)
                chunk = os.read(p.stdout.fileno(), 65536) if ready else b""
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                printed += [m.group(1) for m in (FIGURE.match(l.decode()) for l in lines) if m]
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
        if len(printed) < 3:
            return [f"only {len(printed)} figures printed before the run ended"]
        try:
            with open(path) as f:
                names = [r["name"] for r in json.load(f)["results"]]
        except (OSError, ValueError, KeyError) as e:
            return [f"--json after the kill is not a figures file ({e.__class__.__name__}: {e})"]
        if names[:len(printed)] != printed or len(names) > len(printed) + 1:
            return [f"--json after the kill holds {names}; printed before it: {printed}"]
        print(f"killed after {len(printed)} figures: --json holds {len(names)}")
    return []


def main():
    bench = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build-sim", "lns_bench_kernels")
    failures = check_operands(bench) + check_json_survives_a_kill(bench)
    for f in failures:
        print("FAIL:", f)
    print("bench_kernels operands:", "FAIL" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
