#!/usr/bin/env python3
"""tools/device/run_gpu.sh's record survives a call cut off at its limit, names the commit
the kit's programs were built from, and keeps the compiled peer at seq 4096 (issue 44).

Stand-in programs (shell scripts in the kit or BIN_DIR, and a python3 in front of the real
one for the PyTorch peer) print what the real ones print. A call is cut off by coreutils'
`timeout` itself: the test sends the timeout process SIGALRM, its own timer's signal, once
the step that hangs has begun, so the cut comes at a known step on a loaded machine too;
timeout then signals the whole call as at the end of its time.
"""
import glob
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "tools", "device", "run_gpu.sh")
PACK = os.path.join(ROOT, "tools", "device", "pack.sh")

BENCH_STEP = """#!/bin/sh
case "$*" in
  *--fp8=delayed*) echo $$ > "$LNS_TEST_MARK"; exec sleep 120 ;;
  *--attention=cudnn*) echo 'RESULT {"impl": "lns", "device": "cuda", "median_ms": 1800.0, "min_ms": 1790.0, "max_ms": 1830.0, "steps": 10}' ;;
  *) echo 'RESULT {"impl": "lns", "device": "cuda", "median_ms": 2000.0, "min_ms": 1995.0, "max_ms": 2010.0, "steps": 10}' ;;
esac
"""
# Writes its --json after each figure, as lns_bench_kernels does; LNS_TEST_HANG_KERNELS:
# hangs after the first.
BENCH_KERNELS = """#!/bin/sh
for a in "$@"; do case $a in --json=*) out=${a#--json=} ;; esac; done
case "$*" in *--sections=step_gemm*) name=gemm_fwd_q_8192x768x768 ;; *) name=copy_1024MiB ;; esac
printf '{"results": [{"name": "%s", "metric": "GB/s", "value": 100.0}]}\\n' "$name" > "$out"
if [ -n "$LNS_TEST_HANG_KERNELS" ]; then echo $$ > "$LNS_TEST_MARK"; exec sleep 120; fi
printf '{"results": [{"name": "%s", "metric": "GB/s", "value": 100.0}, {"name": "%s_2", "metric": "GB/s", "value": 50.0}]}\\n' "$name" "$name" > "$out"
"""
# The PyTorch peer: sleeps LNS_TEST_PEER_SLEEP seconds (its compile), then its RESULT
PYTHON = """#!/bin/sh
if [ "$1" = tools/bench/bench_step_torch.py ]; then
  sleep "${LNS_TEST_PEER_SLEEP:-0}"
  echo 'RESULT {"impl": "torch", "median_ms": 2900.0, "min_ms": 2890.0, "max_ms": 2950.0, "steps": 10}'
  exit 0
fi
exec "%s" "$@"
"""


