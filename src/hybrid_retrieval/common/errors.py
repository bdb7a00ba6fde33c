"""The project's exception types: problems a user can fix, each message saying what and where.

Entry points map `HybridError` to a one-line message (the CLI: exit code 2; the service: 4xx, or 5xx for the
server's own storage and time limits). Anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import re

_INDEXED = re.compile(r"(.*?)((?:\[\d+\])*)", re.DOTALL)

Loc = tuple[str | int, ...]  # a field's path: names (str) and list positions (int), e.g. ("searches", 3, "filter", "a.b")


class HybridError(Exception):
    """A problem with the user's input, files or configuration (not a bug)."""


class ConfigError(HybridError, ValueError):
    """An invalid parameter value; the message names the parameter and the valid choices."""


def parse_loc(field: str) -> Loc:
    """`searches[3].filter.year` -> ("searches", 3, "filter", "year"): a dotted path written as text."""
    parts: list[str | int] = []
    for name in field.split("."):
        match = _INDEXED.fullmatch(name)
        assert match is not None  # the pattern matches any text
        name, indices = match.groups()
        parts += [name, *map(int, re.findall(r"\d+", indices))]
    return tuple(parts)


def loc_text(loc: Loc) -> str:
    """("documents", 2, "metadata", "a.b") -> `documents[2].metadata.a.b`, for messages."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


class SpecError(ConfigError):
    """An invalid field of a request or a search specification. `loc` is its path, names kept whole (a metadata
    field may be called `a.b`); `field` the same path as text (`rerank.weight`, `documents[2].id`). A path given as
    text is split on dots and [i]; give a tuple where a name may hold a dot."""

    def __init__(self, field: str | Loc, message: str):
        self.loc: Loc = parse_loc(field) if isinstance(field, str) else tuple(field)
        self.field, self.reason = loc_text(self.loc), message
        super().__init__(f"{self.field}: {message}")

    def within(self, parent: str | Loc) -> SpecError:
        """The same error one level down: `within("fusion")` turns `alpha` into `fusion.alpha`."""
        return SpecError((*(parse_loc(parent) if isinstance(parent, str) else parent), *self.loc), self.reason)


class StorageError(HybridError):
    """The index's files could not be written (nothing was changed): `kind` says why, for the HTTP status."""

    FULL, READ_ONLY, IO = "full", "read-only", "io"

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind

    @classmethod
    def of(cls, exc: OSError, what: str) -> StorageError:
        """`what` failed with `exc`, in words an operator acts on."""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return cls(f"{what}: the disk is full ({exc.strerror}); free space, then write again", cls.FULL)
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return cls(f"{what}: the index folder is not writable ({exc.strerror})", cls.READ_ONLY)
        return cls(f"{what}: {exc.strerror or exc}", cls.IO)


class DeadlineExceeded(HybridError):
    """A request ran past its time budget and was stopped (search.budget)."""


# The storage engine's: collections, aliases and snapshots


class NotFound(HybridError, LookupError):
    """No collection or alias of that name (HTTP 404)."""


class Conflict(HybridError):
    """The name is taken, or the change would break an alias (HTTP 409)."""


class BadSnapshot(HybridError):
    """A file that is not a complete, intact snapshot (HTTP 422): nothing was changed."""


class SnapshotNotFound(HybridError, LookupError):
    """No snapshot of that id (HTTP 404)."""


class TooMany(HybridError):
    """The service serves as many collections as HYBRID_MAX_COLLECTIONS allows (HTTP 409)."""


class Unavailable(NotFound):
    """A collection of the data directory that could not be opened (HTTP 503; to a key that may not use it, like any
    other unknown name)."""
