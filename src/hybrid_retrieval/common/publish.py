"""Publish a folder or a file atomically, so readers see the old version or the complete new one.

Index builds, the hubness fit, the ONNX export and reranker training all write several files that
only make sense together. Writing them in place lets a crash (or a concurrent reader) observe a
half-written mix; building them in a hidden sibling folder and renaming that into place does not.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# Errors meaning "this kernel, libc or filesystem cannot exchange", not "the exchange failed".
_EXCHANGE_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}


def fsync_path(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Flush every file and folder under ``root`` (children first) so a rename never publishes
    names whose data is still only in the page cache."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                fsync_path(path)
        fsync_path(dirpath)


def _exchange(a: Path, b: Path) -> None:
    """Swap two paths in one step with Linux ``renameat2(RENAME_EXCHANGE)``.

    Raises OSError with ENOSYS where the call does not exist; the kernel answers EINVAL or
    ENOTSUP where the filesystem cannot exchange.
    """
    if not sys.platform.startswith("linux"):
        raise OSError(errno.ENOSYS, "renameat2 is Linux-only")
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        renameat2 = libc.renameat2  # glibc >= 2.28
    except AttributeError:
        raise OSError(errno.ENOSYS, "libc has no renameat2") from None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a), None, str(b))


def _swap_by_renames(new: Path, target: Path) -> Path:
    """Two-rename fallback for :func:`_exchange`; returns where the old folder now lies.

    Not atomic: a crash between the two renames leaves ``target`` missing and the old folder at
    the ``.{name}.retired-XXXX`` sibling. If the second rename fails the old folder is put back.
    """
    # mkdtemp reserves a unique name; renaming a folder onto an empty folder replaces it.
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.retired-", dir=target.parent))
    try:
        os.rename(target, retired)
    except BaseException:
        os.rmdir(retired)
        raise
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(retired, target)
        raise
    return retired


def _publish(tmp: Path, target: Path, *, replace: bool, keep_existing: bool) -> None:
    if not os.path.lexists(target):
        try:
            os.rename(tmp, target)
        except OSError as exc:
            # Another writer published between the check and the rename: decide as below.
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        else:
            fsync_path(target.parent)
            return
    if keep_existing:
        shutil.rmtree(tmp)
        return
    if not replace:
        raise FileExistsError(errno.EEXIST, "refusing to replace existing folder", str(target))
    if target.is_symlink() or not target.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "can only replace a folder", str(target))
    try:
        _exchange(tmp, target)
        old = tmp
    except OSError as exc:
        if exc.errno not in _EXCHANGE_UNSUPPORTED:
            raise
        old = _swap_by_renames(tmp, target)
    # Make the new name durable before the only other copy of the old data goes away.
    fsync_path(target.parent)
    shutil.rmtree(old)


@contextlib.contextmanager
def publish_dir(
    target: Path | str,
    *,
    replace: bool = True,
    keep_existing: bool = False,
    mode: int = 0o755,
) -> Iterator[Path]:
    """Build a folder in a hidden sibling of ``target`` and publish it there only on success.

    Yields the temporary folder (``.{name}.building-XXXX`` in ``target``'s parent, so the final
    rename never crosses filesystems). On normal exit every file and folder in it is fsynced, then:

    * ``target`` missing: the folder is renamed to ``target``.
    * ``target`` exists and ``keep_existing``: the new folder is discarded (for caches, where a
      concurrent writer may have published the same content first).
    * ``target`` exists and not ``replace``: FileExistsError.
    * otherwise the two folders are swapped with ``renameat2(RENAME_EXCHANGE)``, one atomic step,
      and the old folder is removed afterwards. Where that call is unavailable (non-Linux, old
      glibc, filesystems answering EINVAL/ENOTSUP) it falls back to renaming ``target`` to
      ``.{name}.retired-XXXX`` and then the new folder to ``target``; a crash between those two
      renames leaves ``target`` missing with the old folder at the retired name. Either way the
      old folder is deleted only once the new one is in place.

    If the body raises (anything, KeyboardInterrupt included) the temporary folder is removed and
    ``target`` is left untouched. A hard crash can leave hidden ``.building-``/``.retired-``
    siblings behind, never a partial ``target``.
    """
    target = Path(target)
    with _work_folder(target, "building") as tmp:
        try:
            os.chmod(tmp, mode)  # mkdtemp creates it 0o700
            yield tmp
            _fsync_tree(tmp)
            _publish(tmp, target, replace=replace, keep_existing=keep_existing)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


class Replacement:
    """A new version of folder `target`, filled in `folder` (a hidden sibling) and published by `publish()`; the
    previous version is kept (locked, beside it) until the `replacing_dir` block ends, so the caller can check that the
    new version works (opens, serves) and else put the old one back: the block raising after `publish()` does that."""

    def __init__(self, target: Path, folder: Path):
        self.target, self.folder = target, folder
        self.published = False
        self.discard: Path | None = None  # what the block's end removes: the replaced version, or an undone new one
        self._held: list[int] = []

    def publish(self, replace: bool) -> None:
        """Put the filled folder in place: FileExistsError when `target` exists and not `replace`."""
        _fsync_tree(self.folder)
        if not os.path.lexists(self.target):
            os.rename(self.folder, self.target)  # a folder published meanwhile makes this fail: nothing changed
        else:
            if not replace:
                raise FileExistsError(errno.EEXIST, "refusing to replace existing folder", str(self.target))
            if self.target.is_symlink() or not self.target.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "can only replace a folder", str(self.target))
            self.discard = self._swap(self.folder)
        fsync_path(self.target.parent)
        self.published = True

    def undo(self) -> None:
        """Put the previous version back (or, when there was none, take the new one away)."""
        if self.discard is None:
            os.rename(self.target, self.folder)
            self.discard = self.folder
        else:
            self.discard = self._swap(self.discard)
        fsync_path(self.target.parent)
        self.published = False

    def _swap(self, other: Path) -> Path:
        """Exchange `other` and `target`; where the version that was at `target` now lies, locked by this process so
        no sweep of leftovers removes it while it may still go back."""
        try:
            _exchange(other, self.target)
            moved = other
        except OSError as exc:
            if exc.errno not in _EXCHANGE_UNSUPPORTED:
                raise
            moved = _swap_by_renames(other, self.target)
        fd = os.open(moved, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._held.append(fd)
        return moved

    def _finish(self) -> None:
        for path in (self.folder, self.discard):
            if path is not None and path != self.target and os.path.lexists(path):
                shutil.rmtree(path, ignore_errors=True)
        for fd in self._held:
            os.close(fd)


@contextlib.contextmanager
def replacing_dir(target: Path | str, mode: int = 0o755) -> Iterator[Replacement]:
    """A Replacement of `target` to fill and publish: if the block raises, nothing of it stays (a published new
    version is undone, the previous one back in place); when it ends, the replaced version is removed. A crash leaves
    `target` whole (old or new) and hidden siblings that indexer.leftovers removes."""
    target = Path(target)
    with _work_folder(target, "building") as folder:
        os.chmod(folder, mode)  # mkdtemp creates it 0o700
        replacement = Replacement(target, folder)
        try:
            yield replacement
        except BaseException:
            if replacement.published:
                replacement.undo()
            raise
        finally:
            replacement._finish()


# Hidden siblings of a published folder: builds in progress, compactions' and snapshots' scratch space, and the old
# folder of a swap by renames. A process holds a lock on its own (flock on the folder) while it works in it, so another process
# can tell a leftover of a killed one from work in progress (`in_use`; indexer.leftovers removes them).
LEFTOVER_KINDS = ("building", "compact", "snapshot", "retired", "reembed")


@contextlib.contextmanager
def _work_folder(target: Path, kind: str) -> Iterator[Path]:
    """A new hidden sibling `.{name}.{kind}-XXXX` of `target`, locked by this process while the body runs."""
    folder = Path(tempfile.mkdtemp(prefix=f".{target.name}.{kind}-", dir=target.parent))
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield folder
    finally:
        os.close(fd)


@contextlib.contextmanager
def scratch_dir(target: Path | str, kind: str = "compact") -> Iterator[Path]:
    """A scratch folder beside `target` (same filesystem, so files can be hard-linked into it), locked while in use
    and removed after; `kind` (one of LEFTOVER_KINDS) names what it is for."""
    with _work_folder(Path(target), kind) as folder:
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def write_atomic(path: Path | str, data: bytes | str, *, mode: int = 0o644) -> None:
    """Replace one file atomically: readers see the old or the new content, never a torn write.

    ``str`` is written as UTF-8. The data goes to a hidden sibling temp file (locked while it is written, so
    `sweep_temporary` can tell a killed writer's from one in progress), is fsynced, renamed over ``path`` with
    os.replace, and the parent folder is fsynced so the rename survives a crash.
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX, dir=path.parent)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)  # mkstemp creates it 0o600
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_path(path.parent)


