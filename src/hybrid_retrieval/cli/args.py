"""Flag helpers: defaults and valid choices come from the domain's own objects, typed once."""

from __future__ import annotations

import argparse
import json
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Any

from hybrid_retrieval.common.devices import DEVICES
from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.models.onnx_export import SERVED_PRECISIONS
from hybrid_retrieval.search.filters.language import check_filter

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def default(cls: type[DataclassInstance], name: str) -> Any:
    """The default of dataclass field `name` of `cls` (of that field's type, which `name` picks at run time)."""
    field = next(f for f in fields(cls) if f.name == name)
    if field.default is MISSING:
        assert field.default_factory is not MISSING, f"{cls.__name__}.{name} has no default"
        return field.default_factory()
    return field.default


def add_device(parser: argparse.ArgumentParser, help: str = "FAISS / ONNX device", default: str | None = "auto") -> None:
    parser.add_argument("--device", choices=DEVICES, default=default, help=help)


def add_query_precision(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--query-precision",
        choices=SERVED_PRECISIONS,
        default="auto",
        help="weights that embed queries, as the service's HYBRID_QUERY_PRECISION (default auto: int8 on CPU, "
        "fp32 on a GPU): evaluate and tune what you serve",
    )


def add_quiet(parser: argparse._ActionsContainer) -> None:  # a parser or one of its argument groups
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def filter_json(text: str) -> dict | None:
    """`--filter` (the JSON filter of `POST /search`; search.filters): checked for shape here, for fields by the index."""
    try:
        return check_filter(json.loads(text))
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text[:80]!r}") from None
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_filter(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--filter", type=filter_json, help='metadata filter as JSON, as in POST /search, e.g. \'{"year": {"gte": 2015}}\'')
