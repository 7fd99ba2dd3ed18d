#!/usr/bin/env python3
"""No import circles among the Python tools (tools/**/*.py).

A tool imports another by its bare module name, with the other's folder put on sys.path
(depth_report.py: `from depth_grid import cost`). Two modules that import each other,
even where one import sits inside a function to dodge the circle at load time, cannot be
read, tested or changed apart; issue 49 broke the two there were (depth_grid.py and
model_shape.py now hold what both sides needed). The imports are read with `ast`, every
one of them (inside functions and `if` blocks too): a name resolves to the file of that
name in the importing file's own folder, else to every tools file of that name.
"""
import ast
import os
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def imported_names(path):
    """The top-level module names a file imports anywhere in it (`import a.b` -> a)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def import_graph(tools_dir):
    """{file: sorted files it imports}, files relative to tools_dir."""
    files = []
    for d, _, fs in os.walk(tools_dir):
        files += [os.path.relpath(os.path.join(d, f), tools_dir) for f in fs if f.endswith(".py")]
    by_name = {}
    for f in files:
        by_name.setdefault(os.path.splitext(os.path.basename(f))[0], []).append(f)
    graph = {}
    for f in sorted(files):
        edges = set()
        for name in imported_names(os.path.join(tools_dir, f)):
            cands = by_name.get(name, [])
            own = [c for c in cands if os.path.dirname(c) == os.path.dirname(f)]
            edges.update(own or cands)
        edges.discard(f)
        graph[f] = sorted(edges)
    return graph


def cycles(graph):
    """One import circle per strongly connected component of more than one file (Tarjan),
    each as a path [a, b, ..., a] through the component."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(set(comp))

    sys.setrecursionlimit(max(1000, 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for comp in comps:  # the shortest circle through the component's first file (BFS)
        start = min(comp)
        parent, queue = {}, [start]
        while queue and start not in parent:
            v = queue.pop(0)
            for w in graph[v]:
                if w in comp and w not in parent:
                    parent[w] = v
                    queue.append(w)
        path, v = [start], parent[start]
        while v != start:
            path.append(v)
            v = parent[v]
        out.append([start] + path[:0:-1] + [start])
    return out


def describe(circles):
    return "; ".join(" -> ".join(c) for c in circles)


class ToolImports(unittest.TestCase):
    def test_tools_have_no_import_circle(self):
        graph = import_graph(os.path.join(ROOT, "tools"))
        self.assertGreater(len(graph), 30)  # it did read the tools
        self.assertIn("experiments/depth_grid.py", graph["experiments/depth_report.py"])
        found = cycles(graph)
        self.assertEqual(found, [], "import circles among tools/**/*.py: " + describe(found))

    def test_fires_on_a_cyclic_pair(self):
        # a.py imports b at load time, b.py imports a inside a function (the way the
        # depth study's pair hid theirs); c.py imports a only: not part of the circle.
        with tempfile.TemporaryDirectory() as t:
            os.makedirs(os.path.join(t, "x"))
            os.makedirs(os.path.join(t, "y"))
            files = {"x/a.py": "import os\nfrom b import f\n",
                     "x/b.py": "def f():\n    import a\n    return a\n",
                     "y/c.py": "import a.sub\n",
                     "y/d.py": "import d_helper\n"}  # not a tools file: no edge
            for name, text in files.items():
                with open(os.path.join(t, name), "w") as f:
                    f.write(text)
            graph = import_graph(t)
            self.assertEqual(graph, {"x/a.py": ["x/b.py"], "x/b.py": ["x/a.py"], "y/c.py": ["x/a.py"],
                                     "y/d.py": []})
            found = cycles(graph)
            self.assertEqual(found, [["x/a.py", "x/b.py", "x/a.py"]])
            self.assertEqual(describe(found), "x/a.py -> x/b.py -> x/a.py")
            # a circle of three, through folders
            with open(os.path.join(t, "x", "b.py"), "w") as f:
                f.write("import c\n")
            with open(os.path.join(t, "y", "c.py"), "w") as f:
                f.write("if True:\n    from a import g\n")
            self.assertEqual(cycles(import_graph(t)), [["x/a.py", "x/b.py", "y/c.py", "x/a.py"]])
            # broken: no circle left
            with open(os.path.join(t, "y", "c.py"), "w") as f:
                f.write("import json\n")
            self.assertEqual(cycles(import_graph(t)), [])


if __name__ == "__main__":
    unittest.main()
