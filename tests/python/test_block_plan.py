#!/usr/bin/env python3
"""lns_train --print_block_plan and the perf models that read it (tools/perf/block_plan.py).

1. What lns_train prints is the schemes of docs/model.md's table, checked against that
   table's own arithmetic (1/sqrt(l), (2L)^(1/4), Mix-LN's post layers, the norms a
   block owns), and bad flags get lns_train's one-line error.
2. tools/perf/block_plans.json, the plans the models read for the models of configs/
   where no lns_train is, equals what lns_train prints now, and has every config's plan.
3. The models count norms and residual scales from the plan, not from a scheme's name: a
   plan with one more norm, or a residual scale, moves their figures by exactly that
   (a deliberately altered plan), and their norm counts equal the table's for every scheme
   they model. What they cannot model (routed blocks, learned branch scales) is refused
   with a line naming --norm_scheme; a plan neither committed nor askable names LNS_TRAIN_BIN.
"""
import copy
import json
import math
import os
import subprocess
import sys
import unittest
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "perf"))

import block_plan  # noqa: E402
from flags import read_flagfile  # noqa: E402
from model_shape import ModelShape, shape_from_flags  # noqa: E402
from step_model import PRESENT, StepModel  # noqa: E402
from devices import device  # noqa: E402

TRAIN = os.environ.get("LNS_TRAIN_BIN")
NEEDS_TRAIN = unittest.skipUnless(TRAIN, "LNS_TRAIN_BIN not set (ctest sets it)")


