"""Reranking stage: reorder the first stage's top candidates by cross-encoder score, optionally
interpolated with the first-stage score.

The one implementation every caller uses: the service (through the pipeline), `hybrid eval`
(`+rerank` pipelines) and `hybrid train-reranker` (tuning the interpolation weight).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid_retrieval.search import checks
from hybrid_retrieval.search.normalize import zscore
from hybrid_retrieval.search.ranking import Ranking

DEFAULT_RERANK_DEPTH = 50
MAX_RERANK_DEPTH = 200


def check_weight(weight: object) -> float:
    """The interpolation weight, or SpecError(`weight`): a number from 0 to 1 (NaN is not)."""
    return checks.number("weight", weight, 0, 1)


def interpolate(rerank_scores: np.ndarray, first_stage_scores: np.ndarray, weight: float) -> np.ndarray:
    """Final scores of one query's reranked candidates.

    weight 1: the cross-encoder logits (plain reranking). Otherwise
    weight * z(logits) + (1 - weight) * z(first-stage scores), z-scores over this query's candidates
    because logits and fused scores live on unrelated scales. A cross-encoder weaker than the first
    stage on some queries then corrects it instead of replacing it (Wang et al., "BERT-based Dense
    Retrievers Require Interpolation with BM25", ICTIR 2021); the weight is tuned on held-out queries.
    """
    if check_weight(weight) == 1.0:
        return np.asarray(rerank_scores, dtype=np.float32)
    if weight == 0.0:  # the first stage alone: a NaN logit must not leak in through 0 * NaN
        return zscore(np.asarray(first_stage_scores, np.float64)).astype(np.float32)
    mixed = weight * zscore(np.asarray(rerank_scores, np.float64)) + (1 - weight) * zscore(np.asarray(first_stage_scores, np.float64))
    return mixed.astype(np.float32)


@dataclass(frozen=True)
class Reranked:
    """A first-stage ranking whose top `depth` were reordered by final score (see `interpolate`); the
    rest follow in first-stage order, their scores shifted below the lowest reranked one so the list
    stays sorted (Elasticsearch's rescore window works the same way). Arrays align with `ranking`."""

    ranking: Ranking
    depth: int  # how many hits were reranked (the head of `ranking`)
    rerank_score: np.ndarray  # cross-encoder logit of the head (length `depth`)
    first_stage_rank: np.ndarray  # 1-based rank in the first-stage ranking
    first_stage_score: np.ndarray
    weight: float


class Reranker:
    """A cross-encoder (models.cross_encoder.CrossEncoder) over the index's document texts."""

    def __init__(
        self,
        model: Any,
        text_of: Callable[[int], str],
        name: str = "",
        texts_of: Callable[[np.ndarray], list[str]] | None = None,
        passage_text_of: Callable[[int, np.ndarray], str] | None = None,
    ):
        """`texts_of`, when given, reads many documents' texts at once (a sharded index: one call per shard).
        `passage_text_of(doc, query vector)`: a chunked index's best passage of a document, which the model reads instead
        of the document's head."""
        self.model, self.name, self.passage_text_of = model, name, passage_text_of
        self.texts_of = texts_of or (lambda ids: [text_of(int(i)) for i in ids])

    def rerank(self, query: str, candidates: Ranking, depth: int, weight: float, vector: np.ndarray | None = None) -> Reranked:
        """Rerank the top `depth` of `candidates` (ties keep the first-stage order); keep the rest below. With
        `vector` (the query's embedding) and passages, each document is read as its passage nearest the query."""
        head = candidates.head(depth)
        if self.passage_text_of is not None and vector is not None:
            texts = [self.passage_text_of(int(i), vector) for i in head.doc_idx]
        else:
            texts = self.texts_of(head.doc_idx)
        logits = np.asarray(self.model.score(query, texts), dtype=np.float32)
        final = interpolate(logits, head.scores, weight)
        order = np.argsort(-final, kind="stable")
        doc_idx, scores = head.doc_idx[order], final[order]
        tail = candidates.scores[len(head) :]
        if len(tail):  # below the reranked head, in first-stage order
            shifted = (tail - tail.max() + float(scores.min()) - 1.0).astype(np.float32)
            doc_idx, scores = np.concatenate([doc_idx, candidates.doc_idx[len(head) :]]), np.concatenate([scores, shifted])
        first_rank = np.concatenate([order + 1, np.arange(len(head) + 1, len(candidates) + 1)])
        return Reranked(Ranking(doc_idx, scores), len(head), logits[order], first_rank, candidates.scores[first_rank - 1], weight)
