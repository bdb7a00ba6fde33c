"""A cache of query embeddings: a repeated query skips the model.

Keyed by the model's checksum and the query as the model sees it: its token ids (an ONNX embedder's own tokenizer,
with its normalisation and truncation), so texts that differ only in what the tokenizer discards share an entry and a
vector is never served for a different model (a reload to another model misses). Embedders without a tokenizer key
on the exact text.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np


class QueryCache:
    """A thread-safe LRU of vectors, counting hits and misses."""

    def __init__(self, size: int, on_lookup: Callable[[int, int], None] | None = None):
        if size < 0:
            raise ValueError(f"query cache size must be >= 0, got {size}")
        self.size, self.on_lookup = size, on_lookup
        self._entries: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def hit_ratio(self) -> float:
        looked_up = self.hits + self.misses
        return self.hits / looked_up if looked_up else 0.0

    def get_many(self, keys: list[tuple]) -> list[np.ndarray | None]:
        with self._lock:
            found = [self._entries.get(key) for key in keys]
            for key, vector in zip(keys, found):
                if vector is not None:
                    self._entries.move_to_end(key)
            hits = sum(vector is not None for vector in found)
            self.hits, self.misses = self.hits + hits, self.misses + len(keys) - hits
        if self.on_lookup is not None:
            self.on_lookup(hits, len(keys) - hits)
        return found

    def put_many(self, keys: list[tuple], vectors: np.ndarray) -> None:
        if self.size == 0:
            return
        with self._lock:
            for key, vector in zip(keys, vectors):
                self._entries[key] = vector
                self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)


class CachedEmbedder:
    """An embedder whose `encode` answers cached queries from `cache` and embeds the others in one call."""

    def __init__(self, embedder, cache: QueryCache, model_checksum: str):
        self.embedder, self.cache, self.model_checksum = embedder, cache, model_checksum
        self.dimension = embedder.dimension
        self._token_ids = getattr(embedder, "token_ids", None)

    def keys(self, texts: Sequence[str]) -> list[tuple]:
        if self._token_ids is None:
            return [(self.model_checksum, text) for text in texts]
        return [(self.model_checksum, *ids) for ids in self._token_ids(texts)]

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        keys = self.keys(texts)
        found = self.cache.get_many(keys)
        missing = [i for i, vector in enumerate(found) if vector is None]
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for i, vector in enumerate(found):
            if vector is not None:
                out[i] = vector
        if missing:
            vectors = self.embedder.encode([texts[i] for i in missing], batch_size)
            out[missing] = vectors
            self.cache.put_many([keys[i] for i in missing], np.array(vectors, dtype=np.float32))  # copies: the caller may write to `out`
        return out
