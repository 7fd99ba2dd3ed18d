#!/usr/bin/env python3
"""tools/device/gtest_each.sh: each test in a process of its own, so that one that
aborts (as every FP8 test did on an H200 on 2026-11-28, hiding the rest) is reported
and the tests after it still run. A stand-in gtest program lists three tests, the
second of which aborts."""
import os
import stat
import subprocess
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SCRIPT = os.path.join(ROOT, "tools", "device", "gtest_each.sh")
STANDIN = r"""#!/bin/sh
filter=""
for a in "$@"; do case $a in --gtest_filter=*) filter=${a#--gtest_filter=} ;; esac; done
for a in "$@"; do
  if [ "$a" = --gtest_list_tests ]; then
    printf 'Suite.\n  First\n  Aborts\nSchemes/Param.\n  Case/lns  # GetParam() = lns\n'
    exit 0
  fi
done
echo "ran $filter" >> "$(dirname "$0")/ran.txt"
[ "$filter" = Suite.Aborts ] && kill -ABRT $$
exit 0
"""


class GtestEach(unittest.TestCase):
    def test_an_abort_is_reported_and_the_rest_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            prog = os.path.join(tmp, "fake_tests")
            with open(prog, "w") as f:
                f.write(STANDIN)
            os.chmod(prog, os.stat(prog).st_mode | stat.S_IXUSR)
            r = subprocess.run(["bash", SCRIPT, prog, "*"], capture_output=True, text=True, timeout=60)
            with open(os.path.join(tmp, "ran.txt")) as f:
                ran = f.read().split("\n")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(ran[:3], ["ran Suite.First", "ran Suite.Aborts", "ran Schemes/Param.Case/lns"])
        self.assertIn("gtest_each: 2 of 3 tests passed; failed: Suite.Aborts", r.stdout)


if __name__ == "__main__":
    unittest.main()
