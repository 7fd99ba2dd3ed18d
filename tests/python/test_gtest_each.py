#!/usr/bin/env python3
"""tools/device/gtest_each.sh: each test in a process of its own, so that one that
aborts (as every FP8 test did on an H200 on 2026-11-28, hiding the rest) is reported
and the tests after it still run; each test's verdict on a line of its own (the record
reads them), a skipped test not counted as passed, and the tests in the order of the
filter's patterns (a call cut off at its limit has run the ones named first). A stand-in
gtest program lists four tests, the second of which aborts and the fourth skips."""
import os
import stat
import subprocess
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "tools", "device", "gtest_each.sh")
STANDIN = r"""#!/bin/sh
filter=""
for a in "$@"; do case $a in --gtest_filter=*) filter=${a#--gtest_filter=} ;; esac; done
for a in "$@"; do
  if [ "$a" = --gtest_list_tests ]; then
    printf 'Suite.\n  First\n  Aborts\nSchemes/Param.\n  Case/lns  # GetParam() = lns\nOther.\n  Skips\n'
    exit 0
  fi
done
echo "ran $filter" >> "$(dirname "$0")/ran.txt"
[ "$filter" = Suite.Aborts ] && kill -ABRT $$
[ "$filter" = Other.Skips ] && echo "[  SKIPPED ] Other.Skips (0 ms)"
exit 0
"""


def run_each(filter_):
    with tempfile.TemporaryDirectory() as tmp:
        prog = os.path.join(tmp, "fake_tests")
        with open(prog, "w") as f:
            f.write(STANDIN)
        os.chmod(prog, os.stat(prog).st_mode | stat.S_IXUSR)
        r = subprocess.run(["bash", SCRIPT, prog, filter_], capture_output=True, text=True, timeout=60)
        with open(os.path.join(tmp, "ran.txt")) as f:
            ran = f.read().split("\n")[:-1]
    return r, ran


class GtestEach(unittest.TestCase):
    def test_an_abort_is_reported_and_the_rest_run(self):
        r, ran = run_each("*")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(ran, ["ran Suite.First", "ran Suite.Aborts", "ran Schemes/Param.Case/lns", "ran Other.Skips"])
        verdicts = [l for l in r.stdout.splitlines() if l.startswith("gtest_each: ") and " of " not in l]
        self.assertEqual(verdicts, ["gtest_each: passed Suite.First", "gtest_each: FAILED Suite.Aborts (rc 134)",
                                    "gtest_each: passed Schemes/Param.Case/lns", "gtest_each: skipped Other.Skips"])
        self.assertIn("gtest_each: 2 of 4 tests passed; skipped: Other.Skips; failed: Suite.Aborts", r.stdout)

    def test_the_filters_patterns_set_the_order(self):
        r, ran = run_each("Other.*:Schemes/*:Suite.First")
        self.assertEqual(ran, ["ran Other.Skips", "ran Schemes/Param.Case/lns", "ran Suite.First",
                               "ran Suite.Aborts"], r.stdout)  # the stand-in lists all: the unmatched last
        r, ran = run_each("-Nothing")  # no positive pattern: gtest's own order
        self.assertEqual(ran[0], "ran Suite.First", r.stdout)


if __name__ == "__main__":
    unittest.main()
