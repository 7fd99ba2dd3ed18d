#!/usr/bin/env python3
"""Static check of the compiled CUDA kernels: what a machine without a GPU can prove.

  python3 tools/perf/sass_check.py [--baseline=tools/perf/sass_baseline.json] [--update] FILE...

FILE: objects or static libraries with device code (build-cuda/liblns_cuda.a). For every
kernel and architecture it reads, with `cuobjdump -res-usage` and `cuobjdump -sass`,
registers, stack, local memory, static shared memory, and counts the 128-bit global
loads/stores (LDG/STG .128), the 4-byte and 2-byte global stores (STG, STG .U16), and
the local-memory spill traffic (LDL/STL). It prints a table and fails (exit 1) when:
  - any kernel spills or uses local memory (none is allowed);
  - a kernel built on the tensor-core wrapper (src/cuda/mma.cuh: the fused attention)
    holds no HMMA instruction, i.e. its matrix products fell back to plain FMAs, or
    has no 4-byte global store (its bf16 outputs would go out 2 bytes at a time);
  - a 16-byte vector variant (first template argument 8 for bf16, the kVec paths,
    or 4 for f32) has no 128-bit global load, or stores bf16 2 bytes at a time;
  - against the baseline: more registers, shared memory or stack, or fewer 128-bit
    loads/stores or 4-byte stores than recorded.
--update rewrites the baseline from FILE (after a deliberate change; review the diff).
Exit 2: bad arguments; 77: cuobjdump is not installed (tools/install_deps.sh installs
it from PyPI: nvidia-cuda-cuobjdump), so the check cannot run.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

SKIP = 77
# Dynamic shared memory is a launch argument, not in the binary: stated here, next to
# the check, for the kernels that take it (src/cuda/norm.cu).
DYNAMIC_SMEM = {"norm_backward_kernel": "4*C B (RMSNorm), 8*C (LayerNorm); opt-in above 48 KiB",
                "flash_fwd_kernel": "fwd_smem<D>() (flash_attention.cu); opt-in above 48 KiB",
                "flash_dq_kernel": "dq_smem<D>(); opt-in above 48 KiB",
                "flash_dkv_kernel": "dkv_smem<D>(); opt-in above 48 KiB"}
# Kernels whose products go through mma.sync: their SASS must hold tensor-core HMMA.
TENSOR_CORE_KERNELS = ("flash_fwd_kernel", "flash_dq_kernel", "flash_dkv_kernel")


def find_tool(name):
    hit = shutil.which(name)
    if hit:
        return hit
    cands = [os.path.join("/usr/local/cuda/bin", name)]
    try:
        import nvidia  # the PyPI wheels install under the `nvidia` namespace package
        for root in nvidia.__path__:
            cands += glob.glob(os.path.join(root, "*", "bin", name))
    except ImportError:
        pass
    for c in cands:
        if os.access(c, os.X_OK):
            return c
    return None


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def short_name(demangled):
    """'lns::cuda::(anonymous namespace)::norm_backward_kernel<8, false>(...)' ->
    'norm_backward_kernel<8, false>'."""
    s = demangled
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):  # the parameter list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and not s.startswith("(anonymous", i):
            cut = i
            break
    s = s[:cut]
    s = re.sub(r"\(anonymous namespace\)::", "", s)
    s = re.sub(r"^(void )?(lns::cuda::|lns::)", "", s)
    return s.replace("lns::cuda::", "")


def base_name(short):
    return short.split("<", 1)[0].split("::")[-1]


def is_vector_variant(short):
    """16-byte vector variants: first template argument 8 (bf16 kernels) or 4 (f32)."""
    return re.search(r"<[84]\b", short) is not None


RES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def read_kernels(cuobjdump, path):
    """{(mangled name, arch): stats} from one object or library."""
    kernels = {}
    res = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{path}: cuobjdump -res-usage failed: {res.stderr.strip()}")
    arch, fn = None, None
    for line in res.stdout.splitlines():
        m = re.match(r"\s*arch = (sm_\d+a?)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function (\S+):\s*$", line)
        if m:
            fn = m.group(1)
            continue
        m = RES.search(line)
        if m and fn and arch:
            reg, stack, shared, local = map(int, m.groups())
            kernels[(fn, arch)] = {"reg": reg, "stack": stack, "shared": shared, "local": local,
                                   "ldg128": 0, "stg128": 0, "stg32": 0, "stg16": 0, "spill": 0,
                                   "hmma": 0}
            fn = None
    sass = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True)
    if sass.returncode != 0:
        raise RuntimeError(f"{path}: cuobjdump -sass failed: {sass.stderr.strip()}")
    arch, cur = None, None
    for line in sass.stdout.splitlines():
        m = re.match(r"\s*code for (sm_\d+a?)", line)
        if m:
            arch = m.group(1)
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = kernels.get((m.group(1), arch))
            continue
        if cur is None or "/*" not in line:
            continue
        ins = line.split("*/", 1)[-1].split(";")[0].strip()
        op = ins.split()[0] if ins else ""
        if op.startswith("@"):  # predicated: the opcode is the second word
            op = ins.split()[1] if len(ins.split()) > 1 else ""
        if op.startswith("LDG") and ".128" in op:
            cur["ldg128"] += 1
        elif op.startswith("STG") and ".128" in op:
            cur["stg128"] += 1
        elif op.startswith("STG") and ".U16" in op:
            cur["stg16"] += 1
        elif op.startswith("STG") and not re.search(r"\.(64|128|U8|S8|S16)\b", op):
            cur["stg32"] += 1  # STG.E: 4 bytes, the default width
        if op.startswith("HMMA"):
            cur["hmma"] += 1
        if op.startswith("LDL") or op.startswith("STL"):
            cur["spill"] += 1
    return kernels


def collect(cuobjdump, paths):
    raw = {}
    for p in paths:
        raw.update(read_kernels(cuobjdump, p))
    names = demangle(sorted({fn for fn, _ in raw}))
    out = {}
    for (fn, arch), st in raw.items():
        out[f"{short_name(names[fn])}@{arch}"] = st
    return out


def check(kernels, baseline):
    """Failure messages, one line each."""
    fails = []
    for key, st in sorted(kernels.items()):
        name = key.split("@")[0]
        if st["spill"] or st["local"]:
            fails.append(f"{key}: spills ({st['spill']} LDL/STL, {st['local']} B local memory); none allowed")
        if base_name(name) in TENSOR_CORE_KERNELS and st.get("hmma", 0) == 0:
            fails.append(f"{key}: built on mma.sync but its SASS holds no tensor-core HMMA instruction")
        if base_name(name) in TENSOR_CORE_KERNELS and st.get("stg32", 0) == 0:
            fails.append(f"{key}: no 4-byte global store: the fused attention's bf16 outputs go out 2 bytes at a "
                         f"time ({st['stg16']} STG.U16)")
        if is_vector_variant(name):
            if st["ldg128"] == 0:
                fails.append(f"{key}: 16-byte vector variant without a 128-bit global load (LDG.128)")
            if st["stg16"]:
                fails.append(f"{key}: 16-byte vector variant stores bf16 2 bytes at a time "
                             f"({st['stg16']} STG.U16, {st['stg128']} STG.128)")
        base = baseline.get(key)
        if base is None:
            continue
        for field, worse in (("reg", 1), ("shared", 1), ("stack", 1), ("ldg128", -1), ("stg128", -1),
                             ("stg32", -1)):
            if field in base and (st.get(field, 0) - base[field]) * worse > 0:
                fails.append(f"{key}: {field} {base[field]} -> {st[field]} (baseline tools/perf/sass_baseline.json; "
                             f"--update after a deliberate change)")
    return fails


def table(kernels, baseline):
    print(f"{'kernel':58} {'arch':6} {'reg':>4} {'stack':>5} {'smem':>6} {'LDG128':>6} {'STG128':>6} "
          f"{'STG32':>5} {'STG16':>5} {'spill':>5}  dynamic smem")
    for key, st in sorted(kernels.items()):
        name, arch = key.split("@")
        mark = "" if key in baseline else "  (new)"
        print(f"{name[:58]:58} {arch:6} {st['reg']:4d} {st['stack']:5d} {st['shared']:6d} {st['ldg128']:6d} "
              f"{st['stg128']:6d} {st.get('stg32', 0):5d} {st['stg16']:5d} {st['spill'] + st['local']:5d}  "
              f"{DYNAMIC_SMEM.get(base_name(name), '-')}{mark}")


def baseline_text(kernels):
    """One kernel a line, sorted: diffs of the baseline read as the change they are."""
    rows = [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(kernels.items())]
    return ('{"note": "written by tools/perf/sass_check.py --update", "kernels": {\n' + ",\n".join(rows)
            + "\n}}\n")


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    baseline_path, update, paths = os.path.join(here, "sass_baseline.json"), False, []
    for a in argv:
        if a.startswith("--baseline="):
            baseline_path = a.split("=", 1)[1]
        elif a == "--update":
            update = True
        elif a == "--no-baseline":
            baseline_path = None
        elif a.startswith("-"):
            print(f"sass_check: unknown flag '{a}' (see --help in the source)", file=sys.stderr)
            return 2
        else:
            paths.append(a)
    if not paths:
        print("sass_check: expected object or library files with device code", file=sys.stderr)
        return 2
    for p in paths:
        if not os.path.isfile(p):
            print(f"sass_check: '{p}': no such file", file=sys.stderr)
            return 2
    cuobjdump = find_tool("cuobjdump")
    if not cuobjdump:
        print("sass_check: cuobjdump not found (pip install nvidia-cuda-cuobjdump, or "
              "bash tools/install_deps.sh): SASS not checked")
        return SKIP
    try:
        kernels = collect(cuobjdump, paths)
    except RuntimeError as e:
        print(f"sass_check: {e}", file=sys.stderr)
        return 2
    if not kernels:
        print(f"sass_check: no kernels with device code in {' '.join(paths)}", file=sys.stderr)
        return 2
    baseline = {}
    if baseline_path and os.path.exists(baseline_path) and not update:
        try:
            with open(baseline_path, encoding="utf-8") as f:
                baseline = json.load(f)["kernels"]
        except (OSError, ValueError, KeyError) as e:
            print(f"sass_check: baseline '{baseline_path}' unreadable: {e}", file=sys.stderr)
            return 2
    table(kernels, baseline)
    fails = check(kernels, baseline)
    if update:
        if not baseline_path:
            print("sass_check: --update needs a baseline path", file=sys.stderr)
            return 2
        with open(baseline_path, "w", encoding="utf-8") as f:
            f.write(baseline_text(kernels))
        print(f"sass_check: wrote {baseline_path} ({len(kernels)} kernels)")
    for msg in fails:
        print(f"FAIL {msg}")
    print(f"sass_check: {len(kernels)} kernels, {len(fails)} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
