#!/usr/bin/env python3
"""The width-512 depth study's pipeline in miniature, end to end on the CPU (issue 45,
docs/depth_study_scale.md), on a slice of the real corpus: one source of
tools/experiments/real_corpus_sources.json (developers-reference, a Debian package that
tools/install_deps.sh installs) taken from this system's installed package.

1. prepare  real_corpus.py --only developers-reference --installed: the record's checksum of
            the used files equals one computed here from the system's files, and its token
            counts equal prepare_data's;
2. train    depth_study.py --study scale --grid scale_mini (width 32, 2 to 4 blocks, 6 steps,
            24 cells): every cell recorded, each depth at the rate its sweep's records chose,
            evaluated spread over the validation file, the parameter count against the
            checkpoints' tensors, and a second invocation has nothing to do;
3. check    scale_crosscheck.py: exit 77 (skipped) with the CPU build, whose lns_train has no
            CUDA device, else the two devices within 0.1%; --cpu_only records the CPU's first
            steps, equal to its run's metrics;
4. page     depth_scale_doc.py on those records: the answers' table holds each depth's losses
            as computed here from the records, and the CPU steps' sentence their figures.

LNS_TRAIN_BIN and LNS_EVAL_BIN (ctest sets them). Skipped when developers-reference is not
installed or the tokenizers package is missing. About a minute on 2 cores.
"""
import glob
import hashlib
import json
import math
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
EXP = os.path.join(ROOT, "tools", "experiments")
sys.path.insert(0, EXP)
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import depth_study  # noqa: E402
import kept_folder  # noqa: E402

SOURCE, PACKAGE, VOCAB = "developers-reference", "developers-reference", 512


def installed(package):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.endswith(" installed")


def py(*args, **kw):
    return subprocess.run([sys.executable] + list(args), capture_output=True, text=True, cwd=ROOT, **kw)


@unittest.skipUnless(os.environ.get("LNS_TRAIN_BIN") and os.environ.get("LNS_EVAL_BIN"),
                     "set LNS_TRAIN_BIN and LNS_EVAL_BIN (ctest does)")
