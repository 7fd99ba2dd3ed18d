#!/usr/bin/env python3
"""lns_generate as a user runs it (issue 48), and the long tools' progress when piped.

- Greedy output equals Hugging Face transformers' generate on the exported model, token
  for token: tests/golden/generate/expected.json (tools/reference/make_generate_golden.py)
  against lns_generate on the committed checkpoint and on its lns_convert export-hf.
- Text prompts (byte-level), the tokenizer found from the run's --data record, the
  end-of-document stop, seeded sampling, a BPE tokenizer.json through tools/tokens.py.
- Bad input: one line naming the flag, exit status 1.
- lns_convert and lns_eval's layer sweep print plain progress lines into a pipe.

Needs LNS_GENERATE_BIN, LNS_CONVERT_BIN, LNS_EVAL_BIN.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "golden", "generate")
CKPT = os.path.join(GOLDEN, "checkpoint")
GEN = os.environ.get("LNS_GENERATE_BIN", "")
CONVERT = os.environ.get("LNS_CONVERT_BIN", "")
EVAL = os.environ.get("LNS_EVAL_BIN", "")
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import prepare_data  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def run(*cmd, timeout=120):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=ENV)


def load_expected():
    with open(os.path.join(GOLDEN, "expected.json")) as f:
        return json.load(f)


def generate(*flags):
    r = run(GEN, *flags)
    if r.returncode != 0:
        raise AssertionError("lns_generate %s failed:\n%s" % (" ".join(flags), r.stderr))
    return r


def generate_json(*flags):
    return json.loads(generate("--format=json", *flags).stdout)


class Golden(unittest.TestCase):
    """Greedy ids against transformers' generate (float32), for every recorded prompt."""

    @classmethod
    def setUpClass(cls):
        cls.expected = load_expected()
        cls.tmp = tempfile.mkdtemp(prefix="lns_gen_cli_")
        cls.hf = os.path.join(cls.tmp, "hf")
        r = run(CONVERT, "export-hf", "--in=%s" % CKPT, "--out=%s" % cls.hf)
        assert r.returncode == 0, r.stderr

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def check(self, source, case):
        n = self.expected["max_new_tokens"]
        got = generate_json(source, "--prompt_ids=%s" % ",".join(map(str, case["prompt_ids"])), "--temperature=0",
                            "--max_new_tokens=%d" % n, "--stop_at_eos=false", "--tokenizer=byte")
        self.assertEqual(got["prompt_ids"], case["prompt_ids"])
        want = case["ids"]
        if got["ids"] != want:
            i = next(i for i, (a, b) in enumerate(zip(got["ids"], want)) if a != b)
            self.fail("%s, prompt %r: token %d is %d, transformers generated %d (its smallest top-2 logit gap over "
                      "the run: %.4f)\n got  %s\n want %s" % (source, case["prompt"], i, got["ids"][i], want[i],
                                                                case["min_top2_gap"], got["ids"], want))

    def test_checkpoint_equals_transformers(self):
        for case in self.expected["cases"]:
            self.check("--checkpoint=%s" % CKPT, case)

    def test_hf_export_equals_transformers(self):
        for case in self.expected["cases"]:
            self.check("--hf_dir=%s" % self.hf, case)

    def test_text_prompt_is_its_bytes(self):
        case = next(c for c in self.expected["cases"] if c["prompt"] == "The ")
        n = self.expected["max_new_tokens"]
        r = generate("--checkpoint=%s" % CKPT, "--prompt=The ", "--temperature=0", "--max_new_tokens=%d" % n,
                     "--stop_at_eos=false", "--tokenizer=byte")
        self.assertEqual(r.stdout, "The " + bytes(i for i in case["ids"] if i < 256).decode("utf-8", "replace") + "\n")
        self.assertRegex(r.stderr, r"lns_generate: 4 prompt tokens, %d new in [0-9.]+ s" % n)


