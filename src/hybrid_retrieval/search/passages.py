"""A document's score from its passages' scores.

max    the best passage's score (MaxP): a document is as relevant as its most relevant part
soft   τ · log Σ exp(s_i / τ) over its `top` best passages: the best passage, plus a bonus of at most τ · log(top)
       for other passages that score nearly as well (τ → 0 is max)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybrid_retrieval.search.errors import ConfigError

AGGREGATIONS = ("max", "soft")


@dataclass(frozen=True)
class PassageScoring:
    aggregation: str = "max"
    temperature: float = 0.05  # soft: the score difference at which a second passage counts e times less
    top: int = 3  # soft: passages of a document that count

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(f"unknown passage aggregation {self.aggregation!r}; valid: {', '.join(AGGREGATIONS)}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or not 0 < self.temperature <= 10:
            raise ConfigError(f"passage temperature must be a number in (0, 10], got {self.temperature!r}")
        if isinstance(self.top, bool) or not isinstance(self.top, int) or not 1 <= self.top <= 100:
            raise ConfigError(f"passage top must be an integer from 1 to 100, got {self.top!r}")

    def to_dict(self) -> dict:
        return {"aggregation": self.aggregation, "temperature": self.temperature, "top": self.top}


def aggregate(scores: np.ndarray, rows: np.ndarray, scoring: PassageScoring) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct documents `rows` names, ascending; each one's score from its passages' `scores`)."""
    if not len(rows):
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
    order = np.lexsort((-scores, rows))  # by document, best passage first
    rows, scores = rows[order], np.asarray(scores[order], dtype=np.float64)
    firsts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    best = scores[firsts]
    if scoring.aggregation == "max":
        return rows[firsts], best.astype(np.float32)
    group = np.repeat(np.arange(len(firsts)), np.diff(np.r_[firsts, len(rows)]))
    rank = np.arange(len(rows)) - firsts[group]
    kept = rank < scoring.top
    weights = np.exp((scores[kept] - best[group[kept]]) / scoring.temperature)
    total = np.bincount(group[kept], weights=weights, minlength=len(firsts))
    return rows[firsts], (best + scoring.temperature * np.log(total)).astype(np.float32)