class ScalePipeline(kept_folder.KeptFolderTest):
    prefix = "lns_scale_pipeline_"

    def test_prepare_train_check_page(self):
        try:
            import tokenizers  # noqa: F401
        except ImportError:
            self.skipTest("needs the tokenizers package")
        if not installed(PACKAGE):
            self.skipTest("needs the Debian package %s (tools/install_deps.sh installs it)" % PACKAGE)
        w = self.work
        # 1. prepare: the slice of the real corpus
        data = os.path.join(w, "slice")
        r = py(os.path.join(EXP, "real_corpus.py"), "--only", SOURCE, "--installed", "--cache", os.path.join(w, "cache"),
               "--out", data, "--vocab", str(VOCAB), "--val_fraction", "0.1")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(data + ".sources.json") as f:
            rec = json.load(f)
        self.assertEqual([s["name"] for s in rec["sources"]], [SOURCE])
        src = rec["sources"][0]
        self.assertTrue(src["package_file"].startswith("installed:%s_" % PACKAGE), src["package_file"])
        with open(os.path.join(EXP, "real_corpus_sources.json")) as f:
            include = [s for s in json.load(f)["sources"] if s["name"] == SOURCE][0]["include"]
        used = sorted({p for g in include for p in glob.glob("/" + g, recursive=True) if os.path.isfile(p)})
        self.assertEqual(src["files"], len(used))

        def sha(p):
            with open(p, "rb") as f:
                return hashlib.sha256(f.read()).hexdigest()
        digest = hashlib.sha256("".join(sorted("%s\t%s\n" % (p[1:], sha(p)) for p in used)).encode()).hexdigest()
        self.assertEqual(src["files_sha256"], digest)
        with open(data + ".json") as f:
            meta = json.load(f)
        self.assertEqual((rec["totals"]["train_tokens"], rec["totals"]["val_tokens"]),
                         (meta["train"]["tokens"], meta["val"]["tokens"]))
        self.assertGreater(meta["val"]["tokens"], 2 * 512)  # enough for the evaluation to spread over
        # 2. train the miniature grid on it
        bindir = os.path.join(w, "bin")
        os.makedirs(bindir)
        for name in ("LNS_TRAIN_BIN", "LNS_EVAL_BIN"):
            os.symlink(os.environ[name], os.path.join(bindir, os.path.basename(os.environ[name])))
        out, records = os.path.join(w, "runs"), os.path.join(w, "records")
        cmd = [os.path.join(EXP, "depth_study.py"), "--study", "scale", "--grid", "scale_mini", "--data", data,
               "--vocab", str(VOCAB), "--bin", bindir, "--out", out, "--record", records, "--jobs", "2",
               "--threads", "1"]
        r = py(*cmd, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        loss = lambda c: depth_study.finished_loss(c, out, records)
        cells = depth_study.grid("scale_mini", loss)
        self.assertEqual(len(cells), 24)
        recs = {}
        for c in cells:
            path = os.path.join(records, depth_study.run_name(c) + ".json")
            self.assertTrue(os.path.exists(path), depth_study.run_name(c))
            with open(path) as f:
                recs[depth_study.run_name(c)] = json.load(f)
        # every depth at the rate its sweep's recorded losses chose
        best = depth_study.best_rates([c for c in cells if c["group"] == "lr" and c["layers"] == 2], loss)
        deep = depth_study.best_rates([c for c in cells if c["group"] == "lr" and c["layers"] == 4], loss)
        for c in cells:
            if c["group"] == "depth":
                self.assertEqual(c["lr"], (deep if c["layers"] == 4 else best)[c["scheme"]], depth_study.run_name(c))
        some = recs[depth_study.run_name(cells[-1])]
        self.assertEqual(len(some["drop_pct"]), cells[-1]["layers"])
        self.assertEqual(some["eval"], {"tokens": 512, "spread": True})  # spread over the validation file
        # the budget's parameter count (study_budget.py) against the checkpoints' own tensors
        import study_budget
        for c in cells:
            if c["scheme"] in ("pre", "mix") and c["seed"] == 1:
                ck = sorted(glob.glob(os.path.join(out, depth_study.run_name(c), "checkpoints", "step_*")))[-1]
                with open(os.path.join(ck, "manifest.json")) as f:
                    tensors = [t for t in json.load(f)["tensors"] if t["kind"] == "param"]
                n = sum(math.prod(t["logical"]) for t in {t["tensor"]: t for t in tensors}.values())
                self.assertEqual(study_budget.cell_budget(c, depth_study.SHAPES["mini"], VOCAB)["params"], n,
                                 depth_study.run_name(c))
        self.assertIn("24 cells, 0 to run", py(*(cmd + ["--list"])).stdout)
        # 3. the cross-check: CPU f32 against CUDA bf16 where the build has a device
        m = os.path.join(w, "measurements")
        os.makedirs(m)
        xc = [os.path.join(EXP, "scale_crosscheck.py"), "--grid", "scale_mini", "--steps", "2", "--cpu_bin", bindir,
              "--cuda_bin", bindir, "--data", data, "--vocab", str(VOCAB), "--records", records,
              "--out", os.path.join(w, "xc"), "--threads", "2"]
        r = py(*(xc + ["--record", os.path.join(m, "crosscheck.json")]))
        self.assertIn(r.returncode, (0, 77), r.stdout + r.stderr)
        if r.returncode == 0:
            with open(os.path.join(m, "crosscheck.json")) as f:
                self.assertLess(json.load(f)["max_rel_gap"], 1e-3)
        r = py(*(xc + ["--cpu_only", "--record", os.path.join(m, "cpu_steps.json")]))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(m, "cpu_steps.json")) as f:
            steps = json.load(f)
        mine = {}
        with open(os.path.join(w, "xc", "cpu", "metrics.jsonl")) as f:
            for line in f:
                j = json.loads(line)
                if "loss" in j and j.get("kind", "train") == "train":
                    mine[j["step"]] = j["loss"]
        self.assertEqual([x["loss"] for x in steps["rows"]], [mine[1], mine[2]])
        self.assertEqual(steps["name"], "mini_L02_pre_lr%s_s6_seed1" % depth_study.lr_name(best["pre"]))
        # 4. the page from the records
        page = os.path.join(w, "page.md")
        with open(page, "w") as f:
            f.write("# P\n<!-- depth_scale:begin -->\n<!-- depth_scale:end -->\n")
        r = py(os.path.join(EXP, "depth_scale_doc.py"), "--width64", os.path.join(w, "none"), "--scale", records,
               "--crosscheck", os.path.join(m, "crosscheck.json"), "--measured", m, "--doc", page)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(page) as f:
            text = f.read()
        for L, rates in ((2, best), (3, best), (4, deep)):
            for s in ("pre", "lns"):
                v = [recs[depth_study.run_name(depth_study.cell("depth", L, s, seed, lr=rates[s], steps=6,
                                                                shape="mini"))]["loss"] for seed in (1, 2)]
                mean = sum(v) / 2
                std = math.sqrt(sum((x - mean) ** 2 for x in v))
                self.assertIn("%.4f ± %.4f (2)" % (mean, std), text, (L, s))
        self.assertIn("`%s`'s first 2 steps on" % steps["name"], text)
        self.assertIn("with losses %.4f, %.4f against ln %d = %.3f" % (mine[1], mine[2], VOCAB, math.log(VOCAB)), text)
        self.assertIn("- width 512: 512 tokens spread over the whole validation file (24 records).", text)


if __name__ == "__main__":
    unittest.main()
