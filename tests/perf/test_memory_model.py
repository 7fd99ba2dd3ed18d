#!/usr/bin/env python3
"""tools/perf/memory_model.py: its activation account against the bytes lns_train
prints at start-up (the C++ account, itself held to the allocator by
tests/test_recompute.cpp), its layout rule, and the 7B/13B flagfiles holding the rule's
choice for 4 and 16 nodes of 8 GPUs."""
import os
import re
import subprocess
import sys
import unittest
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "perf"))

from devices import device  # noqa: E402
from flags import read_flagfile  # noqa: E402
from memory_model import (Layout, activation_account, candidates, choose, rank_memory,  # noqa: E402
                          slots_for, split_layers)
from step_model import ModelShape, shape_from_flags  # noqa: E402

TRAIN = os.environ.get("LNS_TRAIN_BIN")
TOOL = [sys.executable, os.path.join(ROOT, "tools", "perf", "memory_model.py")]
H100 = device("h100")


def printed_account(extra):
    """(per-layer bytes, stage, workspace, gradients, total) from lns_train's start-up line."""
    args = [TRAIN, "--vocab_size=29", "--hidden_size=36", "--intermediate_size=45", "--num_layers=4",
            "--num_heads=6", "--num_kv_heads=3", "--seq_len=7", "--micro_batch_size=2",
            "--global_batch_size=2", "--steps=1", "--data=random", "--log_every=1", *extra]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stderr.splitlines() if "activation memory per micro-batch" in l)
    layers = [(int(a), int(b), m, int(n)) for a, b, m, n in
              re.findall(r"layers (\d+)-(\d+) (\w+) [\d.]+ MiB \((\d+) B\) each", line)]
    rest = [int(n) for n in re.findall(r"\((\d+) B\)", line.split("embedding/head")[1])]
    return layers, rest


class MemoryModel(unittest.TestCase):
    @unittest.skipUnless(TRAIN, "LNS_TRAIN_BIN not set (ctest sets it)")
    def test_account_equals_what_lns_train_prints(self):
        for scheme, norm in (("lns", "rmsnorm"), ("sandwich", "layernorm"), ("post", "rmsnorm"),
                             ("mix", "layernorm")):
            for mode, n in (("none", 0), ("selective", 0), ("full", 0), ("full", 3)):
                extra = [f"--norm_scheme={scheme}", f"--norm_type={norm}", "--post_layers=2",
                         f"--recompute={mode}", f"--recompute_layers={n}"]
                layers, (stage, per_mb, ws, grads, total) = printed_account(extra)
                s = ModelShape(V=29, C=36, L=4, Hq=6, Hkv=3, F=45, T=7, B=2, global_batch=2,
                               scheme=scheme, norm_type=norm, post_layers=2)
                acc = activation_account(s, 1, 0, 4, True, True, 1, mode, n, dev="cpu")
                what = f"{scheme} {norm} {mode} {n}"
                for a, b, m, nb in layers:
                    for g in range(a, b + 1):
                        self.assertEqual(acc.layers[g][1:], (m, nb), what)
                self.assertEqual((acc.stage, acc.per_micro_batch(), acc.workspace, acc.gradients, acc.total()),
                                 (stage, per_mb, ws, grads, total), what)

    def test_layer_terms_by_hand(self):
        # 7B at tp = 2, bf16: u f r x 2 [N,C]; q k v ctx [N,C/2]; gate up act [N,F/2];
        # lse [1,16,T] and two rstd in f32
        s = shape_from_flags(read_flagfile(os.path.join(ROOT, "configs", "7b_lns.flags")), 1)
        N, C, F = 4096, 4096, 11008
        acc = activation_account(s, 2, 0, 32, True, False, 1)
        layer = 2 * (6 * N * C + 4 * N * C // 2 + 3 * N * F // 2) + 4 * (16 * 4096 + 2 * N)
        self.assertEqual(acc.layers[0][2], layer)
        full = activation_account(s, 2, 0, 32, True, False, 1, "full")
        self.assertEqual(full.layers[5][2], 2 * N * C)
        self.assertEqual(full.workspace, layer - 2 * N * C)
        part = activation_account(s, 2, 0, 32, True, False, 1, "full", 8)
        self.assertEqual([m for _, m, _ in part.layers].count("full"), 8)
        self.assertEqual(part.workspace, layer - 2 * N * C)

    def test_pipeline_split_and_slots(self):
        self.assertEqual(split_layers(7, 3), [(0, 3), (3, 5), (5, 7)])  # parallel/layout.cpp
        self.assertEqual([slots_for(8, p, 4) for p in range(4)], [4, 3, 2, 1])
        self.assertEqual(slots_for(2, 0, 4), 2)

    def test_rule_order(self):
        s = shape_from_flags(read_flagfile(os.path.join(ROOT, "configs", "7b_lns.flags")), 1)
        c = candidates(s, 32, 8)
        # no full recomputation before every layout without it; then by tp x pp, none first
        self.assertEqual(c[0], Layout(1, 1, 32, "none", 1))
        self.assertEqual(c[1], Layout(1, 1, 32, "selective", 1))
        self.assertEqual(c[2], Layout(2, 1, 16, "none", 1))
        self.assertEqual(c[3], Layout(1, 2, 16, "none", 1))
        first_full = next(i for i, l in enumerate(c) if l.mode == "full")
        self.assertTrue(all(l.mode == "full" for l in c[first_full:]))
        # 7B on one GPU's worth of model: 10 bytes per parameter + activations > 76 GiB
        self.assertGreater(sum(rank_memory(s, c[0]).values()), 76 * 2**30)
        # a smaller card moves the choice to more model parallelism
        small = replace(H100, memory_gib=40.0)
        lay, _ = choose(s, 32, small)
        self.assertGreater(lay.tp * lay.pp, 2)

    def test_flagfiles_hold_the_choice_at_4_and_16_nodes(self):
        for name in ("7b_lns", "13b_lns"):
            path = os.path.join(ROOT, "configs", name + ".flags")
            flags = read_flagfile(path)
            for nodes in (4, 16):
                r = subprocess.run(TOOL + [f"--flagfile={path}", f"--nodes={nodes}"], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                m = re.search(r"chosen: --tp=(\d+) --pp=(\d+) \(dp=(\d+)\) --recompute=(\w+) --micro_batch_size=(\d+)",
                              r.stdout)
                self.assertTrue(m, r.stdout)
                tp, pp, dp, mode, mb = m.groups()
                self.assertEqual((flags["tp"], flags["pp"], flags["recompute"], flags["micro_batch_size"]),
                                 (tp, pp, mode, mb), f"{name} at {nodes} nodes")
                self.assertEqual(int(tp) * int(pp) * int(dp), 8 * nodes)
                self.assertIn("projected", r.stdout)

    def test_bad_input_is_one_line(self):
        path = os.path.join(ROOT, "configs", "7b_lns.flags")
        for bad, what in (("--nodes=0", "--nodes"), ("--gpu=v100", "--gpu"), ("--reserve_gib=x", "--reserve_gib")):
            r = subprocess.run(TOOL + [f"--flagfile={path}", bad], capture_output=True, text=True)
            self.assertEqual(r.returncode, 2, bad)
            self.assertEqual(r.stderr.strip().count("\n"), 0, r.stderr)
            self.assertIn(what, r.stderr)


if __name__ == "__main__":
    unittest.main()
