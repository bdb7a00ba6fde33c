"""The Python snippets of docs/client.md and docs/rag.md run as written, against a real server: each page's blocks in
order, in one interpreter, as a reader would paste them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid_retrieval.evaluation.server import running_server

pytestmark = pytest.mark.server  # each test talks to the service (a process, or create_app in this one)

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def snippets(page: str) -> str:
    return "\n".join(BLOCK.findall((ROOT / "docs" / page).read_text()))


def test_the_client_and_rag_pages_run(tmp_path):
    """With the data the pages name (the checkout's demo corpus), run from the checkout's root as a reader would."""
    env = {"HYBRID_DATA": str(tmp_path / "data"), "HYBRID_WRITE_KEYS": "docs-key", "HYBRID_VERIFY": "size"}
    with running_server(None, env) as (url, _):
        for page in ("client.md", "rag.md"):
            code = snippets(page)
            assert code.count("\n") > 10, page
            ran = subprocess.run(
                [sys.executable, "-c", code],
                env={"PATH": "/usr/bin:/bin", "HYBRID_URL": url, "HYBRID_API_KEY": "docs-key"},
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert ran.returncode == 0, f"{page}:\n{ran.stderr[-3000:]}"
            assert ran.stdout.strip(), page
