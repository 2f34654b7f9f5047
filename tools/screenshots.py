"""PNG screenshots of `stacx view`'s main pages, for a person to look at.

    python tools/screenshots.py RUN_DIR [RUN_DIR...] -o DIR

Starts `stacx view` on the runs (the CLI, as a user would), opens each page in Debian's headless
Chromium (Playwright, `executable_path=/usr/bin/chromium` or $STACX_CHROMIUM; never a downloaded
browser) and writes DIR/<page>.png (whole page, 1280 px wide): runs, episodes, the episode with
the most turns, lineage, drift & cost, time & load, a SQL query, and compare when two runs are given.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def busiest_episode(run_dir: Path) -> str | None:
    with duckdb.connect(str(run_dir / "trace.duckdb"), read_only=True) as con:
        row = con.execute(
            "select episode_id from turn_generated group by 1 "
            "order by count(*) desc, sum(len(output_ids)) desc limit 1"
        ).fetchone()
        # a run whose episodes made no turn (a scaffold that crashed at start): its first
        row = (
            row
            or con.execute(
                "select episode_id from episode_started order by _seq limit 1"
            ).fetchone()
        )
    return str(row[0]) if row else None


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stacx", "view", *map(str, args.runs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = ""
        for line in proc.stdout or []:
            if m := re.search(r"http://127\.0\.0\.1:\d+", line):
                url = m.group(0)
                break
        if not url:
            sys.exit(f"stacx view did not start: exit {proc.wait()}")
        shots = {
            "runs": "/",
            "episodes": "/episodes",
            "lineage": "/lineage",
            "cost": "/cost",
            "load": "/load",
            "sql": "/sql?q=select+weight_version%2C+split%2C+n_episodes%2C+reward_mean+"
            "from+reward_by_weight_version+order+by+1",
        }
        if episode := busiest_episode(args.runs[0]):
            shots["episode"] = f"/episode?id={episode}"
        if len(args.runs) > 1:
            shots["compare"] = "/compare"
        from playwright.sync_api import sync_playwright

        with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                profile,
                executable_path=os.environ.get("STACX_CHROMIUM", "/usr/bin/chromium"),
                headless=True,
                args=ARGS,
                viewport={"width": 1280, "height": 900},
            )
            page = browser.new_page()
            for name, path in shots.items():
                page.goto(url + path)
                out = args.output / f"{name}.png"
                page.screenshot(path=str(out), full_page=True)
                print(out)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
