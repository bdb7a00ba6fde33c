"""Per-query score normalisations for convex-combination fusion.

Bruch, Gai, Ingber, "An Analysis of Fusion Functions for Hybrid Retrieval", ACM TOIS 2023.
Each takes the raw scores of one retriever over one query's candidates and returns values on a
comparable scale. Degenerate inputs (one candidate, all scores equal) map to a constant instead of
dividing by zero.
"""

from __future__ import annotations

import numpy as np

# Theoretical minimum of each scorer, for theoretical min-max: BM25 >= 0, cosine >= -1.
THEORETICAL_MIN = {"bm25": 0.0, "dense": -1.0}
# Scores closer than this, relative to their magnitude, are one score: a retriever's scores are float32 sums whose
# last bits depend on the order of the arithmetic (a document and its copy score 0.61234567 and 0.61234561), and
# scaling that noise by its own tiny spread would turn identical documents into the best and the worst.
RELATIVE_TOLERANCE = 1e-6


def minmax(scores: np.ndarray, floor: float | None = None) -> np.ndarray:
    """(s - min_q) / (max_q - min_q); all equal -> 1 (each candidate is the best of the list)."""
    if _all_equal(scores):
        return np.ones_like(scores)
    low, high = float(scores.min()), float(scores.max())
    scaled: np.ndarray = (scores - low) / (high - low)
    return scaled


def _all_equal(scores: np.ndarray) -> bool:
    """No spread to scale by: the scores differ by less than RELATIVE_TOLERANCE of their magnitude. Tested on the
    values, not on std: the std of equal floats is rounding noise (1e-17), which would turn them into +-1."""
    if not len(scores):
        return True
    low, high = float(scores.min()), float(scores.max())
    return bool(high - low <= RELATIVE_TOLERANCE * max(abs(low), abs(high)))


def zscore(scores: np.ndarray, floor: float | None = None) -> np.ndarray:
    """(s - mean_q) / std_q; equal scores -> 0 (every candidate is exactly average)."""
    if _all_equal(scores):
        return np.zeros_like(scores)
    mean, std = float(scores.mean()), float(scores.std())
    return (scores - mean) / std


def tmm(scores: np.ndarray, floor: float | None = None) -> np.ndarray:
    """Theoretical min-max: (s - m) / (max_q - m), m the scorer's theoretical minimum."""
    if floor is None:
        raise ValueError("tmm needs the scorer's theoretical minimum")
    span = scores.max(initial=-np.inf) - floor
    return np.ones_like(scores) if span <= 0 else (scores - floor) / span


def dbsf(scores: np.ndarray, floor: float | None = None) -> np.ndarray:
    """Distribution-based score fusion (Qdrant): (s - (mean - 3 std)) / (6 std); equal scores -> 0.5."""
    if _all_equal(scores):
        return np.full_like(scores, 0.5)
    mean, std = float(scores.mean()), float(scores.std())
    return (scores - (mean - 3 * std)) / (6 * std)


def identity(scores: np.ndarray, floor: float | None = None) -> np.ndarray:
    """No normalisation: raw scores (only meaningful when both scorers share a scale)."""
    copied: np.ndarray = scores.copy()
    return copied


NORMALIZERS = {"minmax": minmax, "zscore": zscore, "tmm": tmm, "dbsf": dbsf, "none": identity}


def normalize(scores: np.ndarray, method: str, floor: float) -> np.ndarray:
    """Normalise with `method`; `floor` is the scorer's theoretical minimum (used by tmm only)."""
    try:
        fn = NORMALIZERS[method]
    except KeyError:
        raise ValueError(f"unknown normalisation {method!r}; valid: {', '.join(NORMALIZERS)}") from None
    return fn(np.asarray(scores, dtype=np.float64), floor)
