#!/usr/bin/env python3
"""A PNG of TensorBoard's time-series page for a run's event files (docs/training.md's
screenshot): starts `tensorboard --logdir DIR` on a free port, waits until it lists the
run's scalars, loads the page in a headless Chromium through Playwright, filters the
cards by --tags, and saves the window.

    python3 tools/tensorboard_screenshot.py --logdir runs/tiny_lns/tensorboard \\
        --out docs/images/tensorboard_quickstart.png

Needs `pip install tensorboard playwright` and a Chromium: Playwright's own
(`python3 -m playwright install --with-deps chromium`) or a system one given with
--browser (Debian: `apt-get install chromium-headless-shell`, the default here when
present).
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_scalars(url, timeout_s):
    """Polls the scalars plugin until it lists a tag; returns how many."""
    end = time.time() + timeout_s
    while time.time() < end:
        try:
            with urllib.request.urlopen(url + "/data/plugin/scalars/tags", timeout=5) as r:
                tags = json.load(r)
            n = sum(len(t) for t in tags.values())
            if n:
                return n
        except OSError:
            pass
        time.sleep(1)
    sys.exit("tensorboard_screenshot: TensorBoard at %s listed no scalars within %d s" % (url, timeout_s))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logdir", required=True, help="directory of the event files")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--tags", default="^(train/(loss|lr|grad_norm)|eval/(loss|ppl)|perf/tokens_per_s)$",
                    help="regular expression of the tags shown")
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--browser", default=shutil.which("chromium-headless-shell") or "",
                    help="Chromium executable (default: chromium-headless-shell on PATH, else Playwright's)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds to wait for TensorBoard")
    a = ap.parse_args()
    if not os.path.isdir(a.logdir):
        sys.exit("tensorboard_screenshot: --logdir=%s: no such directory" % a.logdir)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sys.exit("tensorboard_screenshot: needs Playwright: pip install playwright")

    port = free_port()
    url = "http://127.0.0.1:%d" % port
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", a.logdir, "--port", str(port),
                           "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        n = wait_for_scalars(url, a.timeout)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=a.browser or None, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": a.width, "height": a.height})
            page.goto(url + "/#timeseries", wait_until="networkidle")
            page.wait_for_selector("input[placeholder*='Filter tags']", timeout=a.timeout * 1000)
            page.fill("input[placeholder*='Filter tags']", a.tags)
            page.keyboard.press("Escape")  # the filter's list of suggestions
            close = page.locator("button[aria-label='Close side pane']")  # the settings
            if close.count():
                close.first.click()
            page.wait_for_load_state("networkidle")
            time.sleep(3)  # the charts draw after their data arrives
            page.screenshot(path=a.out)
            browser.close()
        print("tensorboard_screenshot: %s (%d scalar tags in %s, shown: %s)" % (a.out, n, a.logdir, a.tags))
    finally:
        tb.terminate()
        tb.wait(timeout=30)


if __name__ == "__main__":
    main()
