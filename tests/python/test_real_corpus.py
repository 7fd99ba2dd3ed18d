#!/usr/bin/env python3
"""tools/experiments/real_corpus.py on a miniature: a Debian package and a wheel built
here (no network: --offline), holding each format the builder reads, with planted
duplicates, boilerplate, navigation, a short and a non-English document. The counts in
the record are checked against what was planted, the token files against the record,
and bad input is one clear line.
"""
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TOOL = os.path.join(ROOT, "tools", "experiments", "real_corpus.py")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import kept_folder  # noqa: E402  (a failed test keeps its folder and shows its runs' logs)
sys.path.insert(0, os.path.dirname(TOOL))
import real_corpus  # noqa: E402
try:
    import tokenizers  # noqa: F401
    HAVE_TOKENIZERS = True
except ImportError:
    HAVE_TOKENIZERS = False

BOILER = ("This page is part of the miniature manual, and this sentence is long enough to be a paragraph "
          "that the deduplication keeps only once.")


def sentence(i):
    words = ["alpha", "river", "stone", "lantern", "harbour", "copper", "meadow", "signal", "orchard", "window"]
    return " ".join(words[(i * 7 + k) % 10] for k in range(12)).capitalize() + ". "


def prose(seed, n=12):
    return "".join(sentence(seed * 31 + i) for i in range(n))


def html_page(seed):
    return ("<html><head><title>TITLE-TEXT</title><script>var SCRIPT_TEXT = 1;</script></head><body>"
            "<div class=\"navheader\"><a>NAV-TEXT Prev</a><div>inner NAV-TEXT</div></div>"
            "<h1>Chapter %d</h1><p>%s</p><p>%s</p>"
            "<div class=\"navfooter\">FOOTER-TEXT</div></body></html>" % (seed, prose(seed), BOILER))


def b64(n):
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    s = ""
    while True:
        s = alphabet[n % 64] + s
        n //= 64
        if n == 0:
            return s


def make_deb(root, out_dir):
    """lns-fake-docs_1.2-3_all.deb with every format the builder reads."""
    pkg = os.path.join(root, "debroot")
    doc = os.path.join(pkg, "usr/share/doc/lns-fake-docs")
    for d in ("html", "txt", "pod"):
        os.makedirs(os.path.join(doc, d))
    os.makedirs(os.path.join(pkg, "DEBIAN"))
    with open(os.path.join(pkg, "DEBIAN/control"), "w") as f:
        f.write("Package: lns-fake-docs\nVersion: 1.2-3\nArchitecture: all\nMaintainer: t <t@t>\n"
                "Description: test\n test\n")
    with open(os.path.join(doc, "copyright"), "w") as f:
        f.write("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
                "Files: *\nCopyright: nobody\nLicense: CC0-1.0\n")
    for i in (1, 2):  # two pages sharing the boilerplate paragraph
        with open(os.path.join(doc, "html/page%d.html" % i), "w") as f:
            f.write(html_page(i))
    text = prose(3, 20)
    with gzip.open(os.path.join(doc, "txt/c.txt.gz"), "wt") as f:
        f.write(text)
    with open(os.path.join(doc, "txt/d.txt"), "w") as f:  # the same document again, spaced differently
        f.write(text.replace(". ", ".  \n"))
    with open(os.path.join(doc, "txt/short.txt"), "w") as f:
        f.write("Too short.\n")
    with open(os.path.join(doc, "txt/russian.txt"), "w") as f:
        f.write("Это документ на другом языке, и он достаточно длинный, чтобы не быть коротким. " * 5)
    with open(os.path.join(doc, "pod/guide.pod"), "w") as f:
        f.write("=head1 NAME\n\nguide - a B<bold> guide with C<code> and L<perlfunc/open>\n\n=cut\n\n" + prose(4) + "\n")
    # a dictd database: the database's own entry, two headwords of one entry, one more
    entries = [prose(5, 6), prose(6, 6)]
    blob = "".join(entries).encode()
    info = b"00-database-info: not a dictionary entry at all, left out by the builder " * 4
    data = info + blob
    os.makedirs(os.path.join(pkg, "usr/share/dictd"))
    with gzip.open(os.path.join(pkg, "usr/share/dictd/fake.dict.dz"), "wb") as f:
        f.write(data)
    e0, e1 = len(info), len(info) + len(entries[0].encode())
    with open(os.path.join(pkg, "usr/share/dictd/fake.index"), "w") as f:
        f.write("00-database-info\t%s\t%s\n" % (b64(0), b64(len(info))))
        f.write("word\t%s\t%s\n" % (b64(e0), b64(len(entries[0].encode()))))
        f.write("words\t%s\t%s\n" % (b64(e0), b64(len(entries[0].encode()))))  # a duplicate entry
        f.write("other\t%s\t%s\n" % (b64(e1), b64(len(entries[1].encode()))))
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-b", pkg,
                    os.path.join(out_dir, "lns-fake-docs_1.2-3_all.deb")], check=True, capture_output=True)