TEMPORARY_SUFFIX = ".tmp"

# The errors that say "this filesystem cannot link these two paths"; anything else (a missing source, a full disk) is
# a real failure.
_CANNOT_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)


def link_or_copy(source: str | Path, target: str | Path) -> None:
    """Hard-link a file that is never changed in place (every writer here replaces files whole), copying it where
    the filesystem cannot link; a `shutil.copytree` copy_function. Folders of one model or one index then share the
    bytes on disk."""
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno not in _CANNOT_LINK:
            raise
        shutil.copy2(source, target)


def sweep_temporary(folder: Path | str) -> list[Path]:
    """Remove the temporary files of write_atomic that killed writers left in `folder` (those no process holds);
    the paths removed."""
    removed = []
    for path in Path(folder).glob(f".*{TEMPORARY_SUFFIX}"):
        if path.is_file() and not path.is_symlink() and not in_use(path):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def siblings(target: Path) -> list[Path]:
    """The hidden sibling folders of `target` (LEFTOVER_KINDS), in use or not."""
    return sorted(p for kind in LEFTOVER_KINDS for p in target.parent.glob(f".{target.name}.{kind}-*") if p.is_dir())


def in_use(folder: Path) -> bool:
    """Whether a process holds `folder` (a build or compaction working in it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
