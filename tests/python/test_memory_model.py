#!/usr/bin/env python3
"""tools/perf/memory_model.py: its activation account against the bytes lns_train
prints at start-up (the C++ account, itself held to the allocator by
tests/unit/test_recompute.cpp), its layout rule, and the 7B/13B flagfiles holding the rule's
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
MPIRUN = os.environ.get("MPIRUN")
TOOL = [sys.executable, os.path.join(ROOT, "tools", "perf", "memory_model.py")]
H100 = device("h100")


def printed_account(extra, np=1):
    """(per-layer bytes, stage, workspace, gradients, total) from lns_train's start-up line
    (stage 0's; np > 1: under mpirun, rank 0 prints it)."""
    mpi = [MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", str(np)] if np > 1 else []
    args = [*mpi, TRAIN, "--vocab_size=29", "--hidden_size=36", "--intermediate_size=45", "--num_layers=4",
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

    @unittest.skipUnless(TRAIN and MPIRUN, "LNS_TRAIN_BIN or MPIRUN not set (ctest sets them)")
    def test_sequence_parallel_account_equals_what_lns_train_prints(self):
        # tp = 2 with --sequence_parallel (2 ranks): the split regions at N / 2 tokens.
        # Multi-head (6 kv heads) so tp = 2 divides them; seq_len 8 so it divides that.
        for scheme, norm, mode, n in (("lns", "rmsnorm", "none", 0), ("sandwich", "layernorm", "selective", 0),
                                      ("post", "rmsnorm", "full", 3)):
            extra = [f"--norm_scheme={scheme}", f"--norm_type={norm}", f"--recompute={mode}",
                     f"--recompute_layers={n}", "--num_kv_heads=6", "--seq_len=8", "--tp=2",
                     "--sequence_parallel"]
            layers, (stage, per_mb, ws, grads, total) = printed_account(extra, np=2)
            s = ModelShape(V=29, C=36, L=4, Hq=6, Hkv=6, F=45, T=8, B=2, global_batch=2,
                           scheme=scheme, norm_type=norm)
            acc = activation_account(s, 2, 0, 4, True, True, 1, mode, n, dev="cpu", sp=True)
            what = f"{scheme} {norm} {mode} {n} sp"
            for a, b, m, nb in layers:
                for g in range(a, b + 1):
                    self.assertEqual(acc.layers[g][1:], (m, nb), what)
            self.assertEqual((acc.stage, acc.per_micro_batch(), acc.workspace, acc.gradients, acc.total()),
                             (stage, per_mb, ws, grads, total), what)
            # and it is not the plain tp account: the split regions did shrink
            plain = activation_account(s, 2, 0, 4, True, True, 1, mode, n, dev="cpu")
            self.assertLess(total, plain.total(), what)

    def test_sequence_parallel_terms_by_hand(self):
        # 7B at tp = 2, bf16, none: the split regions (u f r of both sublayers, two rstd,
        # h0) at N / 2 tokens, the tensor-parallel ones (q k v ctx, gate up act, lse) at N
        s = shape_from_flags(read_flagfile(os.path.join(ROOT, "configs", "7b_lns.flags")), 1)
        N, C, F, NL = 4096, 4096, 11008, 2048
        acc = activation_account(s, 2, 0, 32, True, False, 1, sp=True)
        self.assertEqual(acc.layers[0][2], 2 * (6 * NL * C + 4 * N * C // 2 + 3 * N * F // 2) + 4 * (16 * 4096 + 2 * NL))
        self.assertEqual(acc.stage, 4 * N + 2 * NL * C)
        self.assertEqual(acc.gradients, 2 * (6 * NL * C + 2 * N * C + 4 * N * C // 2 + 3 * N * F // 2))
        full = activation_account(s, 2, 0, 32, True, False, 1, "full", sp=True)
        self.assertEqual(full.layers[5][2], 2 * NL * C)
        # tp = 1: nothing to split, the flag changes nothing
        self.assertEqual(activation_account(s, 1, 0, 32, True, False, 1, sp=True),
                         activation_account(s, 1, 0, 32, True, False, 1))
        # the rule with --sequence_parallel: every tp > 1 candidate runs it, and the
        # chosen layout needs no more memory than without
        c = candidates(s, 32, 8, sp=True)
        self.assertTrue(all(l.sp == (l.tp > 1) for l in c))
        lay, mem = choose(s, 32, H100, sp=True)
        plain, plain_mem = choose(s, 32, H100)
        self.assertLessEqual(sum(mem.values()), sum(plain_mem.values()))

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