def make_wheel(out_dir):
    with zipfile.ZipFile(os.path.join(out_dir, "lnsfake-1.0-py3-none-any.whl"), "w") as z:
        z.writestr("lnsfake-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: lnsfake\nVersion: 1.0\nLicense: MIT\n")
        z.writestr("lnsfake/book.txt", prose(7, 30))


SOURCES = {"sources": [
    {"name": "html", "package": "lns-fake-docs", "manager": "deb", "format": "html",
     "include": ["usr/share/doc/lns-fake-docs/html/*.html"], "licence": "CC0-1.0"},
    {"name": "text", "package": "lns-fake-docs", "manager": "deb", "format": "text",
     "include": ["usr/share/doc/lns-fake-docs/txt/*"], "licence": "CC0-1.0"},
    {"name": "pod", "package": "lns-fake-docs", "manager": "deb", "format": "pod",
     "include": ["usr/share/doc/lns-fake-docs/pod/*.pod"], "licence": "CC0-1.0"},
    {"name": "dict", "package": "lns-fake-docs", "manager": "deb", "format": "dictd",
     "include": ["usr/share/dictd/fake.dict.dz"], "licence": "CC0-1.0"},
    {"name": "book", "package": "lnsfake", "manager": "pypi", "format": "text",
     "include": ["lnsfake/*.txt"], "licence": "MIT"},
]}


def load(path):
    with open(path) as f:
        return json.load(f)


def read(path):
    with open(path) as f:
        return f.read()


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


