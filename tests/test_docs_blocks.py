"""Every shell block of the README and docs/ runs as written, page by page and in order, against a real service like
the one `scripts/run.sh` starts offline: the demo corpus (examples/demo) as the default collection, a data directory
`data/` and its write key in `data/write.key` (`$KEY` and `$WRITE_KEY`; `$READ_KEY` is a read key). Only the port
differs, and curl is told to fail on an HTTP error. A block that cannot run there says why on the line before it:
`<!-- not run: REASON -->` (a synopsis of flags, Docker, a Ray cluster, minutes of training on scifact, ...)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid_retrieval.evaluation.server import running_server

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(?:<!-- not run: (?P<reason>[^>]+?) -->\n)?```(?P<lang>bash|python)\n(?P<code>.*?)```", re.DOTALL)
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
WRITE_KEY, READ_KEY = "docs-write-key", "docs-read-key"
SNIPPET_PAGES = ("docs/client.md", "docs/rag.md")  # their Python blocks: tests/test_docs_snippets.py


def blocks(page: str) -> list[tuple[str, str, str | None]]:
    """(language, code, why it is not run or None) of each fenced shell or Python block of `page`, in order."""
    return [(m["lang"], m["code"], m["reason"]) for m in BLOCK.finditer((ROOT / page).read_text())]


def runnable(page: str) -> str:
    """The page's shell blocks that run, as one script for this service's port. The README's run against run.sh
    itself, in tests/test_readme.py."""
    return "" if page == "README.md" else "\n".join(code for lang, code, reason in blocks(page) if lang == "bash" and reason is None)


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory) -> Path:
    from hybrid_retrieval.indexer.build import BuildOptions, build_index

    out = tmp_path_factory.mktemp("demo") / "demo"
    build_index(ROOT / "examples" / "demo", out, BuildOptions(progress=False))
    return out


def test_every_block_runs_or_says_why_not():
    """Shell blocks run here; Python blocks on the pages tests/test_docs_snippets.py runs; any other says why not."""
    for page in PAGES:
        for lang, code, reason in blocks(page):
            assert reason is None or len(reason) > 10, (page, code[:80])
            assert lang == "bash" or reason is not None or page in SNIPPET_PAGES, (page, code[:80])
    ran = sum(1 for page in PAGES for _, _, reason in blocks(page) if reason is None)
    skipped = [(page, reason) for page in PAGES for _, _, reason in blocks(page) if reason is not None]
    assert ran > len(skipped), skipped  # most blocks run


@pytest.mark.parametrize("page", [page for page in PAGES if runnable(page).strip()])
@pytest.mark.server
def test_the_page_s_shell_blocks_run_in_order(page, demo_index, tmp_path):
    index = tmp_path / "indexes" / "demo"
    shutil.copytree(demo_index, index)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "write.key").write_text(WRITE_KEY + "\n")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {
        "HYBRID_DATA": str(tmp_path / "data"),
        "HYBRID_WRITE_KEYS": WRITE_KEY,
        "HYBRID_API_KEYS": READ_KEY,
        "HYBRID_REFRESH_INTERVAL": "0.1",
        "HYBRID_VERIFY": "size",
    }
    with running_server(index, env, cwd=tmp_path) as (url, _):
        port = url.rsplit(":", 1)[1]
        script = runnable(page).replace("localhost:8000", f"localhost:{port}").replace("curl -s ", "curl -sf ")
        shell_env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": os.environ.get("HOME", str(tmp_path)),
            "KEY": WRITE_KEY,
            "WRITE_KEY": WRITE_KEY,
            "READ_KEY": READ_KEY,
            "HYBRID_URL": url,
        }
        ran = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=shell_env, capture_output=True, text=True, timeout=600)
        assert ran.returncode == 0, f"{page}:\n{ran.stderr[-3000:]}\n{ran.stdout[-2000:]}"
