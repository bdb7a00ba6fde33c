"""Batching helpers: length-sorted batches within one call, micro-batches across concurrent calls."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from hybrid_retrieval.search import budget

if TYPE_CHECKING:
    from hybrid_retrieval.models.cross_encoder import CrossEncoder
    from hybrid_retrieval.models.embedder import Embedder


def sequence_batch(precision: str, batch_size: int) -> int:
    """Sequences per model run. int8 graphs quantise activations per tensor, one scale for the whole batch (padding
    included): batched, a text's vector would depend on its companions, so they run one sequence at a time (which also
    saves the padding, and costs little: docs/experiments.md)."""
    return 1 if precision == "int8" else batch_size


def offline_workers(precision: str) -> int | None:
    """Side-by-side runs for offline embedding (a build, a re-embedding): int8 runs one sequence at a time, which one
    run cannot spread over the cores, so a sequence a core (None); fp32 batches spread well, and side by side would
    hold a batch's activations per core (one run)."""
    return None if precision == "int8" else 1


def length_sorted(
    run_batch: Callable[[list], np.ndarray], texts: Sequence, batch_size: int, out: np.ndarray, map_batches: Callable = map
) -> np.ndarray:
    """Fill `out` (one row per text, or per (query, text) pair) batch by batch, batching inputs of
    similar length together (less padding). `map_batches` runs the batches (an executor's map: side by side).
    Each batch first checks the caller's request deadline (search.budget): a request past it stops here."""
    order = np.argsort([len(t) if isinstance(t, str) else sum(map(len, t)) for t in texts], kind="stable")
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    deadline = budget.current()  # read in the caller's thread: an executor's threads do not share its context

    def run(idx: np.ndarray) -> np.ndarray:
        if deadline is not None:
            deadline.check("model inference")
        return run_batch([texts[i] for i in idx])

    for idx, rows in zip(batches, map_batches(run, batches)):
        out[idx] = rows
    return out


class _Request:
    __slots__ = ("done", "error", "items", "result")
    items: list
    done: threading.Event
    result: np.ndarray | None  # the rows of `items`, once the run is done
    error: Exception | None  # or why the run failed

    def __init__(self, items: list):
        self.items, self.done, self.result, self.error = items, threading.Event(), None, None


class MicroBatcher:
    """Coalesces concurrent calls into one model run, without a background thread or a fixed wait.

    Runs are serialised; calls that arrive while a run is in progress queue up, and the first of
    them (the leader) runs the whole queue as one batch when the model is free. An idle service
    answers a lone call at once; under load, batches grow with the queue. `run` maps a list of
    items to an array with one row per item.
    """

    def __init__(self, run: Callable[[list], np.ndarray]):
        self._run = run
        self._queue: list[_Request] = []
        self._queue_lock = threading.Lock()
        self._run_lock = threading.Lock()
        self.batches = 0  # runs and items so far: how much coalescing happened
        self.items = 0

    def __call__(self, items: list) -> np.ndarray:
        request = _Request(items)
        with self._queue_lock:
            self._queue.append(request)
            leader = len(self._queue) == 1
        if not leader:
            request.done.wait()
        else:
            with self._run_lock:
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._run_batch(batch)
        if request.error is not None:
            raise request.error
        assert request.result is not None  # a run that raised nothing set every request's rows
        return request.result

    def _run_batch(self, batch: list[_Request]) -> None:
        try:
            with budget.within(None):  # the run serves several requests: one request's deadline must not stop it
                rows = self._run([item for r in batch for item in r.items])
            start = 0
            for r in batch:
                r.result, start = rows[start : start + len(r.items)], start + len(r.items)
        except Exception as exc:  # every caller in the batch gets the error, not just the leader
            for r in batch:
                r.error = exc
        finally:
            self.batches += 1
            self.items += sum(len(r.items) for r in batch)
            for r in batch:
                r.done.set()


class BatchingEmbedder:
    """An embedder whose concurrent `encode` calls share model runs (see `MicroBatcher`)."""

    def __init__(self, embedder: Embedder, batch_size: int = 32):
        self.embedder, self.dimension = embedder, embedder.dimension
        self.token_ids = getattr(embedder, "token_ids", None)  # how the model sees a text (models.query_cache)
        self.batcher = MicroBatcher(lambda texts: embedder.encode(texts, batch_size=batch_size))

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return self.batcher(list(texts))


class LoadAwareEmbedder:
    """Runs a lone request on a session that uses every core, and concurrent ones on single-threaded sessions side by
    side: one request at a time is fastest with all cores, while several at once are fastest with one core each
    (intra-op threads of concurrent runs would oversubscribe the cores and spin against each other)."""

    def __init__(self, alone: Embedder, concurrent: Embedder, busy: Callable[[], bool]):
        self.alone, self.concurrent, self.busy, self.dimension = alone, concurrent, busy, alone.dimension
        self.token_ids = getattr(alone, "token_ids", None)  # how the model sees a text (models.query_cache)

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return (self.concurrent if self.busy() else self.alone).encode(texts, batch_size=batch_size)


class BatchingCrossEncoder:
    """A cross-encoder whose concurrent `score` calls (different queries) share model runs."""

    def __init__(self, model: CrossEncoder, batch_size: int = 32):
        self.model, self.max_length = model, model.max_length
        self.batcher = MicroBatcher(lambda pairs: model.score_pairs(pairs, batch_size=batch_size))

    def score(self, query: str, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return self.batcher([(query, t) for t in texts])

    def score_pairs(self, pairs: Sequence[tuple[str, str]], batch_size: int = 32) -> np.ndarray:
        return self.batcher(list(pairs))
