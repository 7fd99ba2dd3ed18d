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
"""
import argparse
import json
import os
import re
import struct
import sys
import time
import zlib

MAGIC = b"LNSTOKEN"
VERSION = 1
HEADER_BYTES = 64


class ByteTokenizer:
    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text):
        return list(text.encode("utf-8"))


class HFTokenizer:
    def __init__(self, path, eos_token):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            sys.exit("prepare_data: --tokenizer=%s needs the 'tokenizers' package (pip install tokenizers)" % path)
        self.tok = Tokenizer.from_file(path)
        self.name = os.path.abspath(path)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        candidates = [eos_token] if eos_token else ["</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>"]
        ids = [self.tok.token_to_id(t) for t in candidates]
        ids = [i for i in ids if i is not None]
        if not ids:
            sys.exit("prepare_data: %s: no end-of-document token among %s; name one with --eos_token" % (path, candidates))
        self.eos_id = ids[0]

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids


class SentencePieceTokenizer:
    def __init__(self, path):
        try:
            import sentencepiece as spm
        except ImportError:
            sys.exit("prepare_data: --tokenizer=%s needs the 'sentencepiece' package (pip install sentencepiece)" % path)
        self.sp = spm.SentencePieceProcessor(model_file=path)
        self.name = os.path.abspath(path)
        self.vocab_size = self.sp.get_piece_size()
        self.eos_id = self.sp.eos_id()
        if self.eos_id < 0:
            sys.exit("prepare_data: %s: the SentencePiece model has no end-of-sequence id" % path)

    def encode(self, text):
        return self.sp.encode(text)


def make_tokenizer(spec, eos_token):
    if spec == "byte":
        return ByteTokenizer()
    if not os.path.exists(spec):
        sys.exit("prepare_data: --tokenizer=%s: file not found (expected 'byte', a tokenizer.json or a .model)" % spec)
    if spec.endswith(".json"):
        return HFTokenizer(spec, eos_token)
    return SentencePieceTokenizer(spec)


class TokenFileWriter:
    """Writes one token file: placeholder header, tokens as they come, then the
    document index and the real header."""

    def __init__(self, path, token_bytes, vocab_size):
        self.path, self.tmp = path, path + ".tmp"
        self.f = open(self.tmp, "wb")
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


def iter_documents(paths, fmt, text_key, doc_sep, progress):
    """Yields (text, source, line) per document, streaming line by line."""
    for path in paths:
        is_jsonl = fmt == "jsonl" or (fmt == "auto" and (path.endswith(".jsonl") or path.endswith(".json")))
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            if is_jsonl:
                for lineno, line in enumerate(f, 1):
                    progress.advance(len(line.encode("utf-8")))
                    if not line.strip():
                        continue
                    try:
                        yield json.loads(line)[text_key], path, lineno
                    except (json.JSONDecodeError, KeyError, TypeError) as e:
                        sys.exit("prepare_data: %s:%d: not a JSON object with a '%s' string (%s)" % (path, lineno, text_key, e))
                continue
            buf, start = [], 1
            for lineno, line in enumerate(f, 1):
                progress.advance(len(line.encode("utf-8")))
                boundary = ((doc_sep == "blank" and not line.strip()) or
                            (doc_sep == "fortune" and line.rstrip("\n") == "%") or doc_sep == "line")
                if doc_sep == "line":
                    if line.strip():
                        yield line.rstrip("\n"), path, lineno
                    continue
                if boundary:
                    if "".join(buf).strip():
                        yield "".join(buf), path, start
                    buf, start = [], lineno + 1
                else:
                    buf.append(line)
            if "".join(buf).strip():
                yield "".join(buf), path, start


class Progress:
    def __init__(self, total_bytes, enabled):
        self.total, self.done, self.enabled = max(total_bytes, 1), 0, enabled
        self.t0 = self.last = time.time()
        self.docs = self.tokens = 0

    def advance(self, nbytes):
        self.done += nbytes
        now = time.time()
        if self.enabled and now - self.last > 0.5:
            self.last = now
            self.show()

    def show(self, end=""):
        frac = min(self.done / self.total, 1.0)
        rate = self.done / max(time.time() - self.t0, 1e-9) / 1e6
        bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
        sys.stderr.write("\r[%s] %5.1f%% %8d docs %10d tokens %6.1f MB/s%s" %
                         (bar, 100 * frac, self.docs, self.tokens, rate, end))
        sys.stderr.flush()


def is_validation(doc_index, val_fraction):
    """Deterministic split: a document's hash, not its position, decides."""
    if val_fraction <= 0:
        return False
    return zlib.crc32(struct.pack("<Q", doc_index)) % 1000000 < val_fraction * 1000000


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", nargs="+", required=True, help="text or JSONL files")
    ap.add_argument("--out", required=True, help="output prefix: OUT.train.tok, OUT.val.tok, OUT.json")
    ap.add_argument("--tokenizer", default="byte", help="'byte', a HF tokenizer.json, or a SentencePiece .model")
    ap.add_argument("--eos_token", default="", help="end-of-document token (HF tokenizers)")
    ap.add_argument("--format", choices=["auto", "text", "jsonl"], default="auto")
    ap.add_argument("--text_key", default="text", help="JSONL field holding the text")
    ap.add_argument("--doc_sep", choices=["blank", "line", "fortune", "file"], default="blank",
                    help="plain text: documents end at a blank line, every line, a '%%' line, or the file's end")
    ap.add_argument("--val_fraction", type=float, default=0.01, help="share of documents for validation")
    ap.add_argument("--no_progress", action="store_true")
    args = ap.parse_args(argv)

    paths = []
    for p in args.input:
        if not os.path.isfile(p):
            sys.exit("prepare_data: --input %s: not a file" % p)
        paths.append(p)
    tok = make_tokenizer(args.tokenizer, args.eos_token)
    token_bytes = 2 if tok.vocab_size <= 65536 else 4
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    train = TokenFileWriter(args.out + ".train.tok", token_bytes, tok.vocab_size)
    val = TokenFileWriter(args.out + ".val.tok", token_bytes, tok.vocab_size)
    progress = Progress(sum(os.path.getsize(p) for p in paths), not args.no_progress and sys.stderr.isatty())
    sep = "blank" if args.doc_sep == "file" else args.doc_sep
    docs = iter_documents(paths, args.format, args.text_key, sep, progress)
    if args.doc_sep == "file":
        docs = ((open(p, encoding="utf-8", errors="replace").read(), p, 1) for p in paths)
    for i, (text, _, _) in enumerate(docs):
        ids = tok.encode(text) + [tok.eos_id]
        (val if is_validation(i, args.val_fraction) else train).add_doc(ids)
        progress.docs += 1
        progress.tokens += len(ids)
    train.close()
    val.close()
    if progress.enabled:
        progress.show(end="\n")
    manifest = {
        "tokenizer": tok.name, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id,
        "token_bytes": token_bytes, "inputs": [os.path.abspath(p) for p in paths],
        "train": {"path": os.path.abspath(train.path), "tokens": train.n, "documents": len(train.doc_starts) - 1},
        "val": {"path": os.path.abspath(val.path), "tokens": val.n, "documents": len(val.doc_starts) - 1},
    }
    with open(args.out + ".json", "w") as f:
        json.dump(manifest, f, indent=2)
    print("prepare_data: %d documents, %d train tokens, %d validation tokens, vocabulary %d -> %s.{train,val}.tok"
          % (progress.docs, train.n, val.n, tok.vocab_size, args.out))


if __name__ == "__main__":
    main()
