#!/usr/bin/env python3
"""Tokenize text or JSONL into lns token files (format: docs/data.md).

    python3 tools/prepare_data.py --input corpus.txt --out data/corpus
    python3 tools/prepare_data.py --input a.jsonl b.jsonl --tokenizer tokenizer.json --out data/c4
    python3 tools/prepare_data.py --input /usr/share/games/fortunes/* --doc_sep fortune --out data/fortunes

Writes OUT.train.tok, OUT.val.tok and OUT.json (tokenizer, vocabulary, counts).
Streams: memory stays flat however large the input. Tokenizers: 'byte' (default;
UTF-8 bytes 0..255 plus end-of-document 256, needs nothing), a Hugging Face
tokenizer.json (package `tokenizers`), or a SentencePiece .model (`sentencepiece`).
Each document ends with the end-of-document token, so packed sequences see the
boundary; the document index keeps exact boundaries for --data_mode=document.

Every failure (an unreadable or corrupt input, a bad tokenizer, a bad flag, an empty
corpus) is one line "prepare_data: ..." and exit status 1, and leaves no partial
output (.tmp) behind.
"""
import argparse
import codecs
import glob
import gzip
import json
import math
import multiprocessing
import os
import re
import struct
import sys
import time
import zlib

MAGIC = b"LNSTOKEN"
VERSION = 1
HEADER_BYTES = 64


class PrepareError(Exception):
    """A user-facing failure: printed as one line "prepare_data: <message>", exit 1."""


# Bytes of the current input file that were not valid UTF-8 (each replaced by U+FFFD).
_bad_utf8 = [0]


def _count_and_replace(err):
    _bad_utf8[0] += err.end - err.start
    return "\ufffd", err.end


codecs.register_error("prepare_data_count", _count_and_replace)


class ByteTokenizer:
    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    def __init__(self, path, eos_token):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise PrepareError("--tokenizer=%s needs the 'tokenizers' package (pip install tokenizers)" % path)
        try:
            self.tok = Tokenizer.from_file(path)
        except Exception as e:  # the library raises plain Exception for a bad file
            raise PrepareError("--tokenizer=%s: not a Hugging Face tokenizer.json (%s)" % (path, first_line(e)))
        self.name = os.path.abspath(path)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        candidates = [eos_token] if eos_token else ["</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>"]
        ids = [self.tok.token_to_id(t) for t in candidates]
        ids = [i for i in ids if i is not None]
        if not ids:
            raise PrepareError("%s: no end-of-document token among %s; name one with --eos_token" % (path, candidates))
        self.eos_id = ids[0]

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)


class SentencePieceTokenizer:
    def __init__(self, path):
        try:
            import sentencepiece as spm
        except ImportError:
            raise PrepareError("--tokenizer=%s needs the 'sentencepiece' package (pip install sentencepiece)" % path)
        try:
            self.sp = spm.SentencePieceProcessor(model_file=path)
        except Exception as e:
            raise PrepareError("--tokenizer=%s: not a SentencePiece model (%s)" % (path, first_line(e)))
        self.name = os.path.abspath(path)
        self.vocab_size = self.sp.get_piece_size()
        self.eos_id = self.sp.eos_id()
        if self.eos_id < 0:
            raise PrepareError("%s: the SentencePiece model has no end-of-sequence id" % path)

    def encode(self, text):
        return self.sp.encode(text)

    def decode(self, ids):
        return self.sp.decode(ids)


def first_line(e):
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def make_tokenizer(spec, eos_token):
    if spec == "byte":
        return ByteTokenizer()
    if not os.path.exists(spec):
        raise PrepareError("--tokenizer=%s: file not found (expected 'byte', a tokenizer.json or a .model)" % spec)
    if spec.endswith(".json"):
        return HFTokenizer(spec, eos_token)
    return SentencePieceTokenizer(spec)