class Cli(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lns_gen_cli_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_dir(self, record):
        """A run directory as lns_train leaves it: checkpoints/step_*, config.flags naming
        --data, and prepare_data.py's record beside the data (`record`)."""
        run_dir = os.path.join(self.tmp, "run")
        shutil.copytree(CKPT, os.path.join(run_dir, "checkpoints", "step_0000400"))
        data = os.path.join(self.tmp, "data", "corpus")
        os.makedirs(os.path.dirname(data))
        with open(data + ".json", "w") as f:
            json.dump(record, f)
        with open(os.path.join(run_dir, "config.flags"), "w") as f:
            f.write("--seq_len=64\n--data=%s.train.tok\n--out_dir=%s\n" % (data, run_dir))
        return run_dir

    def test_tokenizer_from_the_run_and_the_end_of_document_stop(self):
        run_dir = self.run_dir({"tokenizer": "byte", "vocab_size": 257, "eos_id": 256})
        expected = load_expected()
        empty = next(c for c in expected["cases"] if c["prompt"] == "")
        # An empty prompt starts after end-of-document (256), as the golden's first case.
        got = generate_json("--checkpoint=%s" % run_dir, "--temperature=0", "--max_new_tokens=40",
                            "--stop_at_eos=false")
        self.assertEqual(got["prompt_ids"], [256])
        self.assertEqual(got["ids"], empty["ids"])
        # Sampled, stopping at the first end-of-document: 400 tokens give the model room to end one.
        got = generate_json("--checkpoint=%s" % run_dir, "--temperature=1", "--max_new_tokens=400", "--seed=3")
        ids = got["ids"]
        self.assertNotIn(256, ids[:-1])
        if got["stopped_at_eos"]:
            self.assertEqual(ids[-1], 256)
        self.assertEqual(got["text"], bytes(i for i in ids if i < 256).decode("utf-8", "replace"))

    def test_sampling_is_seeded(self):
        flags = ["--checkpoint=%s" % CKPT, "--tokenizer=byte", "--prompt=The ", "--max_new_tokens=30",
                 "--stop_at_eos=false", "--temperature=0.9", "--top_k=20", "--top_p=0.9"]
        a, b = generate_json(*flags, "--seed=1"), generate_json(*flags, "--seed=1")
        c = generate_json(*flags, "--seed=2")
        self.assertEqual(a["ids"], b["ids"])
        self.assertNotEqual(a["ids"], c["ids"])
        # top_k=1 is greedy whatever the temperature
        g = generate_json("--checkpoint=%s" % CKPT, "--tokenizer=byte", "--prompt=The ", "--max_new_tokens=30",
                          "--stop_at_eos=false", "--temperature=0")
        k1 = generate_json("--checkpoint=%s" % CKPT, "--tokenizer=byte", "--prompt=The ", "--max_new_tokens=30",
                           "--stop_at_eos=false", "--temperature=2", "--top_k=1", "--seed=9")
        self.assertEqual(g["ids"], k1["ids"])

    def test_bpe_tokenizer_through_tokens_py(self):
        try:
            from tokenizers import Tokenizer, models, pre_tokenizers, trainers
        except ImportError:
            self.skipTest("no 'tokenizers' package")
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"])
        tok.train_from_iterator(["the cat sat on the mat", "a dog and a cat", "what is the matter"] * 20, trainer)
        path = os.path.join(self.tmp, "tokenizer.json")
        tok.save(path)
        self.assertLessEqual(tok.get_vocab_size(), 257)
        got = generate_json("--checkpoint=%s" % CKPT, "--tokenizer=%s" % path, "--prompt=the cat sat",
                            "--temperature=0", "--max_new_tokens=12", "--stop_at_eos=false")
        self.assertEqual(got["prompt_ids"], tok.encode("the cat sat").ids)
        self.assertEqual(got["text"], tok.decode(got["ids"], skip_special_tokens=False))
        # the run's record naming the tokenizer file works the same
        run_dir = self.run_dir({"tokenizer": path, "vocab_size": tok.get_vocab_size(), "eos_id": 1})
        again = generate_json("--checkpoint=%s" % run_dir, "--prompt=the cat sat", "--temperature=0",
                              "--max_new_tokens=12", "--stop_at_eos=false")
        self.assertEqual(again["ids"], got["ids"])

    def test_bad_input_is_one_line(self):
        missing = os.path.join(self.tmp, "nope.txt")
        cases = [
            (["--checkpoint=%s" % CKPT, "--hf_dir=%s" % CKPT], "give exactly one of --checkpoint and --hf_dir"),
            (["--checkpoint=%s" % CKPT, "--tokenizer=byte", "--top_p=0"], "--top_p must be in (0, 1]"),
            (["--checkpoint=%s" % CKPT, "--tokenizer=byte", "--temperature=-1"], "--temperature must be >= 0"),
            (["--checkpoint=%s" % CKPT, "--tokenizer=byte", "--top_k=-3"], "--top_k must be >= 0"),
            (["--checkpoint=%s" % CKPT, "--tokenizer=byte", "--prompt_file=%s" % missing],
             "--prompt_file=%s: cannot read the file" % missing),
            (["--checkpoint=%s" % CKPT, "--tokenizer=byte", "--prompt_ids=1,x"], "--prompt_ids: 'x' is not a token id"),
            (["--checkpoint=%s" % CKPT, "--tokenizer=byte", "--prompt_ids=300"],
             "the prompt holds token id 300, outside the model's vocabulary of 257"),
            (["--checkpoint=%s" % CKPT, "--tokenizer=byte", "--format=xml"], "--format must be text, ids or json"),
            (["--checkpoint=%s" % CKPT, "--tokenizer=byte", "--max_new_tokens=0"], "--max_new_tokens must be >= 1"),
            (["--checkpoint=%s" % CKPT], "--tokenizer=auto: no training data recorded"),
            (["--checkpoint=%s" % CKPT, "--tokenizer=ids"], "--tokenizer=ids has none; give --prompt_ids"),
            (["--checkpoint=%s" % CKPT, "--tokenizer=%s" % missing], "is not a file"),
            (["--checkpoint=%s" % self.tmp, "--tokenizer=byte"], self.tmp),
        ]
        for flags, needle in cases:
            r = run(GEN, *flags)
            lines = r.stderr.strip().splitlines()
            self.assertEqual(r.returncode, 1, (flags, r.stderr))
            self.assertEqual(len(lines), 1, (flags, r.stderr))
            self.assertTrue(lines[0].startswith("lns_generate: error: "), (flags, r.stderr))
            self.assertIn(needle, lines[0], flags)


class ProgressPiped(unittest.TestCase):
    """Into a pipe the long tools print plain lines, never a redrawn bar (lns/core/progress.h)."""

    LINE = re.compile(r"^(lns_convert: [a-z-]+|lns_eval: sweep): (\d+)/(\d+) \((\d+)%\).* \| [0-9.]+ s elapsed, "
                      r"ETA (\S+)$")

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lns_progress_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def progress_lines(self, text, prefix):
        self.assertNotIn("\r", text)
        self.assertNotIn("\033", text)
        lines = [l for l in text.splitlines() if l.startswith(prefix)]
        self.assertGreaterEqual(len(lines), 2, text)
        for l in lines:
            self.assertRegex(l, self.LINE)
        m = self.LINE.match(lines[-1])
        self.assertEqual(m.group(2), m.group(3), lines[-1])  # ends at total
        self.assertEqual(m.group(4), "100")
        self.assertEqual(m.group(5), "0s")
        return lines

    def test_lns_convert(self):
        r = run(CONVERT, "reshard", "--in=%s" % CKPT, "--out=%s" % os.path.join(self.tmp, "tp2"), "--tp=2")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = self.progress_lines(r.stderr, "lns_convert: reshard: ")
        # 2 ranks x 21 weights (2 layers x 9, embedding, final norm, head): a line per tenth and the end
        self.assertEqual(self.LINE.match(lines[-1]).group(3), "42")
        self.assertLessEqual(len(lines), 11)

    def test_lns_eval_sweep(self):
        txt = os.path.join(self.tmp, "text.txt")
        with open(txt, "w") as f:
            f.write("\n\n".join("A fortune number %d: all things come to those who wait." % i for i in range(60)))
        prepare_data.main(["--input", txt, "--out", os.path.join(self.tmp, "d"), "--val_fraction", "0",
                           "--no_progress"])
        r = run(EVAL, "--checkpoint=%s" % CKPT, "--data=%s" % os.path.join(self.tmp, "d.train.tok"),
                "--drop_layers=sweep", "--seq_len=32", "--micro_batch_size=2", "--eval_tokens=640", "--plot=false")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = self.progress_lines(r.stderr, "lns_eval: sweep: ")
        self.assertEqual(self.LINE.match(lines[-1]).group(3), "10")  # 640 tokens in batches of 2 x 32


if __name__ == "__main__":
    if not (GEN and CONVERT and EVAL):
        sys.exit("test_generate_cli.py: set LNS_GENERATE_BIN, LNS_CONVERT_BIN and LNS_EVAL_BIN")
    unittest.main(verbosity=2)
