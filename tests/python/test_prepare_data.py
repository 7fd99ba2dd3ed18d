#!/usr/bin/env python3
"""tools/prepare_data.py: documents survive tokenization, the split is deterministic,
bad input names file and line, HF and SentencePiece tokenizers work, and lns_train
reads exactly the documents Python wrote (LNS_TRAIN_BIN)."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import prepare_data  # noqa: E402

DOCS = ["The first document.\nIt has two lines.\n", "Zweites Dokument: Grüße, naïve café.\n",
        "third\n"] + ["filler document number %d, with some words.\n" % i for i in range(40)]


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[8 + n + b:8 + n + end]
        fmt = {"I32": "i", "F32": "f"}[e["dtype"]]
        out[name] = (e["shape"], list(struct.unpack("<%d%s" % (len(raw) // 4, fmt), raw)))
    return out


class PrepareData(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="lns_prep_")
        self.txt = os.path.join(self.dir, "corpus.txt")
        with open(self.txt, "w", encoding="utf-8") as f:
            f.write("\n".join(DOCS))  # documents separated by blank lines

    def prepare(self, *extra, inputs=None):
        out = os.path.join(self.dir, "out")
        prepare_data.main(["--input", *(inputs or [self.txt]), "--out", out, "--no_progress", *extra])
        return out

    def test_byte_round_trip_and_deterministic_split(self):
        out = self.prepare("--val_fraction", "0.2")
        docs = []
        for split in ("train", "val"):
            toks, starts, vocab = prepare_data.read_token_file(out + ".%s.tok" % split)
            self.assertEqual(vocab, 257)
            for a, b in zip(starts, starts[1:]):
                self.assertEqual(toks[b - 1], 256)  # every document ends with EOS
                docs.append(bytes(toks[a:b - 1]).decode("utf-8"))
        self.assertEqual(sorted(docs), sorted(DOCS))
        manifest = json.load(open(out + ".json"))
        self.assertGreater(manifest["val"]["documents"], 0)
        self.assertEqual(manifest["train"]["documents"] + manifest["val"]["documents"], len(DOCS))
        first = open(out + ".train.tok", "rb").read()
        self.prepare("--val_fraction", "0.2")
        self.assertEqual(open(out + ".train.tok", "rb").read(), first)

    def test_fortune_separator_and_jsonl(self):
        fort = os.path.join(self.dir, "fort")
        with open(fort, "w") as f:
            f.write("one\n%\ntwo\nlines\n%\nthree\n")
        out = self.prepare("--doc_sep", "fortune", "--val_fraction", "0", inputs=[fort])
        toks, starts, _ = prepare_data.read_token_file(out + ".train.tok")
        self.assertEqual([bytes(toks[a:b - 1]) for a, b in zip(starts, starts[1:])],
                         [b"one\n", b"two\nlines\n", b"three\n"])
        jl = os.path.join(self.dir, "d.jsonl")
        with open(jl, "w") as f:
            f.write(json.dumps({"text": "alpha"}) + "\n" + json.dumps({"text": "beta"}) + "\n")
        out = self.prepare("--val_fraction", "0", inputs=[jl])
        toks, starts, _ = prepare_data.read_token_file(out + ".train.tok")
        self.assertEqual(len(starts) - 1, 2)

    def test_bad_jsonl_line_names_file_and_line(self):
        jl = os.path.join(self.dir, "bad.jsonl")
        with open(jl, "w") as f:
            f.write(json.dumps({"text": "ok"}) + "\n{not json\n")
        r = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "tools", "prepare_data.py"),
                            "--input", jl, "--out", os.path.join(self.dir, "x")],
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("bad.jsonl:2:", r.stderr)

    def read_sharded(self, out, split):
        with open(os.path.join(out, split, "index.json")) as f:
            index = json.load(f)
        toks, starts = [], [0]
        for sh in index["shards"]:
            t, st, _ = prepare_data.read_token_file(os.path.join(out, split, sh["file"]))
            starts += [len(toks) + x for x in st[1:]]
            toks += t
        return toks, starts

    def make_inputs(self):
        paths = []
        for k in range(4):
            p = os.path.join(self.dir, "part%d.txt" % k)
            with open(p, "w") as f:
                f.write("\n\n".join(DOCS[k::4]))
            paths.append(p)
        return paths

    def test_sharded_equals_single_file_and_resumes(self):
        paths = self.make_inputs()
        single = os.path.join(self.dir, "single")
        prepare_data.main(["--input", *paths, "--out", single, "--val_fraction", "0.2", "--no_progress"])
        out = os.path.join(self.dir, "sharded")
        prepare_data.main(["--input", *paths, "--out", out, "--val_fraction", "0.2", "--shards",
                           "--workers", "2", "--no_progress"])
        for split in ("train", "val"):
            toks, starts, _ = prepare_data.read_token_file("%s.%s.tok" % (single, split))
            self.assertEqual(self.read_sharded(out, split), (toks, starts), split)  # token for token
        # An interrupted run: one shard lost, another's done-marker half written.
        stamps = {n: os.stat(os.path.join(out, "train", n)).st_mtime_ns for n in ("shard_00000.tok", "shard_00003.tok")}
        os.remove(os.path.join(out, "train", "shard_00001.tok"))
        with open(os.path.join(out, ".done", "shard_00002.json"), "w") as f:
            f.write("{trunc")
        prepare_data.main(["--input", *paths, "--out", out, "--val_fraction", "0.2", "--shards",
                           "--workers", "2", "--no_progress"])
        for n, t in stamps.items():  # finished shards are not redone
            self.assertEqual(os.stat(os.path.join(out, "train", n)).st_mtime_ns, t, n)
        for split in ("train", "val"):
            toks, starts, _ = prepare_data.read_token_file("%s.%s.tok" % (single, split))
            self.assertEqual(self.read_sharded(out, split), (toks, starts), split)

    def test_corrupt_lines_fatal_or_skipped(self):
        import gzip
        jl = os.path.join(self.dir, "c4-like.jsonl.gz")
        with gzip.open(jl, "wt") as f:
            f.write(json.dumps({"text": "one"}) + "\n" + json.dumps({"text": "two"}) + "\n")
            f.write('{"text": "broken\n' + json.dumps({"url": "no text"}) + "\n" + json.dumps({"text": "five"}) + "\n")
        tool = os.path.join(HERE, "..", "..", "tools", "prepare_data.py")
        r = subprocess.run([sys.executable, tool, "--input", jl, "--out", os.path.join(self.dir, "f")],
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("c4-like.jsonl.gz:3:", r.stderr)
        r = subprocess.run([sys.executable, tool, "--input", jl, "--out", os.path.join(self.dir, "s"),
                            "--on_error", "skip", "--val_fraction", "0"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("skipped 2 bad line(s)", r.stderr)
        self.assertIn("c4-like.jsonl.gz:4:", r.stderr)
        toks, starts, _ = prepare_data.read_token_file(os.path.join(self.dir, "s.train.tok"))
        self.assertEqual([bytes(toks[a:b - 1]) for a, b in zip(starts, starts[1:])], [b"one", b"two", b"five"])

    def test_huggingface_tokenizer(self):
        try:
            from tokenizers import Tokenizer, models, pre_tokenizers, trainers
        except ImportError:
            self.skipTest("tokenizers not installed")
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.train_from_iterator(DOCS, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"]))
        path = os.path.join(self.dir, "tokenizer.json")
        tok.save(path)
        out = self.prepare("--tokenizer", path, "--val_fraction", "0")
        toks, starts, vocab = prepare_data.read_token_file(out + ".train.tok")
        eos = tok.token_to_id("</s>")
        self.assertEqual(vocab, tok.get_vocab_size())
        self.assertEqual(toks[starts[1] - 1], eos)
        self.assertEqual(toks[:starts[1] - 1], tok.encode(DOCS[0], add_special_tokens=False).ids)

    def test_sentencepiece_tokenizer(self):
        try:
            import sentencepiece as spm
        except ImportError:
            self.skipTest("sentencepiece not installed")
        prefix = os.path.join(self.dir, "sp")
        spm.SentencePieceTrainer.train(sentence_iterator=iter(DOCS * 5), model_prefix=prefix,
                                       vocab_size=50, minloglevel=2)
        out = self.prepare("--tokenizer", prefix + ".model", "--val_fraction", "0")
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
        toks, starts, vocab = prepare_data.read_token_file(out + ".train.tok")
        self.assertEqual(vocab, 50)
        self.assertEqual(toks[:starts[1]], sp.encode(DOCS[0]) + [sp.eos_id()])

    def test_lns_train_reads_the_documents_python_wrote(self):
        binary = os.environ.get("LNS_TRAIN_BIN")
        if not binary:
            self.skipTest("LNS_TRAIN_BIN not set (ctest sets it)")
        out = self.prepare("--val_fraction", "0")
        toks, starts, _ = prepare_data.read_token_file(out + ".train.tok")
        # The trainer also reads sharded output through its index.
        sharded = os.path.join(self.dir, "sharded_for_train")
        prepare_data.main(["--input", *self.make_inputs(), "--out", sharded, "--val_fraction", "0", "--shards",
                           "--workers", "1", "--no_progress"])
        r = subprocess.run([binary, "--vocab_size=257", "--hidden_size=16", "--intermediate_size=24",
                            "--num_layers=1", "--num_heads=2", "--num_kv_heads=1", "--seq_len=16",
                            "--micro_batch_size=4", "--global_batch_size=4", "--steps=2",
                            "--data=" + os.path.join(sharded, "train", "index.json")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        dump = os.path.join(self.dir, "dump.safetensors")
        subprocess.run([binary, "--vocab_size=257", "--hidden_size=16", "--intermediate_size=24",
                        "--num_layers=1", "--num_heads=2", "--num_kv_heads=1", "--seq_len=16",
                        "--micro_batch_size=4", "--global_batch_size=4", "--data=" + out + ".train.tok",
                        "--data_mode=document", "--dump_step_state=" + dump],
                       check=True, capture_output=True)
        t = read_safetensors(dump)
        shape, inputs = t["inputs"]
        _, targets = t["targets"]
        self.assertEqual(shape, [4, 16])
        for b in range(4):
            row, tgt = inputs[b * 16:(b + 1) * 16], targets[b * 16:(b + 1) * 16]
            n = sum(1 for x in tgt if x != -100)
            doc = next(toks[s:e] for s, e in zip(starts, starts[1:]) if toks[s:s + n + 1] == row[:n] + [tgt[n - 1]])
            self.assertEqual(row[:n], doc[:n])  # a document prefix, loss masked after its end
            self.assertEqual(tgt[:n], doc[1:n + 1])


class PrepareDataErrors(unittest.TestCase):
    """Every failure is one line "prepare_data: ..." with exit status 1, no traceback,
    and no partial output (.tmp) left behind."""

    TOOL = os.path.join(HERE, "..", "..", "tools", "prepare_data.py")

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="lns_prep_err_")
        self.good = os.path.join(self.dir, "good.txt")
        with open(self.good, "w") as f:
            f.write("\n\n".join(DOCS))

    def run_tool(self, *args):
        return subprocess.run([sys.executable, self.TOOL, "--no_progress", *args], capture_output=True, text=True,
                              timeout=120)

    def leftovers(self):
        return [os.path.join(r, n) for r, _, files in os.walk(self.dir) for n in files if ".tmp" in n]

    def assert_one_line(self, r, needle):
        self.assertEqual(r.returncode, 1, r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("prepare_data: "), r.stderr)
        self.assertIn(needle, lines[0])
        self.assertEqual(self.leftovers(), [])

    def test_each_failure_is_one_line_and_leaves_nothing(self):
        out = os.path.join(self.dir, "out")
        import gzip
        corrupt = os.path.join(self.dir, "corrupt.txt.gz")
        with open(corrupt, "wb") as f:
            f.write(b"\x00\x01 this is not gzip data at all " * 20)
        truncated = os.path.join(self.dir, "truncated.txt.gz")
        with gzip.open(truncated, "wt") as f:
            f.write("\n\n".join(DOCS * 50))
        with open(truncated, "rb") as f:
            data = f.read()
        with open(truncated, "wb") as f:
            f.write(data[:len(data) // 2])
        for shards in ([], ["--shards", "--workers", "2"]):
            r = self.run_tool("--input", self.good, corrupt, "--out", out, *shards)
            self.assert_one_line(r, corrupt + ": corrupt or truncated gzip file (BadGzipFile)")
            r = self.run_tool("--input", self.good, truncated, "--out", out, *shards)
            self.assert_one_line(r, truncated + ": corrupt or truncated gzip file (EOFError)")
        # Reading /proc/self/mem at offset 0 fails (EIO): an input that cannot be read.
        self.assert_one_line(self.run_tool("--input", "/proc/self/mem", "--out", out),
                             "/proc/self/mem: cannot read (Input/output error)")
        self.assert_one_line(self.run_tool("--input", self.dir, "--out", out), "--input %s: not a file" % self.dir)
        self.assert_one_line(self.run_tool("--input", self.good, "--out", out, "--shards", "--workers", "0"),
                             "--workers must be >= 1, got 0")
        for bad in ("1", "1.5", "-0.1", "nan"):
            self.assert_one_line(self.run_tool("--input", self.good, "--out", out, "--val_fraction", bad),
                                 "--val_fraction must be in [0, 1), got")
        empty = os.path.join(self.dir, "empty.txt")
        with open(empty, "w") as f:
            f.write("\n \n\t\n")
        for shards in ([], ["--shards", "--workers", "1"]):
            self.assert_one_line(self.run_tool("--input", empty, "--out", out, *shards), "no documents in " + empty)
        self.assertFalse(os.path.exists(out + ".train.tok"))
        self.assertFalse(os.path.exists(out))

    def test_bad_tokenizer_files(self):
        garbage = os.path.join(self.dir, "garbage")
        with open(garbage + ".json", "wb") as f:
            f.write(b"\x89PNG not a tokenizer")
        with open(garbage + ".model", "wb") as f:
            f.write(b"\x89PNG not a model")
        out = os.path.join(self.dir, "out")
        for ext, what, package in ((".json", "not a Hugging Face tokenizer.json", "tokenizers"),
                                   (".model", "not a SentencePiece model", "sentencepiece")):
            try:
                __import__(package)
            except ImportError:
                what = "needs the '%s' package" % package
            self.assert_one_line(self.run_tool("--input", self.good, "--out", out, "--tokenizer", garbage + ext),
                                 "--tokenizer=%s%s: %s" % (garbage, ext, what) if "needs" not in what else what)

    def test_binary_input_is_tokenized_with_a_warning(self):
        binary = os.path.join(self.dir, "blob.txt")
        with open(binary, "wb") as f:
            f.write(b"text then \xff\xfe\x80 bytes\n\nand \xc3( more\n")
        out = os.path.join(self.dir, "blob")
        r = self.run_tool("--input", binary, "--out", out, "--val_fraction", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("prepare_data: warning: %s: 4 byte(s) are not valid UTF-8 (each replaced by U+FFFD); "
                      "is it a text file?" % binary, r.stderr)
        toks, starts, _ = prepare_data.read_token_file(out + ".train.tok")
        self.assertEqual(bytes(toks[:starts[1] - 1]).decode("utf-8"), "text then \ufffd\ufffd\ufffd bytes\n")


class Progress(unittest.TestCase):
    """Issue 48: a bar on a terminal, plain lines when piped, nothing with --no_progress;
    durations as lns/core/progress.h writes them (tests/unit/test_progress.cpp holds the same table)."""

    TOOL = os.path.join(HERE, "..", "..", "tools", "prepare_data.py")

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="lns_prep_progress_")
        self.txt = os.path.join(self.dir, "big.txt")
        with open(self.txt, "w") as f:  # 2000 documents: every tenth of the bytes is reached
            f.write("\n\n".join("document %d with a few words in it" % i for i in range(2000)))

    def test_durations(self):
        cases = [(0, "0s"), (0.4, "0s"), (12.3, "12s"), (59.6, "1m00s"), (83, "1m23s"), (3599, "59m59s"),
                 (3600, "1h00m"), (7530, "2h05m"), (86399, "23h59m"), (3 * 86400 + 4 * 3600 + 59, "3d04h"),
                 (-1, "?"), (float("nan"), "?")]
        for seconds, text in cases:
            self.assertEqual(prepare_data.format_duration(seconds), text, seconds)

    def test_piped_output_is_plain_lines(self):
        r = subprocess.run([sys.executable, self.TOOL, "--input", self.txt, "--out", os.path.join(self.dir, "o")],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("\r", r.stderr)
        self.assertNotIn("\033", r.stderr)
        lines = r.stderr.splitlines()
        self.assertGreaterEqual(len(lines), 5, r.stderr)  # tenths (some share a read) and the end
        self.assertLessEqual(len(lines), 11, r.stderr)
        for line in lines:
            self.assertRegex(line, r"^prepare_data: +[0-9.]+% +\d+ docs +\d+ tokens .* s elapsed, ETA \S+$")
        self.assertIn("100.0%", lines[-1])
        quiet = subprocess.run([sys.executable, self.TOOL, "--input", self.txt, "--out",
                                os.path.join(self.dir, "q"), "--no_progress"], capture_output=True, text=True,
                               timeout=120)
        self.assertEqual(quiet.stderr, "")

    def test_terminal_gets_one_redrawn_line(self):
        import pty
        leader, follower = pty.openpty()
        try:
            r = subprocess.run([sys.executable, self.TOOL, "--input", self.txt, "--out", os.path.join(self.dir, "t")],
                               stdout=subprocess.PIPE, stderr=follower, timeout=120)
            os.close(follower)
            follower = -1
            err = b""
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the terminal's other end is closed and drained
                    break
                if not chunk:
                    break
                err += chunk
        finally:
            if follower >= 0:
                os.close(follower)
            os.close(leader)
        self.assertEqual(r.returncode, 0)
        text = err.decode()
        self.assertTrue(text.startswith("\r["), text)  # redrawn in place, never a new line per update
        self.assertEqual(text.count("\n"), 1, text)
        self.assertIn("100.0%", text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