@unittest.skipUnless(HAVE_TOKENIZERS and shutil.which("dpkg-deb"), "needs the tokenizers package and dpkg-deb")
class RealCorpus(kept_folder.KeptFolderTest):
    def setUp(self):
        self.dir = self.work
        self.cache = os.path.join(self.dir, "cache")
        os.makedirs(os.path.join(self.cache, "pkg"))
        make_deb(self.dir, os.path.join(self.cache, "pkg"))
        make_wheel(os.path.join(self.cache, "pkg"))
        self.sources = os.path.join(self.dir, "sources.json")
        self.write_sources(SOURCES)
        self.out = os.path.join(self.dir, "out", "mini")

    def write_sources(self, obj):
        with open(self.sources, "w") as f:
            json.dump(obj, f)

    def build(self, *extra):
        return run("--sources", self.sources, "--cache", self.cache, "--offline", "--out", self.out, "--vocab", "300",
                   "--val_fraction", "0.3", "--min_chars", "100", *extra)

    def test_builds_the_planted_corpus(self):
        doc = os.path.join(self.dir, "data.md")
        with open(doc, "w") as f:
            f.write("# D\n<!-- real_corpus:begin -->\nold\n<!-- real_corpus:end -->\nend\n")
        r = self.build("--doc", doc)
        self.assertEqual(r.returncode, 0, r.stderr)
        rec = load(self.out + ".sources.json")
        by = {s["name"]: s for s in rec["sources"]}
        # html: two pages, navigation/script/title gone, the shared paragraph kept once
        self.assertEqual((by["html"]["files"], by["html"]["docs"], by["html"]["dup_paras"]), (2, 2, 1))
        # text: c.txt.gz kept, d.txt its duplicate, short.txt too short, russian.txt not English
        self.assertEqual((by["text"]["files"], by["text"]["docs"], by["text"]["dup_docs"], by["text"]["short"],
                          by["text"]["not_english"]), (4, 1, 1, 1, 1))
        self.assertEqual(by["pod"]["docs"], 1)
        self.assertEqual((by["dict"]["docs"], by["dict"]["dup_docs"]), (2, 1))  # 00-database-info left out
        self.assertEqual(by["book"]["docs"], 1)
        self.assertEqual(by["text"]["version"], "1.2-3")
        self.assertEqual(by["text"]["copyright_says"], ["CC0-1.0"])
        self.assertEqual(by["book"]["copyright_says"], ["MIT"])
        docs = [json.loads(line) for line in read(self.out + ".docs.jsonl").splitlines()]
        self.assertEqual(len(docs), rec["totals"]["docs"])
        self.assertEqual(len(docs), 7)
        text = "\n".join(d["text"] for d in docs)
        for gone in ("NAV-TEXT", "FOOTER-TEXT", "SCRIPT_TEXT", "TITLE-TEXT", "00-database-info", "=head1", "B<"):
            self.assertNotIn(gone, text)
        self.assertEqual(text.count(BOILER), 1)
        self.assertIn("a bold guide with code and perlfunc/open", text)
        # token files: the record's counts are what prepare_data wrote, split by document
        meta = load(self.out + ".json")
        t = rec["totals"]
        self.assertEqual((t["train_tokens"], t["val_tokens"]), (meta["train"]["tokens"], meta["val"]["tokens"]))
        self.assertEqual(t["val_docs"], meta["val"]["documents"])
        self.assertGreater(t["val_docs"], 0)
        self.assertLess(t["val_docs"], t["docs"])
        self.assertEqual(meta["vocab_size"], 300)
        # the table in the doc
        page = read(doc)
        self.assertIn("| html (`lns-fake-docs`) | deb | 1.2-3 | CC0-1.0 | 2 | 2 |", page)
        self.assertIn("| **total** | | | | 9 | 7 |", page)
        self.assertNotIn("\nold\n", page)
        # a second run finds everything in place
        r = self.build()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("present", r.stdout)

    def test_checksums_are_checked_by_a_rebuild(self):
        import hashlib
        r = self.build()
        self.assertEqual(r.returncode, 0, r.stderr)
        rec_path = self.out + ".sources.json"
        rec = load(rec_path)
        deb = os.path.join(self.cache, "pkg", "lns-fake-docs_1.2-3_all.deb")
        by = {s["name"]: s for s in rec["sources"]}
        with open(deb, "rb") as f:
            self.assertEqual(by["text"]["package_sha256"], hashlib.sha256(f.read()).hexdigest())
        self.assertEqual(by["text"]["package_file"], "lns-fake-docs_1.2-3_all.deb")
        self.assertEqual([x["path"] for x in by["text"]["licence_files"]], ["usr/share/doc/lns-fake-docs/copyright"])
        with open(self.out + ".val.tok", "rb") as f:
            self.assertEqual(rec["outputs_sha256"][".val.tok"], hashlib.sha256(f.read()).hexdigest())
        self.assertEqual(sorted(rec["outputs_sha256"]), [".docs.jsonl", ".tokenizer.json", ".train.tok", ".val.tok"])
        # a rebuild from the same packages, elsewhere, has the same bytes
        self.out = os.path.join(self.dir, "again", "mini")
        r = self.build("--check", rec_path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("every package, used file and output has the recorded sha256", r.stdout)
        # a package whose text changed: named in one line
        with gzip.open(os.path.join(self.dir, "debroot/usr/share/doc/lns-fake-docs/txt/c.txt.gz"), "at") as f:
            f.write("\n\nOne more paragraph that was not there when the record was written, long enough.\n")
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-b", os.path.join(self.dir, "debroot"), deb],
                       check=True, capture_output=True)
        shutil.rmtree(os.path.join(self.cache, "x"))
        self.out = os.path.join(self.dir, "third", "mini")
        r = self.build("--check", rec_path)
        self.assertEqual(r.returncode, 1)
        last = r.stderr.strip().splitlines()[-1]  # after the per-source progress lines: one error line
        self.assertTrue(last.startswith("real_corpus: --check=%s: source html: package_sha256 differs" % rec_path),
                        r.stderr)  # the first source of that package

    def test_bad_input_is_one_line(self):
        bad = dict(SOURCES)
        bad["sources"] = [dict(SOURCES["sources"][0], format="pdf")]
        self.write_sources(bad)
        r = self.build()
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.strip().count("\n"), 0, r.stderr)
        self.assertIn("source 1 (html): format 'pdf': expected one of text, html, pod, dictd, wordnet", r.stderr)
        missing = {"sources": [dict(SOURCES["sources"][0], package="not-there")]}
        self.write_sources(missing)
        r = self.build()
        self.assertEqual(r.returncode, 1)
        self.assertIn("html: no package file not-there_*.deb in", r.stderr)
        self.assertIn("(--offline)", r.stderr)
        # a slice names sources of the list
        self.write_sources(SOURCES)
        r = self.build("--only", "html,nowhere")
        self.assertEqual((r.returncode, r.stderr.strip().count("\n")), (1, 0), r.stderr)
        self.assertIn("--only=html,nowhere: nowhere not in", r.stderr)
        # an index entry pointing past the end of its database
        with open(os.path.join(self.dir, "debroot/usr/share/dictd/fake.index"), "a") as f:
            f.write("past\t%s\t%s\n" % (b64(10 ** 6), b64(10)))
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-b", os.path.join(self.dir, "debroot"),
                        os.path.join(self.cache, "pkg", "lns-fake-docs_1.2-3_all.deb")], check=True,
                       capture_output=True)
        self.write_sources({"sources": [SOURCES["sources"][3]]})
        r = self.build()
        self.assertEqual(r.returncode, 1)
        self.assertRegex(r.stderr, r"fake\.index:5: entry past outside the [0-9]+-byte database")