class TokenFileWriter:
    """Writes one token file: placeholder header, tokens as they come, then the
    document index and the real header."""

    open_writers = set()  # writers whose .tmp exists: abort_all() removes them

    def __init__(self, path, token_bytes, vocab_size):
        self.path, self.tmp = path, path + ".tmp"
        self.f = open(self.tmp, "wb")
        TokenFileWriter.open_writers.add(self)
        self.f.write(b"\0" * HEADER_BYTES)
        self.fmt = "<%d" + ("H" if token_bytes == 2 else "I")
        self.token_bytes, self.vocab_size = token_bytes, vocab_size
        self.doc_starts = [0]
        self.n = 0

    def add_doc(self, ids):
        self.f.write(struct.pack(self.fmt % len(ids), *ids))
        self.n += len(ids)
        self.doc_starts.append(self.n)

    def close(self):
        pad = (-self.n * self.token_bytes) % 8
        self.f.write(b"\0" * pad)
        self.f.write(struct.pack("<%dq" % len(self.doc_starts), *self.doc_starts))
        self.f.seek(0)
        self.f.write(MAGIC + struct.pack("<IIQQQ", VERSION, self.token_bytes, self.n,
                                         len(self.doc_starts) - 1, self.vocab_size))
        self.f.close()
        os.replace(self.tmp, self.path)
        TokenFileWriter.open_writers.discard(self)

    def abort(self):
        """Closes and removes the temporary file: a failed run leaves no partial output."""
        try:
            self.f.close()
        except OSError:
            pass
        try:
            os.remove(self.tmp)
        except FileNotFoundError:
            pass
        TokenFileWriter.open_writers.discard(self)

    @classmethod
    def abort_all(cls):
        for w in list(cls.open_writers):
            w.abort()


def write_json(path, obj, **kw):
    """path, replaced atomically (a failure leaves the old file, or none, never half)."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, **kw)
    os.replace(path + ".tmp", path)


def read_token_file(path):
    """Returns (tokens, doc_starts, vocab_size); the reader the tests use."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != MAGIC:
        raise ValueError("%s: bad magic" % path)
    version, tb, n, docs, vocab = struct.unpack_from("<IIQQQ", data, 8)
    tokens = list(struct.unpack_from("<%d%s" % (n, "H" if tb == 2 else "I"), data, HEADER_BYTES))
    idx = HEADER_BYTES + n * tb
    idx += (-idx) % 8
    doc_starts = list(struct.unpack_from("<%dq" % (docs + 1), data, idx))
    return tokens, doc_starts, vocab


def open_text(path):
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="prepare_data_count")
    return open(path, "r", encoding="utf-8", errors="prepare_data_count")


def iter_file_documents(path, fmt, text_key, doc_sep, on_error, progress, bad, warn=True):
    """Yields (text, line) per document of one file, streaming line by line. A JSONL
    line that is not an object with a `text_key` string stops the run with file:line
    (on_error == "fatal") or is skipped and recorded in `bad`. An unreadable or corrupt
    file is a PrepareError; bytes that are not UTF-8 are replaced, with a warning."""
    _bad_utf8[0] = 0
    try:
        yield from _file_documents(path, fmt, text_key, doc_sep, on_error, progress, bad)
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise PrepareError("%s: corrupt or truncated gzip file (%s)" % (path, type(e).__name__))
    except UnicodeError as e:
        raise PrepareError("%s: cannot decode (%s)" % (path, type(e).__name__))
    except OSError as e:
        raise PrepareError("%s: cannot read (%s)" % (path, e.strerror or type(e).__name__))
    if warn and _bad_utf8[0]:
        sys.stderr.write("prepare_data: warning: %s: %d byte(s) are not valid UTF-8 (each replaced by U+FFFD); "
                         "is it a text file?\n" % (path, _bad_utf8[0]))


def _file_documents(path, fmt, text_key, doc_sep, on_error, progress, bad):
    plain = path[:-3] if path.endswith(".gz") else path
    is_jsonl = fmt == "jsonl" or (fmt == "auto" and (plain.endswith(".jsonl") or plain.endswith(".json")))
    with open_text(path) as f:
        if is_jsonl:
            for lineno, line in enumerate(f, 1):
                progress.advance(len(line))
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)[text_key]
                    if not isinstance(text, str):
                        raise TypeError("'%s' is %s" % (text_key, type(text).__name__))
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    where = "%s:%d: not a JSON object with a '%s' string (%s)" % (path, lineno, text_key, e)
                    if on_error == "fatal":
                        raise PrepareError(where + "; --on_error=skip to skip such lines")
                    bad.append(where)
                    continue
                yield text, lineno
            return
        if doc_sep == "file":
            text = f.read()
            progress.advance(len(text))
            if text.strip():
                yield text, 1
            return
        buf, start = [], 1
        for lineno, line in enumerate(f, 1):
            progress.advance(len(line))
            if doc_sep == "line":
                if line.strip():
                    yield line.rstrip("\n"), lineno
                continue
            boundary = (doc_sep == "blank" and not line.strip()) or (doc_sep == "fortune" and line.rstrip("\n") == "%")
            if boundary:
                if "".join(buf).strip():
                    yield "".join(buf), start
                buf, start = [], lineno + 1
            else:
                buf.append(line)
        if "".join(buf).strip():
            yield "".join(buf), start


