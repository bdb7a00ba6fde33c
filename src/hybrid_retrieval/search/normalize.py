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


def minmax(scores: np.ndarray, floor: float | None = None) -> np.ndarray:
    """(s - min_q) / (max_q - min_q); all equal -> 1 (each candidate is the best of the list)."""
    low, high = scores.min(initial=np.inf), scores.max(initial=-np.inf)
    span = high - low
    return np.ones_like(scores) if span <= 0 else (scores - low) / span


def zscore(scores: np.ndarray, floor: float | None = None) -> np.ndarray:
    """(s - mean_q) / std_q; std 0 -> 0 (every candidate is exactly average)."""
    std = scores.std() if len(scores) else 0.0
    return np.zeros_like(scores) if std <= 0 else (scores - scores.mean()) / std


def tmm(scores: np.ndarray, floor: float | None = None) -> np.ndarray:
    """Theoretical min-max: (s - m) / (max_q - m), m the scorer's theoretical minimum."""
    if floor is None:
        raise ValueError("tmm needs the scorer's theoretical minimum")
    span = scores.max(initial=-np.inf) - floor
    return np.ones_like(scores) if span <= 0 else (scores - floor) / span


def dbsf(scores: np.ndarray, floor: float | None = None) -> np.ndarray:
    """Distribution-based score fusion (Qdrant): (s - (mean - 3 std)) / (6 std); std 0 -> 0.5."""
    std = scores.std() if len(scores) else 0.0
    return np.full_like(scores, 0.5) if std <= 0 else (scores - (scores.mean() - 3 * std)) / (6 * std)


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
