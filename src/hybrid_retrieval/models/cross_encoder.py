"""Cross-encoders: score (query, document) pairs jointly, for reranking.

`OnnxCrossEncoder` (the serving path, no torch) runs an export made by
`models.onnx_export.export_cross_encoder`; `TorchCrossEncoder` runs any sentence-transformers
`CrossEncoder` name or path and is the reference the ONNX path is tested against. Both return the
raw logit of each pair (no sigmoid), so scores from either backend are directly comparable.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from hybrid_retrieval.common.errors import ConfigError, SpecError
from hybrid_retrieval.models.batching import length_sorted, sequence_batch
from hybrid_retrieval.models.onnx_export import (
    CROSS_ENCODER_CONFIG,
    ONNX_SUBDIR,
    TOKENIZER_FILE,
    TRAINING_RECORD,
    export_cross_encoder,
    model_file,
    resolve_precision,
    trained_max_length,
    training_record,
)
from hybrid_retrieval.models.providers import (
    BACKENDS,
    encoding_feeds,
    load_tokenizer,
    onnx_session,
    session_runs,
    torch_device,
)
from hybrid_retrieval.models.registry import resolve_model
from hybrid_retrieval.search.rerank import check_weight

logger = logging.getLogger(__name__)


class CrossEncoder(Protocol):
    max_length: int

    def score(self, query: str, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """One float32 relevance logit per text, higher is more relevant."""

    def score_pairs(self, pairs: Sequence[tuple[str, str]], batch_size: int = 32) -> np.ndarray:
        """One logit per (query, text) pair."""


class _PairScorer:
    """`score` by the subclass's `score_pairs`."""

    def score(self: CrossEncoder, query: str, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return self.score_pairs([(query, t) for t in texts], batch_size)


class OnnxCrossEncoder(_PairScorer):
    def __init__(self, folder: Path, device: str = "auto", threads: int | None = None, precision: str = "fp32", workers: int | None = None):
        """`precision`: fp32, int8, or auto (int8 on CPU, fp32 on a GPU: models.onnx_export.resolve_precision).

        On CPU, `workers` runs go side by side (default: one per core), each on `threads` intra-op threads (default:
        1 beside other workers, all cores alone): a 128-token pair is too small a product to split across cores well,
        and one pool per model keeps concurrent reranks from oversubscribing them (docs/BENCHMARKS.md, "Rerankers")."""
        self.folder = folder = Path(folder)  # the export: its graphs, config and tokenizer
        self.config = json.loads((folder / CROSS_ENCODER_CONFIG).read_text())
        if int(self.config["num_labels"]) != 1:
            raise ConfigError(f"{folder}: a reranker needs one output logit, this model has {self.config['num_labels']}")
        self.max_length = int(self.config["max_length"])
        self._inputs = list(self.config["inputs"])
        self._tokenizer = load_tokenizer(
            folder / TOKENIZER_FILE, self.max_length, int(self.config["pad_token_id"]), self.config["pad_token"]
        )
        self._runs = runs = session_runs(device, workers, threads, "reranker")
        self.workers = runs.workers
        self.precision = precision = resolve_precision(precision, folder, gpu=runs.gpu)
        self._session = onnx_session(model_file(folder, precision), device, runs.threads)
        self.providers = self._session.get_providers()

    def token_counts(self, pairs: Sequence[tuple[str, str]]) -> list[int]:
        """Tokens of each (query, text) pair as the model reads it: truncated to max_length, unpadded."""
        return [sum(e.attention_mask) for e in self._tokenizer.encode_batch(list(pairs))]

    def score_pairs(self, pairs: Sequence[tuple[str, str]], batch_size: int = 32) -> np.ndarray:
        def batch_scores(batch: list[tuple[str, str]]) -> np.ndarray:
            feeds = encoding_feeds(self._tokenizer.encode_batch(batch), self._inputs)
            return self._session.run(None, feeds)[0][:, 0]

        size = min(sequence_batch(self.precision, batch_size), -(-len(pairs) // self.workers))  # every worker gets a share
        return length_sorted(batch_scores, pairs, max(1, size), np.empty(len(pairs), np.float32), self._runs.map)


class TorchCrossEncoder(_PairScorer):
    def __init__(self, name_or_path: str | Path, device: str = "auto", max_length: int | None = None):
        import torch
        from sentence_transformers import CrossEncoder as STCrossEncoder

        if max_length is None and Path(name_or_path).is_dir():
            max_length = trained_max_length(name_or_path)
        self._model = STCrossEncoder(str(name_or_path), device=torch_device(device), max_length=max_length)
        self.max_length = getattr(self._model, "max_seq_length", None) or self._model.max_length
        self._identity = torch.nn.Identity()

    def score_pairs(self, pairs: Sequence[tuple[str, str]], batch_size: int = 32) -> np.ndarray:
        if not pairs:
            return np.empty(0, dtype=np.float32)
        scores = self._model.predict(
            list(pairs), batch_size=batch_size, activation_fn=self._identity, convert_to_numpy=True, show_progress_bar=False
        )
        return np.asarray(scores, dtype=np.float32).reshape(len(pairs))


def load_cross_encoder(
    name_or_path: str | Path, backend: str = "onnx", device: str = "auto", precision: str = "fp32", workers: int | None = None
) -> CrossEncoder:
    """A cross-encoder from an ONNX export folder, a `hybrid train-reranker` folder, or any
    sentence-transformers CrossEncoder name or path (exported to the ONNX cache on first use)."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown reranker backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "torch":
        if precision == "int8":
            raise ConfigError("the torch reranker runs in fp32; int8 is an ONNX precision")
        return TorchCrossEncoder(name_or_path, device)
    path = Path(name_or_path).expanduser()
    for folder in (path, path / ONNX_SUBDIR):
        if (folder / CROSS_ENCODER_CONFIG).is_file():
            return OnnxCrossEncoder(folder, device, precision=precision, workers=workers)
    logger.info("no ONNX export at %s: exporting (needs torch)", name_or_path)
    return OnnxCrossEncoder(export_cross_encoder(resolve_model(str(name_or_path))), device, precision=precision, workers=workers)


def rerank_weight(name_or_path: str | Path, override: float | None = None) -> float:
    """The interpolation weight to serve with: `override`, else the tuned one, else 1 (plain reranking)."""
    if override is not None:
        return override
    tuned = tuned_weight(name_or_path)
    return 1.0 if tuned is None else tuned


def tuned_weight(name_or_path: str | Path) -> float | None:
    """The interpolation weight `hybrid train-reranker` tuned on held-out queries (None: not ours or untuned)."""
    weight = ((training_record(name_or_path) or {}).get("interpolation") or {}).get("weight")
    try:
        return None if weight is None else check_weight(weight)
    except SpecError:
        raise ConfigError(
            f"{TRAINING_RECORD} of {name_or_path}: interpolation weight must be a number between 0 and 1, got {weight!r}"
        ) from None


def weight_evidence(name_or_path: str | Path) -> dict | None:
    """What `hybrid train-reranker` measured when it chose the weight: the held-out queries' nDCG@10 of the
    first stage, the cross-encoder alone and the blend, and whether reranking gained (None: not tuned by us)."""
    record = training_record(name_or_path) or {}
    tuned = record.get("interpolation")
    if not tuned:
        return None
    dev, weight = tuned["dev"], tuned["weight"]
    values = {
        "first stage": dev["ndcg@10"]["first_stage"],
        "cross-encoder alone": dev["ndcg@10"]["reranker_only"],
        f"blend w={weight:g}, in-sample": dev["ndcg@10"]["interpolated"],
    }
    if "chosen_out_of_sample" in dev["ndcg@10"]:
        values["blend, weight chosen out of sample"] = dev["ndcg@10"]["chosen_out_of_sample"]
    return {
        "metric": "ndcg@10",
        "queries": dev["queries"],
        "split": f"held out of {record['data']['split']}",
        "values": values,
        "decision": f"rerank by default at weight {weight:g}" if _gained(tuned) else "no gain: reranking off by default",
    }


def reranking_gained(name_or_path: str | Path) -> bool | None:
    """Whether `hybrid train-reranker` found that reranking beats the first stage on held-out queries (None:
    not tuned by us). Older records without the out-of-sample check count a weight above 0 as a gain."""
    tuned = (training_record(name_or_path) or {}).get("interpolation")
    return _gained(tuned) if tuned else None


def _gained(interpolation: dict) -> bool:
    return bool(interpolation.get("gain", interpolation["weight"] > 0))


class CachingCrossEncoder:
    """Remembers scores by (query, text): pipelines evaluated side by side, or one query reranked at
    several weights, score each pair once."""

    def __init__(self, model: CrossEncoder):
        self.model, self.max_length = model, model.max_length
        self._scores: dict[tuple[str, str], float] = {}

    def score(self, query: str, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if (query, t) not in self._scores))
        if missing:
            self._scores.update(zip(((query, t) for t in missing), self.model.score(query, missing, batch_size).tolist()))
        return np.array([self._scores[(query, t)] for t in texts], dtype=np.float32)
