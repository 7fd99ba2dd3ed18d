#!/usr/bin/env python3
"""tools/plot_metrics.py on a small metrics file: LN-free replacement records are read
and each becomes a vertical marker on the loss curve at its step; a run without them
gets none; the PNG is written."""
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import plot_metrics  # noqa: E402


def write(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


class PlotMetrics(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="lns_plot_")
        rows = []
        for s in range(1, 21):
            if s == 6:
                rows.append({"step": 6, "ln_free_event": {"index": 0, "entry": "mlp@5", "norms": []}})
            if s == 11:
                rows.append({"step": 11, "ln_free_event": {"index": 1, "entry": "attn_qk@~0.05/200", "norms": []}})
            rows.append({"step": s, "loss": 4.0 - 0.05 * s + (0.3 if s in (6, 11) else 0.0), "lr": 1e-3})
        rows.append({"step": 20, "val_loss": 3.1, "val_ppl": 22.2, "val_tokens": 100})
        self.lnf = os.path.join(self.dir, "lnfree")
        os.makedirs(self.lnf)
        write(os.path.join(self.lnf, "metrics.jsonl"), rows)
        self.plain = os.path.join(self.dir, "plain.jsonl")
        write(self.plain, [r for r in rows if "ln_free_event" not in r])

    def test_events_are_read(self):
        name, train, val, events = plot_metrics.load(self.lnf)
        self.assertEqual(name, "lnfree")
        self.assertEqual(len(train), 20)
        self.assertEqual(events, [(6, "mlp@5"), (11, "attn_qk@~0.05/200")])
        self.assertEqual(plot_metrics.load(self.plain)[3], [])

    def test_markers_at_the_event_steps(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("matplotlib not installed")
        fig = plot_metrics.draw([self.lnf, self.plain], 3)
        ax = fig.axes[0]
        vertical = sorted(l.get_xdata()[0] for l in ax.lines
                          if len(l.get_xdata()) == 2 and l.get_xdata()[0] == l.get_xdata()[1])
        self.assertEqual(vertical, [6, 11])  # the plain run adds none
        self.assertEqual(sorted(t.get_text() for t in ax.texts), ["attn_qk", "mlp"])
        out = os.path.join(self.dir, "plot.png")
        plot_metrics.main([self.lnf, "--out", out])
        with open(out, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main(verbosity=2)
