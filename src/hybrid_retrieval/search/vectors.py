"""Vectors that applications send (a document's embedding, a search's query vector): checked and made unit length, so
inner products stay cosines like those of the collection's own model."""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

from hybrid_retrieval.common.errors import Loc, SpecError

MAX_DIMENSION = 8192
_PLAIN = frozenset((int, float))


def check_vector(value: object, dimension: int, where: str | Loc) -> np.ndarray:
    """`value` as a unit float32 vector: SpecError naming `where` unless it is a list of `dimension` finite numbers,
    not all zero."""
    # JSON's numbers are ints and floats: checked by their type first (the ABC check costs ten times more)
    if not isinstance(value, list) or not all(type(x) in _PLAIN or (isinstance(x, Real) and not isinstance(x, bool)) for x in value):
        raise SpecError(where, f"must be a list of {dimension} numbers")
    if len(value) != dimension:
        raise SpecError(where, f"has {len(value)} dimensions; this collection's vectors have {dimension}")
    try:
        vector = np.asarray(value, dtype=np.float64)
    except OverflowError:  # an integer past float64's range
        vector = np.full(1, np.inf)
    if not np.isfinite(vector).all():
        raise SpecError(where, "holds a value that is not a finite number (NaN or infinity)")
    with np.errstate(over="ignore"):
        norm = float(np.linalg.norm(vector))
    if math.isinf(norm):
        raise SpecError(where, "its length (norm) overflows a 64-bit float: scale it down (only its direction counts)")
    if not norm or not np.isfinite(vector / norm).all():
        raise SpecError(where, "is the zero vector (or too close to it), which has no direction to compare")
    return (vector / norm).astype(np.float32)
