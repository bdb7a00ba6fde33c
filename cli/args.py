"""Flag helpers: defaults and valid choices come from the domain's own objects, typed once."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from search.devices import DEVICES


def default(cls, name: str):
    """The default of dataclass field `name` of `cls`."""
    field = next(f for f in fields(cls) if f.name == name)
    return field.default_factory() if field.default is MISSING else field.default


def add_device(parser: argparse.ArgumentParser, help: str = "FAISS / ONNX device", default: str | None = "auto") -> None:
    parser.add_argument("--device", choices=DEVICES, default=default, help=help)


def add_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
