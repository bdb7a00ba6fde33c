"""What a failed call raises: one class per kind of failure, each carrying the status and the server's detail."""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """A call the server refused or could not answer."""

    def __init__(self, message: str, status: int | None = None, detail: Any = None):
        super().__init__(message)
        self.status, self.detail = status, detail


class ValidationError(ClientError):
    """422: the request is invalid (also raised before sending a document the client can tell is invalid). `field` is
    the path of the first invalid field, as the server names it (e.g. ["body", "fusion", "alpha"]); `errors` every
    one of them."""

    def __init__(self, message: str, status: int, detail: Any):
        super().__init__(message, status, detail)
        self.errors: list[dict] = detail if isinstance(detail, list) else []
        self.field: list[str | int] = list(self.errors[0].get("loc", [])) if self.errors else []


class AuthError(ClientError):
    """401 (no key) or 403 (a wrong key, a read key for a write, a key scoped to other collections)."""


class NotFound(ClientError):
    """404: no such collection, alias, document, task or snapshot."""


class Conflict(ClientError):
    """409: the name is taken, an alias points to it, the collection takes no writes now, a limit is reached."""


class PayloadTooLarge(ClientError):
    """413: the body is over the server's limit (split the batch)."""


class Unavailable(ClientError):
    """503, 429, 504, 507 or no connection: the server cannot answer now. Idempotent calls were retried first.
    `retry_after`: the seconds the server asked to wait, if it said."""

    def __init__(self, message: str, status: int | None = None, detail: Any = None, retry_after: float | None = None):
        super().__init__(message, status, detail)
        self.retry_after = retry_after


class ServerError(ClientError):
    """500 and any other status the client does not expect."""


_BY_STATUS: dict[int, type[ClientError]] = {401: AuthError, 403: AuthError, 404: NotFound, 409: Conflict, 413: PayloadTooLarge}


def error_for(status: int, detail: Any, retry_after: float | None = None) -> ClientError:
    """The exception for a response with `status` and the server's `detail` (a message, or 422's list of errors)."""
    if status == 422:
        errors = detail if isinstance(detail, list) else []
        where = ".".join(str(part) for part in errors[0].get("loc", [])) if errors else ""
        message = errors[0].get("msg", "invalid request") if errors else str(detail)
        return ValidationError(f"{where}: {message}" if where else message, status, detail)
    message = f"{status}: {detail}"
    if status in (429, 503, 504, 507):
        return Unavailable(message, status, detail, retry_after)
    return _BY_STATUS.get(status, ServerError)(message, status, detail)
