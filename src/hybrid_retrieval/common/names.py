"""The names collections and aliases take: one rule for both (they share one namespace), checked wherever a name
comes in."""

from __future__ import annotations

import re
from pathlib import Path

from hybrid_retrieval.common.errors import SpecError

NAME_RULE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
NAME_RULE_TEXT = "1 to 64 characters: lowercase letters, digits, '_' and '-', starting with a letter or digit"


def check_name(name: object, field: str = "name") -> str:
    """`name` when it follows NAME_RULE; SpecError naming `field` otherwise."""
    if not isinstance(name, str) or not NAME_RULE.fullmatch(name):
        raise SpecError(field, f"{name!r} is not a valid name: {NAME_RULE_TEXT}")
    return name


def name_of_folder(folder: Path) -> str:
    """The collection name an index folder served from outside a data directory takes: its name, lowercased, other
    characters replaced by '-'."""
    name = re.sub(r"[^a-z0-9_-]", "-", Path(folder).resolve().name.lower()).lstrip("_-")[:64]
    return name if NAME_RULE.fullmatch(name) else "default"
