"""The one rule for a study test's work folder: removed when the test passes; kept when it
fails, with its place and the tails of its runs' logs printed. A study test runs many
short trainings in a temporary folder; a failure that deletes the folder deletes its own
explanation (issue 45: one run of 24 in fp8_depth exited 1 and its logs went with it).

    class MyTest(kept_folder.KeptFolderTest):
        prefix = "lns_my_study_"
        def test_x(self):
            ... self.work ...          # a fresh folder per test

A class that shares one folder across its tests (setUpClass) calls kept_folder.make()
there and kept_folder.done() in tearDownClass with whether any test failed
(KeptFolderTest.failed_in_class tells).
"""
import os
import shutil
import sys
import tempfile
import unittest


def make(prefix):
    return tempfile.mkdtemp(prefix=prefix)


def run_logs(folder):
    """The logs to show: those of the run folders that did not finish (a run.sh or
    cell.json and no result.json, as tools/experiments/depth_study.py leaves them), else
    every *.log under FOLDER; newest first."""
    unfinished, every = [], []
    for d, dirs, files in os.walk(folder):
        dirs[:] = [x for x in dirs if x not in ("checkpoints", "logs")]  # glog's copies of the same lines
        logs = [os.path.join(d, f) for f in files if f.endswith(".log")]
        every += logs
        if ("run.sh" in files or "cell.json" in files) and "result.json" not in files:
            unfinished += logs
    return sorted(unfinished or every, key=lambda p: -os.path.getmtime(p))


def tails(folder, lines=30, max_files=6):
    out = []
    logs = run_logs(folder)
    for p in logs[:max_files]:
        with open(p, errors="replace") as f:
            text = f.read().splitlines()
        out.append("--- %s (last %d of %d lines) ---" % (p, min(lines, len(text)), len(text)))
        out += text[-lines:]
    if len(logs) > max_files:
        out.append("(%d more logs under %s)" % (len(logs) - max_files, folder))
    return "\n".join(out) if out else "(no *.log under %s)" % folder


def done(folder, failed, what=""):
    """Removes FOLDER, or keeps it and prints why when FAILED."""
    if not folder or not os.path.isdir(folder):
        return
    if not failed:
        shutil.rmtree(folder, ignore_errors=True)
        return
    sys.stderr.write("\n%s failed: its folder is kept at %s\n%s\n" % (what or "the test", folder, tails(folder)))
    sys.stderr.flush()


class KeptFolderTest(unittest.TestCase):
    """self.work: a folder of the test's own, kept (and its runs' log tails printed) when
    the test fails or errs."""
    prefix = "lns_study_"
    failed_in_class = False

    def run(self, result=None):
        result = result if result is not None else self.defaultTestResult()
        before = len(result.failures) + len(result.errors)
        self.work = make(self.prefix)
        try:
            return super().run(result)
        finally:
            failed = len(result.failures) + len(result.errors) > before
            if failed:
                type(self).failed_in_class = True
            done(self.work, failed, self.id())