def write_exe(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def stand_ins(folder):
    write_exe(os.path.join(folder, "lns_bench_step"), BENCH_STEP)
    write_exe(os.path.join(folder, "lns_bench_kernels"), BENCH_KERNELS)
    write_exe(os.path.join(folder, "lns_train"), "#!/bin/sh\nexit 0\n")


def call_env(tmp, **extra):
    env = dict(os.environ, STAGES="bench", TORCH="0", KERNELS_TORCH="0", OUT=os.path.join(tmp, "out"),
               LNS_DEBS=os.path.join(tmp, "no-debs"), LNS_DEPS_PREFIX=os.path.join(tmp, "deps"),
               LNS_GPU_DEPS=os.path.join(tmp, "no-kit"), LNS_TEST_MARK=os.path.join(tmp, "hanging"),
               PYTHONDONTWRITEBYTECODE="1")
    for k in ("CONFIGS", "VARIANTS", "PRESET", "BIN_DIR", "LNS_COMMIT", "STEP_TIMEOUT", "LNS_STEPS", "TORCH_STEPS"):
        env.pop(k, None)
    env.update(extra)
    return env


def the_record(out):
    """The run's record in OUT: its one JSON that is not env.json or a kernels file."""
    paths = [p for p in glob.glob(os.path.join(out, "*.json"))
             if not os.path.basename(p).startswith(("env", "kernels"))]
    assert len(paths) == 1, paths
    with open(paths[0]) as f:
        return json.load(f)


def read(path):
    with open(path) as f:
        return f.read()


def cut_off(env, signal_name, limit_s=120):
    """Runs run_gpu.sh under `timeout -s SIGNAL`, and makes timeout cut it off once a
    stand-in has begun to hang (its mark file, its pid); returns timeout's exit status
    and whether the hanging stand-in outlived the call."""
    mark = env["LNS_TEST_MARK"]
    p = subprocess.Popen(["timeout", "-s", signal_name, str(limit_s), "bash", SCRIPT], env=env, cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time() + limit_s
    while not (os.path.exists(mark) and read(mark).strip()) and p.poll() is None and time.time() < end:
        time.sleep(0.05)
    assert os.path.exists(mark), "the hanging stand-in never began"
    pid = int(read(mark))
    p.send_signal(signal.SIGALRM)  # timeout's own timer: "time is up"
    rc = p.wait(timeout=60)
    try:  # a SIGKILL reaches no step (its timeout leads its own process group): end it here
        os.kill(pid, signal.SIGKILL)
        outlived = True
    except ProcessLookupError:
        outlived = False
    return rc, outlived


class CutOff(unittest.TestCase):
    def test_a_killed_call_keeps_the_figures_that_finished(self):
        # SIGKILL (nothing runs after it): the record of the last finished step stays.
        with tempfile.TemporaryDirectory() as tmp:
            bin_dir = os.path.join(tmp, "bin")
            stand_ins(bin_dir)
            env = call_env(tmp, BIN_DIR=bin_dir, CONFIGS="1b_lns", VARIANTS="1b_lns=lns,cudnn,fp8")
            rc, _ = cut_off(env, "KILL")
            self.assertIn(rc, (137, -9))
            rec = the_record(env["OUT"])
            with open(os.path.join(env["OUT"], "run.log")) as f:
                log = f.read()
            leftovers = glob.glob(os.path.join(env["OUT"], "*.tmp"))
        self.assertIn("### step step_fp8_1b_lns:", log)  # it was running when cut off
        self.assertEqual(sorted(rec["configs"]), ["1b_lns"])
        self.assertEqual(sorted(rec["configs"]["1b_lns"]), ["lns", "lns_cudnn"])
        self.assertEqual(rec["configs"]["1b_lns"]["lns_cudnn"],
                         {"step_ms": 1800.0, "min_ms": 1790.0, "max_ms": 1830.0, "steps": 10})
        self.assertEqual(sorted(rec["status"]["1b_lns"]), ["lns", "lns_cudnn"])
        self.assertEqual(sorted(rec["kernels"]), ["copy_1024MiB", "copy_1024MiB_2", "gemm_fwd_q_8192x768x768",
                                                  "gemm_fwd_q_8192x768x768_2"])
        self.assertEqual(leftovers, [])

    def test_a_terminated_call_records_the_figures_so_far(self):
        # SIGTERM (timeout's default): the record is rewritten once more, with the kernel
        # bench's figures written before it hung, and the step that did not finish says so.
        with tempfile.TemporaryDirectory() as tmp:
            bin_dir = os.path.join(tmp, "bin")
            stand_ins(bin_dir)
            env = call_env(tmp, BIN_DIR=bin_dir, CONFIGS="1b_lns", VARIANTS="1b_lns=lns",
                           LNS_TEST_HANG_KERNELS="1")
            rc, outlived = cut_off(env, "TERM")
            self.assertEqual(rc, 124)
            self.assertFalse(outlived, "the running step outlived the call")
            rec = the_record(env["OUT"])
            with open(os.path.join(env["OUT"], "run.log")) as f:
                log = f.read()
        self.assertIn("stopped by a signal", log)
        self.assertEqual(rec["kernels"], {"copy_1024MiB": {"value": 100.0, "metric": "GB/s"}})
        self.assertEqual(rec["steps"], {"kernels": "did not finish"})
        self.assertEqual(rec["configs"], {})


def git(*args, cwd):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


class KitCommit(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lns_kit_")
        self.src = os.path.join(self.tmp, "src")  # the tree the programs were built from
        os.makedirs(self.src)
        git("init", "-q", cwd=self.src)
        with open(os.path.join(self.src, "a.txt"), "w") as f:
            f.write("one\n")
        git("add", "a.txt", cwd=self.src)
        git("commit", "-q", "-m", "one", cwd=self.src)
        self.commit = git("rev-parse", "--short", "HEAD", cwd=self.src)
        self.build = os.path.join(self.tmp, "build")
        stand_ins(self.build)
        write_exe(os.path.join(self.build, "lns_tests"), "#!/bin/sh\n")  # CPU-only: stays here
        with open(os.path.join(self.build, "CMakeCache.txt"), "w") as f:
            f.write(f"CMAKE_HOME_DIRECTORY:INTERNAL={self.src}\n")
        self.kit = os.path.join(self.tmp, "kit")

    def tearDown(self):
        subprocess.run(["rm", "-rf", self.tmp])

    def pack(self):
        r = subprocess.run(["bash", PACK, "--binaries", self.build, "--no-debs"], capture_output=True, text=True,
                           env=dict(os.environ, LNS_GPU_DEPS=self.kit), timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def run_call(self, **extra):
        env = call_env(self.tmp, LNS_GPU_DEPS=self.kit, BUILD_DIR=os.path.join(self.tmp, "no-build"),
                       CONFIGS="1b_lns", VARIANTS="1b_lns=lns", KERNELS="0", **extra)
        subprocess.run(["bash", SCRIPT], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=120)
        with open(os.path.join(env["OUT"], "env.json")) as f:
            return json.load(f)["git"], the_record(env["OUT"])

    def test_the_record_names_the_kits_commit_not_the_travelled_trees(self):
        out = self.pack()
        self.assertIn(f"packed 3 programs of commit {self.commit} from {self.build}", out)
        with tarfile.open(os.path.join(self.kit, "bin.tar.xz")) as t:
            self.assertEqual(sorted(t.getnames()), ["bin", "bin/COMMIT", "bin/lns_bench_kernels", "bin/lns_bench_step",
                                                    "bin/lns_train"])
            self.assertEqual(t.extractfile("bin/COMMIT").read().decode().strip(), self.commit)
        tree = git("rev-parse", "--short", "HEAD", cwd=ROOT)
        self.assertNotEqual(tree, self.commit)
        got, rec = self.run_call()  # run from this tree, at another commit
        self.assertEqual(got, self.commit)
        self.assertEqual(rec["commit"], self.commit)
        self.assertEqual(rec["configs"]["1b_lns"]["lns"]["step_ms"], 2000.0)  # the kit's programs ran
        self.assertEqual(self.run_call(LNS_COMMIT="feed123")[0], "feed123")  # the override still wins

    def test_a_dirty_source_and_an_unstamped_kit_say_so(self):
        with open(os.path.join(self.src, "a.txt"), "w") as f:
            f.write("two\n")
        self.pack()
        self.assertEqual(self.run_call()[0], self.commit + "+dirty")
        # a kit packed before the stamp: unknown, never the tree's commit
        os.remove(os.path.join(self.kit, "bin.tar.xz"))
        subprocess.run(["rm", "-rf", os.path.join(self.kit, "bin")], check=True)
        with tarfile.open(os.path.join(self.kit, "bin.tar.xz"), "w:xz") as t:
            t.add(self.build, arcname="bin")
        got, rec = self.run_call()
        self.assertTrue(got.startswith("unknown (the kit's programs carry no bin/COMMIT"), got)
        self.assertEqual(rec["commit"], got)

    def test_pack_refuses_a_build_without_its_source(self):
        os.remove(os.path.join(self.build, "CMakeCache.txt"))
        r = subprocess.run(["bash", PACK, "--binaries", self.build, "--no-debs"], capture_output=True, text=True,
                           env=dict(os.environ, LNS_GPU_DEPS=self.kit), timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.strip(), f"pack.sh: {self.build}/CMakeCache.txt does not name its source folder "
                                           "(CMAKE_HOME_DIRECTORY)")


class Seq4kPeer(unittest.TestCase):
    def run_call(self, tmp, variants, **extra):
        bin_dir = os.path.join(tmp, "bin")
        stand_ins(bin_dir)
        py = os.path.join(tmp, "py")
        write_exe(os.path.join(py, "python3"), PYTHON % sys.executable)
        env = call_env(tmp, **dict(dict(BIN_DIR=bin_dir, CONFIGS="1b_lns_seq4k", KERNELS="0", TORCH="1",
                                        PATH=py + os.pathsep + os.environ["PATH"], STEP_TIMEOUT="1",
                                        LNS_TEST_PEER_SLEEP="2"), **extra))
        if variants is not None:
            env["VARIANTS"] = variants
        subprocess.run(["bash", SCRIPT], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=120)
        return the_record(env["OUT"])

    def test_the_compiled_peer_at_seq_4096_has_its_own_limit(self):
        with tempfile.TemporaryDirectory() as tmp:
            # its compile (2 s here) outruns STEP_TIMEOUT (1 s) but not its own limit
            rec = self.run_call(tmp, "1b_lns_seq4k=cudnn,torch_padded",
                                TIMEOUT_step_torch_padded_1b_lns_seq4k="30")
        c = rec["configs"]["1b_lns_seq4k"]
        self.assertEqual(c["torch_compile_padded"], {"step_ms": 2900.0, "min_ms": 2890.0, "max_ms": 2950.0, "steps": 10})
        self.assertEqual(c["lns_cudnn"]["step_ms"], 1800.0)
        self.assertTrue(rec["status"]["1b_lns_seq4k"]["torch_compile_padded"].startswith("ok, "))
        with tempfile.TemporaryDirectory() as tmp:  # without it, the common limit ends it
            rec = self.run_call(tmp, "1b_lns_seq4k=cudnn,torch_padded")
        self.assertNotIn("torch_compile_padded", rec["configs"]["1b_lns_seq4k"])
        self.assertTrue(rec["status"]["1b_lns_seq4k"]["torch_compile_padded"].startswith("FAILED (rc 124)"))

    def test_seq_4096_compares_with_the_padded_peer_unless_told(self):
        with tempfile.TemporaryDirectory() as tmp:
            rec = self.run_call(tmp, None, GRAPHS="0", FP8="0", CUDNN="0", LNS_TEST_PEER_SLEEP="0")
        self.assertEqual(sorted(rec["status"]["1b_lns_seq4k"]), ["lns", "torch_compile_padded"])
        with tempfile.TemporaryDirectory() as tmp:
            rec = self.run_call(tmp, "1b_lns_seq4k=torch", LNS_TEST_PEER_SLEEP="0")
        self.assertEqual(sorted(rec["status"]["1b_lns_seq4k"]), ["torch_compile"])


class StepCount(unittest.TestCase):
    def test_fewer_than_ten_timed_steps_is_one_line(self):
        for var in ("LNS_STEPS", "TORCH_STEPS"):
            r = subprocess.run(["bash", SCRIPT], env=dict(os.environ, **{var: "5"}), capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 2)
            self.assertEqual(r.stderr.strip(), f"run_gpu.sh: {var}=5: expected a whole number >= 10 (a step figure is "
                                               "the median of at least 10 timed steps)")


if __name__ == "__main__":
    unittest.main()