def printed(*flags):
    r = subprocess.run([TRAIN, "--print_block_plan", *flags], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def shape(scheme, L, post_layers=0, norm_type="rmsnorm"):
    return ModelShape(V=64, C=32, L=L, Hq=4, Hkv=2, F=96, T=16, B=2, global_batch=4, scheme=scheme,
                      norm_type=norm_type, post_layers=post_layers)


class PrintedPlan(unittest.TestCase):
    @NEEDS_TRAIN
    def test_the_schemes_of_the_table(self):
        lns = printed("--norm_scheme=lns", "--num_layers=5")
        self.assertEqual((lns["norm_scheme"], lns["num_layers"], len(lns["layers"])), ("lns", 5, 5))
        for g, l in enumerate(lns["layers"]):
            self.assertEqual((l["layer"], l["depth"], l["scheme"]), (g, g, "lns"))
            self.assertEqual(l["norms"], ["input_layernorm", "post_attention_layernorm"])
            for sub, norm in (("attn", "input_layernorm"), ("mlp", "post_attention_layernorm")):
                p = l[sub]
                self.assertEqual((p["pre_norm"], p["out_norm"], p["add_norm"]), (norm, None, None))
                self.assertAlmostEqual(p["pre_scale"], 1 / math.sqrt(g + 1), delta=1e-7)  # f32 of 1/sqrt(l)
                self.assertEqual((p["residual_alpha"], p["learned_branch_scale"]), (1.0, False))
            self.assertIsNone(l["route"])
        mix = printed("--norm_scheme=mix", "--num_layers=5", "--post_layers=2")
        self.assertEqual([l["scheme"] for l in mix["layers"]], ["post", "post", "pre", "pre", "pre"])
        self.assertEqual(mix["layers"][1]["norms"], ["post_attention_layernorm", "post_feedforward_layernorm"])
        self.assertEqual(mix["layers"][1]["mlp"]["add_norm"], "post_feedforward_layernorm")
        self.assertEqual(mix["layers"][2]["attn"]["pre_scale"], 1.0)
        sandwich = printed("--norm_scheme=sandwich", "--num_layers=2")["layers"][1]
        self.assertEqual(len(sandwich["norms"]), 4)
        self.assertEqual((sandwich["mlp"]["pre_norm"], sandwich["mlp"]["out_norm"]),
                         ("pre_feedforward_layernorm", "post_feedforward_layernorm"))
        deep = printed("--norm_scheme=deepnorm", "--num_layers=6")["layers"]
        for l in deep:
            for sub in ("attn", "mlp"):
                self.assertAlmostEqual(l[sub]["residual_alpha"], (2 * 6) ** 0.25, delta=1e-6)
        mono = printed("--norm_scheme=mono", "--num_layers=4")["layers"]
        self.assertEqual([l["route"] is not None for l in mono], [False, False, False, True])  # every 4th layer

    @NEEDS_TRAIN
    def test_bad_flags_one_line(self):
        for flags, flag in ((["--norm_scheme=bogus"], "--norm_scheme"),
                            (["--norm_scheme=mix", "--num_layers=2", "--post_layers=5"], "--post_layers")):
            r = subprocess.run([TRAIN, "--print_block_plan", *flags], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertEqual(r.stdout, "")
            self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
            self.assertTrue(r.stderr.startswith("lns_train: error: " + flag), r.stderr)
        with self.assertRaisesRegex(ValueError, "^--norm_scheme=bogus is not a normalization scheme"):
            block_plan.ask_lns_train(block_plan.request("bogus", 4, 0, ""), TRAIN)


class CommittedPlans(unittest.TestCase):
    @NEEDS_TRAIN
    def test_equal_to_what_lns_train_prints(self):
        plans = block_plan.committed()
        self.assertGreater(len(plans), 0)
        for p in plans:
            want = printed(*block_plan.request(p["norm_scheme"], p["num_layers"], p["post_layers"],
                                               p["layer_schemes"]))
            self.assertEqual(p, want, "tools/perf/block_plans.json is stale: python3 tools/perf/block_plan.py "
                                      "--write (with LNS_TRAIN_BIN) writes it again")

    def test_every_config_is_committed(self):
        for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
            if not name.endswith(".flags"):
                continue
            f = read_flagfile(os.path.join(ROOT, "configs", name))
            key = (f.get("norm_scheme", "lns"), int(f.get("num_layers", 12)), int(f.get("post_layers", 0)),
                   f.get("layer_schemes", ""))
            self.assertTrue(any(block_plan.matches(p, *key) for p in block_plan.committed()),
                            f"configs/{name}: its plan {key} is not in tools/perf/block_plans.json")


class ModelsReadThePlan(unittest.TestCase):
    def tearDown(self):
        block_plan.plan.cache_clear()
        block_plan.committed.cache_clear()

    def test_norm_counts_of_the_table(self):
        # The table's norms per block (sandwich 4, every other modelled scheme 2, Mix-LN's
        # post blocks 2 as well) and the final norm, for both norm types.
        for scheme, per_block in (("lns", 2), ("pre", 2)):
            for norm_type, per_norm in (("rmsnorm", 32), ("layernorm", 64)):
                s = shape(scheme, 12, norm_type=norm_type)  # committed: no lns_train needed
                self.assertEqual(s.norm_params(), (12 * per_block + 1) * per_norm)
                self.assertEqual(s.block_norms(3, 7), 4 * per_block)

    @NEEDS_TRAIN
    def test_norm_counts_of_every_modelled_scheme(self):
        for scheme, per_block in (("pre", 2), ("lns", 2), ("scaled_init", 2), ("post", 2), ("deepnorm", 2),
                                  ("sandwich", 4), ("mix", 2), ("deeppost", 2), ("scale_post_pre", 2)):
            s = shape(scheme, 5, post_layers=2)
            self.assertEqual(s.norm_params(), (5 * per_block + 1) * 32, scheme)

    def test_an_altered_plan_moves_the_figures_by_exactly_that(self):
        base = shape("lns", 12)
        kernels = StepModel(base, PRESENT, device("h100"), 1).kernels
        params = base.norm_params()
        plans = copy.deepcopy(block_plan.committed())
        lns12 = next(p for p in plans if block_plan.matches(p, "lns", 12, 0, ""))
        # one more norm owned by layer 3, and a residual scale on layer 5's MLP sublayer
        lns12["layers"][3]["norms"].append("pre_feedforward_layernorm")
        lns12["layers"][5]["mlp"]["residual_alpha"] = 2.0
        block_plan.plan.cache_clear()
        with mock.patch.object(block_plan, "committed", lambda: plans):
            self.assertEqual(base.norm_params(), params + 32)
            altered = StepModel(base, PRESENT, device("h100"), 1).kernels
        extra = [k for k in altered if k.name == "axpby"]
        self.assertEqual(len(extra), len([k for k in kernels if k.name == "axpby"]) + 1)
        self.assertEqual(len(altered), len(kernels) + 1)

    def test_refused_where_the_models_cannot_model(self):
        routed = [dict(l, route={"attn": l["attn"], "mlp": l["mlp"]}) if l["layer"] == 3 else l
                  for l in next(p for p in block_plan.committed() if block_plan.matches(p, "lns", 6, 0, ""))["layers"]]
        learned = [dict(l, attn=dict(l["attn"], learned_branch_scale=True)) for l in routed[:3]] + routed[3:]
        block_plan.plan.cache_clear()
        for layers, what in ((routed, "layer 3 is a routed block"), (learned, "layer 0 has learned branch scales")):
            fake = [{"norm_scheme": "lns", "num_layers": 6, "post_layers": 0, "layer_schemes": "",
                     "folded_norms": False, "layers": layers}]
            block_plan.plan.cache_clear()
            with mock.patch.object(block_plan, "committed", lambda: fake):
                with self.assertRaisesRegex(ValueError, "^--norm_scheme=lns: " + what):
                    block_plan.of_shape(shape("lns", 6))

    @NEEDS_TRAIN
    def test_refused_schemes_through_lns_train(self):
        for scheme, what in (("mono", "routed block"), ("scale_res_pre_norm", "learned branch scales")):
            with self.assertRaisesRegex(ValueError, f"^--norm_scheme={scheme}: layer \\d+ .*{what}"):
                shape_from_flags({"norm_scheme": scheme, "num_layers": "4"})

    def test_without_lns_train_names_it(self):
        block_plan.plan.cache_clear()
        with mock.patch.dict(os.environ, {"LNS_TRAIN_BIN": "/nonexistent/lns_train"}):
            with self.assertRaisesRegex(ValueError, "--num_layers=7 .* needs lns_train \\(LNS_TRAIN_BIN"):
                shape("lns", 7).norm_params()


if __name__ == "__main__":
    unittest.main()