class ProseLicences(unittest.TestCase):
    """A copyright file without DEP-5 'License:' fields: the licences its prose states, with
    their lines; a machine-readable file is left to copyright_licences."""

    def test_found_with_their_lines(self):
        with tempfile.TemporaryDirectory() as t:
            d = os.path.join(t, "usr/share/doc/dict-x")
            os.makedirs(d)
            with open(os.path.join(d, "copyright"), "w") as f:
                f.write("This is the Debian prepackaged version of X.\n\n"        # 1-2
                        "X is free software; you can redistribute it under the\n"  # 3
                        "terms of the GNU General Public License as published by\n"
                        "the Free Software Foundation; either version 2, or (at your\n"
                        "option) any later version.\n\n"                           # 6-7
                        "The tools:\n"                                             # 8
                        " * under the terms of the GNU General Public License; either\n"
                        " * version 1, or (at your option) any\n"
                        " * later version.\n"                                      # 11
                        "The index is under the GNU Free Documentation License, Version\n"
                        "1.1 or any later version published by the FSF. Y is in the public domain.\n")
            self.assertEqual(real_corpus.prose_licences(t), [
                dict(licence="GPL-2+", file="usr/share/doc/dict-x/copyright", line=4),
                dict(licence="GPL-1+", file="usr/share/doc/dict-x/copyright", line=9),
                dict(licence="GFDL-1.1+", file="usr/share/doc/dict-x/copyright", line=12),
                dict(licence="public-domain", file="usr/share/doc/dict-x/copyright", line=13)])
            with open(os.path.join(d, "copyright"), "w") as f:
                f.write("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
                        "Files: *\nLicense: GPL-2+\n This program is under the GNU General Public License, version 2"
                        " or (at your option) any later version.\n")
            self.assertEqual(real_corpus.prose_licences(t), [])


if __name__ == "__main__":
    unittest.main()
