"""Screenshot of an ``MCR_LOG=trace`` file opened in a browser's trace viewer,
for the docs' Logging page.

The viewer is the Performance panel of Chromium's DevTools, which loads
Chrome trace-event JSON ("Load trace"). Chromium serves its own DevTools
pages on its remote-debugging port, so nothing is fetched from the network.
Playwright drives the browser::

    pip install playwright
    python docs/_tools/trace_screenshot.py trace.json out.png \\
        --chromium /usr/bin/chromium --expand 4 --click 440,197

``--expand N`` opens the tracks of the first N processes (ranks) and of
their threads (each backend's blocking calls and request lanes, counted
from the trace), so that calls show their names; ``--click X,Y``
then selects the call there, whose record the Summary pane shows. The
positions are the page's pixels (1600 x 900 by default) and depend on the
trace: take a screenshot without ``--click`` first. The page's layout is
DevTools' own (measured on Chromium 155): another version may want other
positions (the constants below).
"""

import argparse
import collections
import json
import pathlib
import socket

from playwright.sync_api import sync_playwright

# Where DevTools 155 draws things, in pixels of a 1600 x 900 page
FIRST_ROW = 129         # the first process's track header, below the time ruler
ROW = 21                # from one collapsed track header to the next
THREAD_ROW = 16         # from an open process's header to its first thread's
RANK_OPEN = 17          # an open process: this plus ROW per thread
SHORTCUTS_CLOSE = (1571, 77)    # the close button of the keyboard-shortcuts card
SIDEBAR_TOGGLE = (16, 40)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=pathlib.Path, help="the MCR_LOG=trace file")
    parser.add_argument("out", type=pathlib.Path, help="the PNG to write")
    parser.add_argument("--chromium", default=None,
                        help="the browser executable (default: Playwright's own)")
    parser.add_argument("--expand", type=int, default=0,
                        help="open the tracks of the first N ranks and their backends")
    parser.add_argument("--click", default=None, help="X,Y: select the call there")
    parser.add_argument("--size", default="1600x900", help="WIDTHxHEIGHT of the page")
    args = parser.parse_args()
    if not args.trace.is_file():
        parser.error(f"trace: no file {args.trace}")
    width, height = (int(v) for v in args.size.split("x"))
    # the threads (a backend's blocking calls, its request lanes) of each rank
    events = json.loads(args.trace.read_text())["traceEvents"]
    per_rank = collections.Counter(e["pid"] for e in events if e.get("name") == "thread_name")
    threads = [per_rank[pid] for pid in sorted(per_rank)]
    if args.expand > len(threads):
        parser.error(f"--expand: the trace has {len(threads)} ranks, not {args.expand}")
    port = free_port()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium,
                                    args=["--no-sandbox", f"--remote-debugging-port={port}"])
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(f"http://127.0.0.1:{port}/devtools/devtools_app.html?panel=timeline")
        page.wait_for_timeout(4000)
        with page.expect_file_chooser() as chooser:
            page.locator("[aria-label^='Load trace']").first.click()
        chooser.value.set_files(str(args.trace))
        page.wait_for_timeout(5000)
        page.mouse.click(*SHORTCUTS_CLOSE)     # shown at the first trace loaded
        page.wait_for_timeout(300)
        page.mouse.click(*SIDEBAR_TOGGLE)
        page.wait_for_timeout(800)
        # open the ranks bottom first (a track opened moves the ones below it),
        # then, in the same order, each rank's backends
        for i in reversed(range(args.expand)):
            page.mouse.click(9, FIRST_ROW + i * ROW)
            page.wait_for_timeout(300)
        tops = [FIRST_ROW]          # each open rank's header: below the ranks above it
        for n in threads[:args.expand]:
            tops.append(tops[-1] + RANK_OPEN + n * ROW)
        for i in reversed(range(args.expand)):
            for t in reversed(range(threads[i])):
                page.mouse.click(20, tops[i] + THREAD_ROW + t * ROW)
                page.wait_for_timeout(300)
        if args.click:
            x, y = (int(v) for v in args.click.split(","))
            page.mouse.click(x, y)
            page.wait_for_timeout(800)
        page.screenshot(path=str(args.out))
        browser.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
