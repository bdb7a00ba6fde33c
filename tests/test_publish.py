"""Atomic folder/file publishing: swaps, failures, the two-rename fallback, and SIGKILL at each step."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid_retrieval.common import publish
from hybrid_retrieval.common.publish import publish_dir, write_atomic

REPO = Path(__file__).resolve().parents[1]

OLD = {"a.txt": "old a\n", "sub/b.txt": "old b\n", "gone.bin": "only in the old version"}
NEW = {"a.txt": "new a\n" * 100, "sub/b.txt": "new b\n", "sub/deeper/c.txt": "new c\n", "d.txt": "new d\n"}


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` by relative path, with its content."""
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def hidden_siblings(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}."))


@pytest.fixture
def old_target(tmp_path: Path) -> Path:
    target = tmp_path / "index"
    target.mkdir()
    write_tree(target, OLD)
    return target


def test_creates_missing_target(tmp_path: Path) -> None:
    target = tmp_path / "index"
    with publish_dir(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".index.building-")
        assert not target.exists()
        write_tree(tmp, NEW)
    assert snapshot(target) == NEW
    assert hidden_siblings(target) == []


def test_replaces_existing_folder_and_leaves_no_siblings(old_target: Path) -> None:
    with publish_dir(old_target) as tmp:
        write_tree(tmp, NEW)
        assert snapshot(old_target) == OLD  # readers see the old version until the body ends
    assert snapshot(old_target) == NEW
    assert hidden_siblings(old_target) == []


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_exception_in_body_keeps_old_folder(old_target: Path, error: type[BaseException]) -> None:
    with pytest.raises(error), publish_dir(old_target) as tmp:
        write_tree(tmp, NEW)
        raise error("build failed")
    assert snapshot(old_target) == OLD
    assert hidden_siblings(old_target) == []


def test_replace_false_refuses_existing_target(old_target: Path) -> None:
    with pytest.raises(FileExistsError, match="index"), publish_dir(old_target, replace=False) as tmp:
        write_tree(tmp, NEW)
    assert snapshot(old_target) == OLD
    assert hidden_siblings(old_target) == []


def test_keep_existing_keeps_first_publisher(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    with publish_dir(target, keep_existing=True) as slow:
        write_tree(slow, {"who": "slow"})
        with publish_dir(target, keep_existing=True) as fast:
            write_tree(fast, {"who": "fast"})
        assert snapshot(target) == {"who": "fast"}
    assert snapshot(target) == {"who": "fast"}
    assert hidden_siblings(target) == []


def test_published_folder_mode(tmp_path: Path) -> None:
    with publish_dir(tmp_path / "default"):
        pass
    with publish_dir(tmp_path / "private", mode=0o750):
        pass
    assert stat.S_IMODE((tmp_path / "default").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o750


def test_exchange_swaps_two_folders(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    write_tree(a, {"x": "a"})
    write_tree(b, {"x": "b"})
    try:
        publish._exchange(a, b)
    except OSError as exc:
        if exc.errno in publish._EXCHANGE_UNSUPPORTED:
            pytest.skip(f"renameat2(RENAME_EXCHANGE) unsupported here: {exc}")
        raise
    assert (a / "x").read_text() == "b" and (b / "x").read_text() == "a"


def _no_exchange(a: Path, b: Path) -> None:
    raise OSError(errno.EINVAL, "exchange not supported")


def test_fallback_swaps(old_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish, "_exchange", _no_exchange)
    with publish_dir(old_target) as tmp:
        write_tree(tmp, NEW)
    assert snapshot(old_target) == NEW
    assert hidden_siblings(old_target) == []


def test_fallback_restores_old_folder_when_second_rename_fails(old_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish, "_exchange", _no_exchange)
    real_rename = os.rename

    def rename(src, dst):
        if Path(src).name.startswith(".index.building-"):
            raise OSError(errno.EIO, "simulated failure")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="simulated"), publish_dir(old_target) as tmp:
        write_tree(tmp, NEW)
    assert snapshot(old_target) == OLD
    assert hidden_siblings(old_target) == []


def test_write_atomic(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    write_atomic(path, b"{}")
    write_atomic(path, '{"v": "é"}')
    assert path.read_text(encoding="utf-8") == '{"v": "é"}'
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_write_atomic_failure_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "manifest.json"
    path.write_text("old")

    def fail(src, dst):
        raise OSError(errno.EIO, "simulated failure")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="simulated"):
        write_atomic(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


# The child publishes NEW over OLD and SIGKILLs itself at the point named by argv[2].
CHILD = """
import json, os, signal, sys
from pathlib import Path
from hybrid_retrieval.common import publish

target, point, files = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if point == "fsync":
    os.fsync = die
elif point == "exchange":
    publish._exchange = die
    publish._swap_by_renames = die
elif point == "rmtree":
    publish.shutil.rmtree = die

with publish.publish_dir(target) as tmp:
    for i, (rel, text) in enumerate(files.items()):
        if point == "body" and i == 2:
            die()
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
"""


@pytest.mark.parametrize(
    ("point", "expected"),
    [("body", OLD), ("fsync", OLD), ("exchange", OLD), ("rmtree", NEW), ("none", NEW)],
)
@pytest.mark.process
def test_sigkill_leaves_old_or_complete_new(old_target: Path, point: str, expected: dict[str, str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(old_target), point, json.dumps(NEW)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert child.returncode == (0 if point == "none" else -signal.SIGKILL), child.stderr
    assert old_target.is_dir() and not old_target.is_symlink()
    assert snapshot(old_target) in (OLD, NEW)  # never missing, never a mix
    assert snapshot(old_target) == expected
    # Leftovers from the kill are hidden siblings (a .building- folder), never the target itself.
    for name in hidden_siblings(old_target):
        assert name.startswith(".index.building-") or name.startswith(".index.retired-"), name
    if point == "none":
        assert hidden_siblings(old_target) == []
