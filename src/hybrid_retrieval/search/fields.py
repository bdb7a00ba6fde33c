"""Title and text as weighted fields of the BM25 leg: `"text_fields": {"title": 3, "text": 1}`.

Without it, BM25 reads a document as one field, its title and text joined. With it, BM25F (Robertson, Zaragoza and
Taylor, "Simple BM25 extension to multiple weighted fields", CIKM 2004; Lucene's CombinedFieldQuery and
Elasticsearch's `combined_fields` follow the same idea): each field's term frequency, normalised by that field's
length against its average, is weighted and added, and the sum saturates once:

    tf~(t, d) = w_title * tf_title / (1 - b + b * |title_d| / avg|title|) + w_text * tf_text / (1 - b + b * |text_d| / avg|text|)
    score(q, d) = sum over query terms t of idf(t) * tf~ / (k1 + tf~),   idf from the documents holding t in any field

With one field of weight 1 this is Lucene's BM25 of that field. A term in both fields counts once, saturated once,
which is why BM25F beat a weighted sum of per-field BM25 scores on scifact (docs/experiments.md, 2026-11-29). A field
left out of `text_fields` (or weighted 0) is not searched: `{"title": 1}` matches titles only.
"""

from __future__ import annotations

import numpy as np

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.search import checks
from hybrid_retrieval.search.filters.types import short_text

TEXT_FIELDS = ("title", "text")
MAX_FIELD_WEIGHT = 100.0

FieldWeights = tuple[float, float]  # (title, text)


def check_text_fields(value: object) -> dict[str, float] | None:
    """A request's `text_fields`: weights of some of TEXT_FIELDS, one at least above 0; the others are 0."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise SpecError("text_fields", f'must be an object of field weights such as {{"title": 3, "text": 1}}, got {short_text(value)}')
    for name in value:
        if name not in TEXT_FIELDS:
            raise SpecError(("text_fields", name), f"unknown text field; valid: {', '.join(TEXT_FIELDS)}")
    weights = {name: checks.number(f"text_fields.{name}", value.get(name, 0.0), 0, MAX_FIELD_WEIGHT) for name in TEXT_FIELDS}
    if not any(weights.values()):
        raise SpecError("text_fields", "weights every field 0: give one a weight above 0")
    return weights


def weights_of(text_fields: dict[str, float]) -> FieldWeights:
    return text_fields["title"], text_fields["text"]


def length_norms(title_lengths: np.ndarray, lengths: np.ndarray, averages: tuple[float, float], b: float) -> tuple[np.ndarray, np.ndarray]:
    """1 - b + b * |field| / avg|field| of each document's title and text (its length less its title's)."""
    title = np.asarray(title_lengths, dtype=np.float64)
    text = np.asarray(lengths, dtype=np.float64) - title
    return 1.0 - b + b * title / max(averages[0], 1e-12), 1.0 - b + b * text / max(averages[1], 1e-12)


def saturated(
    tfs: np.ndarray, title_tfs: np.ndarray, title_norms: np.ndarray, text_norms: np.ndarray, weights: FieldWeights, k1: float
) -> np.ndarray:
    """tf~ / (k1 + tf~) of postings entries (module docstring); 0 where the weighted fields do not hold the term."""
    in_title = title_tfs.astype(np.float64)
    combined = weights[0] * in_title / title_norms + weights[1] * (tfs.astype(np.float64) - in_title) / text_norms
    return combined / (k1 + combined)
