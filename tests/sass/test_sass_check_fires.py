#!/usr/bin/env python3
"""tools/perf/sass_check.py fires on deliberately broken kernels (tests/sass/broken_kernels.cu):
it must exit 1 and name the spill and the 2-byte stores of the vector path.

usage: test_sass_check_fires.py LIBRARY   (the lns_broken_kernels target)
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(ROOT, "tools", "perf", "sass_check.py")


def main(lib):
    r = subprocess.run([sys.executable, CHECK, "--no-baseline", lib], capture_output=True, text=True)
    out = r.stdout + r.stderr
    print(out)
    if r.returncode == 77:
        return 77  # no cuobjdump: skipped, as the check itself
    fails = [line for line in out.splitlines() if line.startswith("FAIL ")]
    want = [("spilling_kernel", "spills"), ("broken_vector_kernel<8>", "2 bytes at a time")]
    ok = r.returncode == 1
    for kernel, what in want:
        for arch in ("sm_80", "sm_90"):
            if not any(f"{kernel}@{arch}" in f and what in f for f in fails):
                print(f"expected a failure for {kernel}@{arch}: {what}")
                ok = False
    if r.returncode != 1:
        print(f"expected exit 1, got {r.returncode}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
