"""The layer rule (pyproject.toml's [tool.importlinter] contracts) holds on the tree, and an upward import breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"  # import-linter, a dev dependency


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """The contracts checked against the `hybrid_retrieval` package under `root`: PYTHONPATH comes before the
    editable install's path entry, so grimp reads that copy. No cache, so runs on two trees never share results."""
    environment = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tree_keeps_every_contract():
    result = lint_imports(REPO / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "layers KEPT" in result.stdout and "BROKEN" not in result.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path):
    shutil.copytree(REPO / "src" / "hybrid_retrieval", tmp_path / "hybrid_retrieval", ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "hybrid_retrieval" / "search" / "fusion.py").open("a") as fh:
        fh.write("\nfrom hybrid_retrieval.app import main  # search reaching up into the service\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "layers BROKEN" in result.stdout
    assert "hybrid_retrieval.search is not allowed to import hybrid_retrieval.app" in result.stdout
    assert "hybrid_retrieval.search.fusion -> hybrid_retrieval.app.main" in result.stdout
