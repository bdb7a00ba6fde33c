"""Screenshots of the playground for the README: docs/ui-desktop.png (compare mode, an explain panel open) and
docs/ui-narrow.png (390 pixels wide), from a server over INDEX in headless Chromium (Debian's `chromium`).

    .venv/bin/python scripts/ui_screenshots.py [INDEX] [--query TEXT]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from urllib.parse import urlencode

from hybrid_retrieval.evaluation.server import running_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("index", type=Path, nargs="?", default=Path("indexes/scifact"))
    parser.add_argument("--query", default="statin therapy and cancer risk")
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no Chromium: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    view = "/ui?" + urlencode({"q": args.query, "compare": "1", "a.fusion": "cc", "a.alpha": "0.6", "b.mode": "bm25"})
    with running_server(args.index, {"HYBRID_VERIFY": "size"}) as (url, _), sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for name, viewport in (("desktop", {"width": 1280, "height": 1000}), ("narrow", {"width": 390, "height": 844})):
            page = browser.new_page(viewport=viewport, base_url=url)
            page.goto(view)
            page.wait_for_selector("#column-b .hit")
            page.locator("#column-a .explain-toggle").nth(0).click()
            page.wait_for_timeout(200)  # the lines between the columns are drawn on the next frame
            page.screenshot(path=str(args.out / f"ui-{name}.png"))
            print(f"wrote {args.out / f'ui-{name}.png'}")
        browser.close()


if __name__ == "__main__":
    main()
