#!/usr/bin/env python3
"""The test settings a build gives ctest, read back from the build directory:

- every GoogleTest discovery waits long enough to list a CUDA-linked binary's tests on
  a cold disk (its default, 5 s, failed the CUDA phase of a fresh machine's first run);
- gpu_tiny_run's step count comes from the build kind, not from the script that runs
  ctest: 20 steps in an emulation build (160 take about 40 minutes there), the GPU's
  160 elsewhere.

Usage: test_build_settings.py BUILD_DIR
"""
import glob
import json
import os
import re
import subprocess
import sys

MIN_DISCOVERY_S = 60


def cache_value(build, name):
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            m = re.match(re.escape(name) + r":\w+=(.*)$", line.strip())
            if m:
                return m.group(1)
    return ""


def main():
    build = os.path.abspath(sys.argv[1])
    failures = []
    includes = glob.glob(os.path.join(build, "tests", "*", "*_include.cmake"))
    if not includes:
        failures.append(f"no GoogleTest discovery files under {build}/tests/*/")
    for path in sorted(includes):
        m = re.search(r"TEST_DISCOVERY_TIMEOUT \[==\[(\d+)\]==\]", open(path).read())
        timeout = int(m.group(1)) if m else 5
        if timeout < MIN_DISCOVERY_S:
            failures.append(f"{os.path.basename(path)}: discovery time-out {timeout} s, want >= {MIN_DISCOVERY_S} s")
    out = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"], capture_output=True, text=True,
                         check=True).stdout
    tests = {t["name"]: t for t in json.loads(out)["tests"]}
    if "gpu_tiny_run" not in tests:
        failures.append("no gpu_tiny_run test in this build")
    else:
        env = []
        for p in tests["gpu_tiny_run"].get("properties", []):
            if p["name"] == "ENVIRONMENT":
                env = p["value"]
        steps = [e.split("=", 1)[1] for e in env if e.startswith("LNS_TINY_RUN_STEPS=")]
        emulated = cache_value(build, "LNS_CUDA_SIM").upper() in ("ON", "1", "TRUE", "YES")
        want = ["20"] if emulated else []
        if steps != want:
            failures.append(f"gpu_tiny_run: LNS_TINY_RUN_STEPS {steps or 'unset'} in a "
                            f"{'emulation' if emulated else 'non-emulation'} build, want {want or 'unset (160)'}")
    for f in failures:
        print("FAIL:", f)
    print(f"{len(includes)} discovery files, gpu_tiny_run checked: {'FAIL' if failures else 'ok'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
