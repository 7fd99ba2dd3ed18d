#!/usr/bin/env python3
"""tools/perf/sass_check.py's rules on hand-made kernel tables (no cuobjdump needed):
each rule fires on the input that breaks it and stays quiet on a clean one."""
import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "perf"))

from sass_check import check, short_name  # noqa: E402

CLEAN = {"reg": 32, "stack": 0, "shared": 1152, "local": 0, "ldg128": 7, "stg128": 2, "stg32": 1, "stg16": 0,
         "spill": 0}


def one(key="norm_backward_kernel<8, false>@sm_90", **kw):
    return {key: dict(CLEAN, **kw)}


class Rules(unittest.TestCase):
    def test_clean(self):
        self.assertEqual(check(one(), one()), [])

    def test_spill(self):
        (msg,) = check(one(spill=4), {})
        self.assertIn("spills", msg)

    def test_vector_variant_stores(self):
        (msg,) = check(one(stg16=16, stg128=0), {})
        self.assertIn("2 bytes at a time", msg)
        # the scalar variant may store 2 bytes: that is its job
        self.assertEqual(check(one("norm_backward_kernel<1, false>@sm_90", stg16=2, ldg128=0, stg128=0), {}), [])

    def test_vector_variant_loads(self):
        (msg,) = check(one(ldg128=0), {})
        self.assertIn("LDG.128", msg)

    def test_baseline_regressions(self):
        base = one()
        for field, value in (("reg", 40), ("shared", 2048), ("stack", 16), ("ldg128", 6), ("stg128", 1),
                             ("stg32", 0)):
            fails = check(one(**{field: value}), base)
            self.assertEqual(len(fails), 1, field)
            self.assertIn(field, fails[0])
        # improvements and new kernels are not failures
        self.assertEqual(check(one(reg=30, stg128=3), base), [])
        self.assertEqual(check(one("new_kernel<8>@sm_90"), base), [])

    def test_tensor_core_kernels_hold_hmma(self):
        key = "flash_fwd_kernel<64>@sm_90"
        (msg,) = check(one(key, hmma=0), {})
        self.assertIn("HMMA", msg)
        self.assertEqual(check(one(key, hmma=32), {}), [])
        # other kernels need none
        self.assertEqual(check(one(hmma=0), {}), [])

    def test_fused_attention_has_a_4_byte_store_path(self):
        key = "flash_dq_kernel<64>@sm_90"
        (msg,) = check(one(key, hmma=96, stg32=0, stg16=32), {})
        self.assertIn("2 bytes at a time", msg)
        self.assertEqual(check(one(key, hmma=96, stg32=16, stg16=32), {}), [])
        self.assertEqual(check(one(stg32=0), {}), [])  # other kernels may have none

    def test_short_name(self):
        self.assertEqual(short_name("void lns::cuda::(anonymous namespace)::norm_backward_kernel<8, false>"
                                    "(__nv_bfloat16*, float*, int)"), "norm_backward_kernel<8, false>")


if __name__ == "__main__":
    unittest.main()
