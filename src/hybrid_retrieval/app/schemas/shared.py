"""What the bodies of every resource share: JSON numbers as sent, strict objects, the character classes of
names and text, and fields documented for the schema only."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

CONTROL_CHARS = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"  # C0 and C1 controls, except tab, newline, carriage return
# Python's str.isspace outside the controls, spelled out: JSON Schema's \s (ECMAScript) differs (U+FEFF, U+0085)
SPACE_CHARS = r"\t\n\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def documented(description: str, **schema: Any) -> Any:
    """An optional field (default None) whose `schema` (a range, the choices) only documents it: the code it is
    passed to checks it, naming the problem in its own words."""
    return Field(default=None, description=description, json_schema_extra=schema)


def _json_number(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("must be a number, not true or false")
    if isinstance(value, str):
        raise ValueError("must be a number, not a string")
    return value


# JSON types as sent (StrictBool for flags): no "yes" -> true, "8" -> 8, 1 -> true or true -> 1 (an integral 1.0 is an
# integer in JSON Schema)
Int = Annotated[int, BeforeValidator(_json_number)]
Float = Annotated[float, BeforeValidator(_json_number)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
