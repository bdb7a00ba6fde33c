"""Labelled query splits for fitting: test queries are refused before a single one is read."""

from __future__ import annotations

import random
from pathlib import Path

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.indexer.corpus import CorpusError, read_qrels, read_queries


def refuse_test_split(qrels_path: Path | str) -> None:
    if Path(qrels_path).stem == "test":
        raise ConfigError(f"refusing {qrels_path}: test queries must never choose parameters; pass a train or dev split")


def training_split(queries_path: Path | str, qrels_path: Path | str) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """The judged queries of a train/dev split and their qrels."""
    refuse_test_split(qrels_path)
    qrels = read_qrels(qrels_path)
    all_queries = read_queries(queries_path)
    missing = sorted(set(qrels) - set(all_queries))
    if missing:
        raise CorpusError(qrels_path, None, f"{len(missing)} judged queries are not in {queries_path}, e.g. {missing[:3]}")
    return {qid: all_queries[qid] for qid in qrels}, qrels


def split_dev(queries: dict[str, str], qrels: dict[str, dict[str, int]], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Judged queries with a relevant document, shuffled and split into (train, dev) by query."""
    judged = sorted(q for q, rels in qrels.items() if q in queries and any(r > 0 for r in rels.values()))
    random.Random(seed).shuffle(judged)
    dev = min(len(judged) - 1, max(1, round(fraction * len(judged)))) if fraction > 0 and len(judged) > 1 else 0  # keep one to train
    return sorted(judged[dev:]), sorted(judged[:dev])