def format_duration(seconds):
    """A duration for people, as lns/core/progress.h writes it: 42s, 1m23s, 2h05m, 3d04h."""
    if not (seconds >= 0 and math.isfinite(seconds)):
        return "?"
    s = int(math.floor(seconds + 0.5))
    if s < 60:
        return "%ds" % s
    if s < 3600:
        return "%dm%02ds" % (s // 60, s % 60)
    if s < 86400:
        return "%dh%02dm" % (s // 3600, s % 3600 // 60)
    return "%dd%02dh" % (s // 86400, s % 86400 // 3600)


class Progress:
    """Progress through the input bytes on stderr: a bar redrawn in place on a terminal,
    plain lines (one per tenth, and the end) when stderr is a pipe or a file, nothing
    with --no_progress. mode: "bar", "lines" or "off"."""

    def __init__(self, total_bytes, mode):
        self.total, self.done, self.mode = max(total_bytes, 1), 0, mode
        self.enabled = mode != "off"
        self.t0 = self.last = time.time()
        self.docs = self.tokens = 0
        self.tenth = 0

    def advance(self, nbytes):
        self.done += nbytes
        now = time.time()
        if self.mode == "bar" and now - self.last > 0.5:
            self.last = now
            self.show()
        elif self.mode == "lines" and 10 * self.done // self.total > self.tenth and self.done < self.total:
            self.tenth = 10 * self.done // self.total
            self.show()

    def text(self):
        frac = min(self.done / self.total, 1.0)
        elapsed = max(time.time() - self.t0, 1e-9)
        eta = format_duration((1 - frac) * elapsed / frac) if frac > 0 else "?"
        return "%5.1f%% %8d docs %10d tokens %6.1f MB/s | %.1f s elapsed, ETA %s" % (
            100 * frac, self.docs, self.tokens, self.done / elapsed / 1e6, elapsed, eta)

    def show(self, end=""):
        if self.mode == "bar":
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
            sys.stderr.write("\r[%s] %s\033[K%s" % (bar, self.text(), end))
        elif self.mode == "lines":
            sys.stderr.write("prepare_data: %s\n" % self.text())
        sys.stderr.flush()

    def finish(self):
        self.done = self.total
        self.show(end="\n")


def is_validation(doc_index, val_fraction):
    """Deterministic split: a document's hash, not its position, decides."""
    if val_fraction <= 0:
        return False
    return zlib.crc32(struct.pack("<Q", doc_index)) % 1000000 < val_fraction * 1000000


class Quiet:
    def advance(self, n):
        pass


def file_documents(path, args, progress, bad, warn=True):
    return iter_file_documents(path, args.format, args.text_key, args.doc_sep, args.on_error, progress, bad, warn)


def count_documents(job):
    """Pass 1 of sharded mode: documents per file (no tokenizing)."""
    path, args = job
    return sum(1 for _ in file_documents(path, args, Quiet(), [], warn=False))


_worker_tok = None


def _init_worker(spec, eos):
    global _worker_tok
    _worker_tok = make_tokenizer(spec, eos)


def shard_paths(out, i):
    name = "shard_%05d.tok" % i
    return (os.path.join(out, "train", name), os.path.join(out, "val", name),
            os.path.join(out, ".done", "shard_%05d.json" % i))


def input_stamp(path):
    st = os.stat(path)
    return {"input": os.path.abspath(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def make_shard(job):
    """Pass 2: tokenize one input file into its train and validation shards. The
    document index `offset` of its first document keeps the split identical to the
    single-file run. Written under .tmp names and renamed, then marked done."""
    i, path, offset, args = job
    tok = _worker_tok
    token_bytes = 2 if tok.vocab_size <= 65536 else 4
    train_path, val_path, done = shard_paths(args.out, i)
    train = TokenFileWriter(train_path, token_bytes, tok.vocab_size)
    val = TokenFileWriter(val_path, token_bytes, tok.vocab_size)
    bad = []
    k = offset
    try:
        for text, _ in file_documents(path, args, Quiet(), bad):
            ids = tok.encode(text) + [tok.eos_id]
            (val if is_validation(k, args.val_fraction) else train).add_doc(ids)
            k += 1
        train.close()
        val.close()
    except BaseException:
        TokenFileWriter.abort_all()
        raise
    rec = dict(input_stamp(path), offset=offset, documents=k - offset,
               train={"tokens": train.n, "documents": len(train.doc_starts) - 1},
               val={"tokens": val.n, "documents": len(val.doc_starts) - 1}, bad_lines=bad)
    write_json(done, rec)
    return i, rec


def is_done(i, path, offset, args):
    train_path, val_path, done = shard_paths(args.out, i)
    if not (os.path.exists(done) and os.path.exists(train_path) and os.path.exists(val_path)):
        return None
    try:
        with open(done) as f:
            rec = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    stamp = input_stamp(path)
    if any(rec.get(k) != v for k, v in stamp.items()) or rec.get("offset") != offset:
        return None
    return rec


def run_sharded(paths, args, tok):
    """One shard per input file under OUT/{train,val}/, in parallel over --workers,
    resumable: a shard whose done-marker matches its input is not redone."""
    t0 = time.time()
    with multiprocessing.Pool(args.workers) as pool:
        counts = pool.map(count_documents, [(p, args) for p in paths])
    if sum(counts) == 0:
        raise PrepareError("no documents in %s (empty, or only whitespace)" % ", ".join(paths))
    for sub in ("train", "val", ".done"):
        os.makedirs(os.path.join(args.out, sub), exist_ok=True)
    offsets = [sum(counts[:i]) for i in range(len(paths))]
    records = {}
    todo = []
    for i, p in enumerate(paths):
        rec = is_done(i, p, offsets[i], args)
        if rec is None:
            todo.append((i, p, offsets[i], args))
        else:
            records[i] = rec
    if records:
        print("prepare_data: resuming: %d of %d shards already done" % (len(records), len(paths)))
    total_bytes = sum(os.path.getsize(t[1]) for t in todo)
    done_bytes, done_tokens = 0, 0
    with multiprocessing.Pool(args.workers, initializer=_init_worker, initargs=(args.tokenizer, args.eos_token)) as pool:
        for i, rec in pool.imap_unordered(make_shard, todo):
            records[i] = rec
            done_bytes += os.path.getsize(paths[i])
            done_tokens += rec["train"]["tokens"] + rec["val"]["tokens"]
            dt = max(time.time() - t0, 1e-9)
            if not args.no_progress:
                print("prepare_data: [%d/%d] %s: %d documents, %d tokens | %.1f MB/s, %.0f tokens/s" % (
                    len(records), len(paths), paths[i], rec["documents"], rec["train"]["tokens"] + rec["val"]["tokens"],
                    done_bytes / dt / 1e6, done_tokens / dt), flush=True)
    bad = [b for i in sorted(records) for b in records[i]["bad_lines"]]
    for split in ("train", "val"):
        shards = [{"file": "shard_%05d.tok" % i, "tokens": records[i][split]["tokens"],
                   "documents": records[i][split]["documents"], "input": records[i]["input"]}
                  for i in range(len(paths))]
        write_json(os.path.join(args.out, split, "index.json"),
                   {"shards": shards, "tokens": sum(s["tokens"] for s in shards),
                    "documents": sum(s["documents"] for s in shards), "vocab_size": tok.vocab_size}, indent=1)
    manifest = {"tokenizer": tok.name, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id,
                "inputs": [os.path.abspath(p) for p in paths], "shards": len(paths),
                "train": {"index": os.path.abspath(os.path.join(args.out, "train", "index.json"))},
                "val": {"index": os.path.abspath(os.path.join(args.out, "val", "index.json"))},
                "skipped_lines": bad}
    write_json(os.path.join(args.out, "manifest.json"), manifest, indent=2)
    report_bad(bad)
    print("prepare_data: %d shards, %d documents -> %s/{train,val}/index.json (use as --data)" % (
        len(paths), sum(counts), args.out))


def report_bad(bad):
    if bad:
        sys.stderr.write("prepare_data: skipped %d bad line(s), first: %s\n" % (len(bad), "; ".join(bad[:3])))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", nargs="+", required=True, help="text, JSONL or .gz files")
    ap.add_argument("--out", required=True,
                    help="output prefix (OUT.train.tok, OUT.val.tok, OUT.json), or with --shards a directory")
    ap.add_argument("--tokenizer", default="byte", help="'byte', a HF tokenizer.json, or a SentencePiece .model")
    ap.add_argument("--eos_token", default="", help="end-of-document token (HF tokenizers)")
    ap.add_argument("--format", choices=["auto", "text", "jsonl"], default="auto")
    ap.add_argument("--text_key", default="text", help="JSONL field holding the text")
    ap.add_argument("--doc_sep", choices=["blank", "line", "fortune", "file"], default="blank",
                    help="plain text: documents end at a blank line, every line, a '%%' line, or the file's end")
    ap.add_argument("--val_fraction", type=float, default=0.01, help="share of documents for validation")
    ap.add_argument("--on_error", choices=["fatal", "skip"], default="fatal",
                    help="a JSONL line that is not an object with the text: stop (file:line) or skip it")
    ap.add_argument("--shards", action="store_true",
                    help="one shard per input file under OUT/{train,val}/ with an index.json; parallel and resumable")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 1)),
                    help="processes for --shards")
    ap.add_argument("--no_progress", action="store_true")
    args = ap.parse_args(argv)
    if args.workers < 1:
        raise PrepareError("--workers must be >= 1, got %d" % args.workers)
    if not (math.isfinite(args.val_fraction) and 0 <= args.val_fraction < 1):
        raise PrepareError("--val_fraction must be in [0, 1), got %s" % args.val_fraction)
    return args


def run(argv):
    args = parse_args(argv)

    paths = []
    for p in args.input:
        if not os.path.isfile(p):
            raise PrepareError("--input %s: not a file" % p)
        if not os.access(p, os.R_OK):
            raise PrepareError("--input %s: not readable (permission denied)" % p)
        paths.append(p)
    tok = make_tokenizer(args.tokenizer, args.eos_token)
    if args.shards:
        run_sharded(paths, args, tok)
        return
    token_bytes = 2 if tok.vocab_size <= 65536 else 4
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    train = TokenFileWriter(args.out + ".train.tok", token_bytes, tok.vocab_size)
    val = TokenFileWriter(args.out + ".val.tok", token_bytes, tok.vocab_size)
    progress = Progress(sum(os.path.getsize(p) for p in paths),
                        "off" if args.no_progress else "bar" if sys.stderr.isatty() else "lines")
    bad = []
    i = 0
    for path in paths:
        for text, _ in file_documents(path, args, progress, bad):
            ids = tok.encode(text) + [tok.eos_id]
            (val if is_validation(i, args.val_fraction) else train).add_doc(ids)
            progress.docs += 1
            progress.tokens += len(ids)
            i += 1
    if i == 0:
        raise PrepareError("no documents in %s (empty, or only whitespace)" % ", ".join(paths))
    train.close()
    val.close()
    progress.finish()
    manifest = {
        "tokenizer": tok.name, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id,
        "token_bytes": token_bytes, "inputs": [os.path.abspath(p) for p in paths],
        "train": {"path": os.path.abspath(train.path), "tokens": train.n, "documents": len(train.doc_starts) - 1},
        "val": {"path": os.path.abspath(val.path), "tokens": val.n, "documents": len(val.doc_starts) - 1},
        "skipped_lines": bad,
    }
    write_json(args.out + ".json", manifest, indent=2)
    report_bad(bad)
    print("prepare_data: %d documents, %d train tokens, %d validation tokens, vocabulary %d -> %s.{train,val}.tok"
          % (progress.docs, train.n, val.n, tok.vocab_size, args.out))


def remove_partial_shards(argv):
    """After a failed --shards run: the temporary files its workers left (killed when
    the pool stopped). Only names this script writes, in its own output directory."""
    try:
        out = parse_args(argv).out
    except (PrepareError, SystemExit):
        return
    for pattern in ("train/shard_*.tok.tmp", "val/shard_*.tok.tmp", ".done/shard_*.json.tmp", "*/index.json.tmp",
                    "manifest.json.tmp"):
        for p in glob.glob(os.path.join(glob.escape(out), pattern)):
            os.remove(p)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        run(argv)
    except (PrepareError, OSError, KeyboardInterrupt) as e:
        TokenFileWriter.abort_all()
        remove_partial_shards(argv)
        if isinstance(e, KeyboardInterrupt):
            sys.exit("prepare_data: interrupted")
        if isinstance(e, OSError):  # writing the output: a full disk, a read-only directory
            sys.exit("prepare_data: %s%s" % (e.strerror or type(e).__name__, ": %s" % e.filename if e.filename else ""))
        sys.exit("prepare_data: " + str(e))


if __name__ == "__main__":
    main()
