"""The project's exception types: problems a user can fix, each message saying what and where.

Entry points map `HybridError` to a one-line message (the CLI: exit code 2; the service: 4xx).
Anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations


class HybridError(Exception):
    """A problem with the user's input, files or configuration (not a bug)."""


class ConfigError(HybridError, ValueError):
    """An invalid parameter value; the message names the parameter and the valid choices."""


class SpecError(ConfigError):
    """An invalid field of a search specification; `field` is its dotted path (e.g. `rerank.weight`)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.reason = field, message

    def within(self, parent: str) -> "SpecError":
        """The same error one level down: `within("fusion")` turns `alpha` into `fusion.alpha`."""
        return SpecError(f"{parent}.{self.field}", self.reason)
