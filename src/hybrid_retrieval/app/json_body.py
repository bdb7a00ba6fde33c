"""The one place request bodies are parsed: hostile JSON becomes a 422 naming the field, never a 500.

Every route's body (search, batch, document writes as JSON or NDJSON, deletes) is parsed here. Beyond JSON syntax:
- numbers must fit a 64-bit float (an integer of 400 digits, `1e400`, `NaN` and `Infinity` are refused);
- strings must be valid Unicode (a lone surrogate escape such as "\\ud800" is refused), and are normalised to NFC,
  so that the same text typed two ways is one id, one keyword and one query;
- nesting is at most MAX_NESTING levels.
Errors are SpecErrors located in the body (`documents[3].metadata.year`; `body` for the body as a whole), which
the service answers with 422.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from hybrid_retrieval.common import fastjson
from hybrid_retrieval.common.errors import Loc, SpecError

MAX_NESTING = 64
_NUMBERS = frozenset({int, float, bool, type(None)})  # a list of only these (a vector) needs no visit by clean
_MAX_NUMBER_CHARS = 400  # a float's longest useful decimal form is far shorter; int() refuses 4,300+ digits


class _OutOfRange:
    """A number the parser met that no float can hold: reported with its path by the walk."""

    def __init__(self, text: str):
        self.text = text


def _parse_int(text: str) -> int | _OutOfRange:
    if len(text) > _MAX_NUMBER_CHARS:
        return _OutOfRange(text)
    value = int(text)
    try:
        float(value)
    except OverflowError:
        return _OutOfRange(text)
    return value


def _parse_float(text: str) -> float | _OutOfRange:
    if len(text) > _MAX_NUMBER_CHARS:
        return _OutOfRange(text)
    value = float(text)
    return value if math.isfinite(value) else _OutOfRange(text)


def parse_json(text: str, where: Loc = ()) -> Any:
    """`text` as a checked, NFC-normalised JSON value; SpecError located under `where` (the body's root: ())."""
    try:
        value = fastjson.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_OutOfRange)
    except json.JSONDecodeError as exc:
        raise SpecError(where or ("body",), f"not JSON ({exc.msg} at character {exc.pos})") from None
    except RecursionError:
        raise SpecError(where or ("body",), f"nested too deeply: at most {MAX_NESTING} levels") from None
    return clean(value, where)


def parse_body(body: bytes, ndjson: bool = False) -> Any:
    """A request body: one JSON value, or with `ndjson` a list of the values of its non-blank lines."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError("body", f"not UTF-8 (byte {exc.start})") from None
    if not ndjson:
        return parse_json(text)
    # "\n" only: str.splitlines would also split inside strings at U+2028, U+2029 or U+0085, which JSON allows
    return [parse_json(line, (f"line {number}",)) for number, line in enumerate(text.split("\n"), start=1) if line.strip()]


def clean(value: Any, where: Loc = ()) -> Any:
    """`value` (from fastjson.loads with the hooks above) checked and with every string NFC-normalised; iterative, so
    depth costs no recursion."""
    root = [value]
    stack: list[tuple[Any, Any, Loc, int]] = [(root, 0, where, 0)]  # (container, key, path, depth)
    while stack:
        container, key, path, depth = stack.pop()
        item = container[key]
        if isinstance(item, (dict, list)) and depth >= MAX_NESTING:
            raise SpecError(path or ("body",), f"nested too deeply: at most {MAX_NESTING} levels")
        if isinstance(item, dict):
            if not all(name.isascii() for name in item):  # ASCII is valid and normalised already
                item = {_text(name, path): v for name, v in item.items()}
                container[key] = item
            stack.extend((item, name, (*path, name), depth + 1) for name in item)
        elif isinstance(item, list):
            if not _NUMBERS.issuperset(map(type, item)):
                stack.extend((item, i, (*path, i), depth + 1) for i in range(len(item)))
        elif isinstance(item, str):
            if not item.isascii():
                container[key] = _text(item, path)
        elif isinstance(item, _OutOfRange):
            raise SpecError(
                path or ("body",),
                f"{item.text[:20]}{'...' if len(item.text) > 20 else ''} is not a number a 64-bit "
                "float can hold (nor are NaN and Infinity)",
            )
    return root[0]


def _text(text: str, path: Loc) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecError(path or ("body",), "not valid Unicode (a lone surrogate such as \\ud800)") from None
    return unicodedata.normalize("NFC", text)


class CheckedRequest(Request):
    """A request whose `json()` is `parse_body`: FastAPI's body parsing for the routes of CheckedRoute."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = parse_body(await self.body())
            except SpecError as exc:
                raise InvalidBody(exc) from None
        return self._json


class InvalidBody(HTTPException):
    """A SpecError raised while FastAPI reads a body, as a 422 in the shape of request validation errors (FastAPI
    turns anything but an HTTPException raised there into a bare 400)."""

    def __init__(self, error: SpecError):
        super().__init__(422, located(error))


def located(error: SpecError) -> list[dict[str, Any]]:
    """A SpecError as a 422's detail, in the shape of request validation errors: where (the field's path in the body,
    names kept whole) and what."""
    return [{"loc": list(body_loc(error)), "msg": str(error), "type": "value_error"}]


def body_loc(error: SpecError) -> Loc:
    """Where a SpecError points in a request: under "body" (which a whole-body error names itself)."""
    return error.loc if error.loc[:1] == ("body",) else ("body", *error.loc)


class CheckedRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            return await handler(CheckedRequest(request.scope, request.receive))

        return checked
