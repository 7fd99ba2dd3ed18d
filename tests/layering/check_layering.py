#!/usr/bin/env python3
"""The dependency direction of docs/architecture.md, enforced.

Every source file belongs to a layer; a file may include headers of its own layer
and of the layers below it, never above. The layers, lowest first:

  core < parallel < data < model < optim < checkpoint < train < apps

The backends (src/cpu, src/cuda) sit beside them, above core: they include core only
and register into it (lns/core/op_table.h, lns/core/backend.h), and only the programs (apps)
include them. CMake links each layer as its own library, so an upward call also fails
to link (CMakeLists.txt, lns_link_<layer>); this check covers what a linker cannot
see, an include of a header whose code is inline.

A file's layer comes from the first matching rule of LAYERS (paths relative to the
repository root): the folders are the layers (src/<layer>/, include/lns/<layer>/), so a
new module needs no edit here.

  check_layering.py [ROOT]     exit 1 and one line per violation
  check_layering.py --self-test  shows the check firing on a deliberately bad tree
"""
import os
import re
import sys
import tempfile

LAYER_ORDER = ["core", "parallel", "data", "model", "optim", "checkpoint", "train", "apps"]
BACKEND = "backend"

# (path prefix or exact path, layer); first match wins. The folders are the layers:
# each layer's sources in src/<layer>/ (parallel/ at the top, as the product's layout
# fixes it), its public headers in include/lns/<layer>/; the programs in src/apps/.
LAYERS = [
    ("src/apps/", "apps"),
    ("tools/", "apps"),
    ("src/core/", "core"),
    ("include/lns/core/", "core"),
    ("src/cpu/", BACKEND),
    ("src/cuda/", BACKEND),
    ("include/lns/cpu/", BACKEND),
    ("parallel/", "parallel"),
    ("src/data/", "data"),
    ("include/lns/data/", "data"),
    ("src/model/", "model"),
    ("include/lns/model/", "model"),
    ("src/optim/", "optim"),
    ("include/lns/optim/", "optim"),
    ("src/checkpoint/", "checkpoint"),
    ("include/lns/checkpoint/", "checkpoint"),
    ("src/train/", "train"),
    ("include/lns/train/", "train"),
]

SOURCE_DIRS = ["include/lns", "src", "parallel", "tools"]
EXTENSIONS = (".h", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(root, path):
    for prefix, layer in LAYERS:
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return layer
    return None


def may_include(mine, theirs):
    """Whether a file of layer `mine` may include a header of layer `theirs`."""
    if theirs == BACKEND:
        return mine in (BACKEND, "apps")
    if mine == BACKEND:
        return theirs == "core"
    return LAYER_ORDER.index(theirs) <= LAYER_ORDER.index(mine)


def resolve(root, including, name):
    """The repository path an #include "name" refers to, or None (system, third party)."""
    for base in ("include", "src", "", os.path.dirname(including)):
        p = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, p)):
            return p
    return None


def check(root):
    problems = []
    for top in SOURCE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(EXTENSIONS):
                    continue
                path = os.path.relpath(os.path.join(dirpath, f), root)
                mine = layer_of(root, path)
                if mine is None:
                    problems.append(f"{path}: in no layer; add it to LAYERS in tests/layering/check_layering.py "
                                    "and to docs/architecture.md")
                    continue
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for name in INCLUDE.findall(text):
                    target = resolve(root, path, name)
                    if target is None:
                        continue
                    theirs = layer_of(root, target)
                    if theirs is None:
                        problems.append(f"{target}: in no layer; add it to LAYERS in tests/layering/check_layering.py")
                    elif not may_include(mine, theirs):
                        why = (f"only the programs include a {BACKEND}; the layers reach it through core"
                               if theirs == BACKEND else
                               f"a {BACKEND} includes core only" if mine == BACKEND else
                               f"{mine} sits below {theirs}")
                        problems.append(f'{path} ({mine}) includes "{name}" ({theirs}): {why} '
                                        "(docs/architecture.md)")
    return sorted(set(problems))


def self_test():
    """A tree with legal and illegal includes: the check must name the illegal ones only."""
    with tempfile.TemporaryDirectory() as root:
        files = {
            "include/lns/core/tensor.h": "",
            "src/core/tensor.cpp": '#include "lns/core/tensor.h"\n',
            "include/lns/model/stage.h": '#include "lns/core/tensor.h"\n#include "parallel/layout.h"\n',
            "src/model/stage.cpp": '#include "lns/model/stage.h"\n',
            "parallel/layout.h": '#include "lns/core/tensor.h"\n',
            "parallel/bad.cpp": '#include "parallel/layout.h"\n#include "lns/model/stage.h"\n',
            "src/cuda/runtime.h": '#include "lns/core/tensor.h"\n',
            "src/cuda/norm.cu": '#include "cuda/runtime.h"\n#include "lns/model/stage.h"\n',
            "src/core/device.cpp": '#include "cuda/runtime.h"\n',
            "tools/bench.cpp": '#include "cuda/runtime.h"\n#include "lns/model/stage.h"\n',
        }
        for p, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(p)), exist_ok=True)
            with open(os.path.join(root, p), "w") as fh:
                fh.write(text)
        got = check(root)
        want = ['parallel/bad.cpp (parallel) includes "lns/model/stage.h" (model): parallel sits below model '
                "(docs/architecture.md)",
                'src/core/device.cpp (core) includes "cuda/runtime.h" (backend): only the programs include '
                "a backend; the layers reach it through core (docs/architecture.md)",
                'src/cuda/norm.cu (backend) includes "lns/model/stage.h" (model): a backend includes core only '
                "(docs/architecture.md)"]
        if got != want:
            print("check_layering self-test: expected\n  %s\ngot\n  %s" % (want, "\n  ".join(got) or "nothing"))
            return 1
        print("check_layering self-test: the bad includes were reported:\n  " + "\n  ".join(got))
        return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layering: {len(problems)} include(s) against the dependency direction")
        return 1
    print("check_layering: every include follows " + " < ".join(LAYER_ORDER) + f", {BACKEND}s above core only")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
