"""The coordinator of a sharded index: what the service and `hybrid search` use in place of an OpenIndex, its
shards answering through clients (in process or on Ray Serve) that search.sharded fans out to and merges.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import numpy as np

from hybrid_retrieval.indexer import store
from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.manifest import IndexOpenError, read_manifest
from hybrid_retrieval.indexer.shards.layout import SHARDS_FILE, read_shards, shard_of
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.models.onnx_export import resolve_precision
from hybrid_retrieval.models.providers import on_gpu
from hybrid_retrieval.search.hits import Presenter
from hybrid_retrieval.search.postings import POSTINGS_DIR
from hybrid_retrieval.search.rerank import Reranker
from hybrid_retrieval.search.segments import CorpusStatistics
from hybrid_retrieval.search.sharded import ShardedColumns, ShardedHubness, ShardedPipeline, ShardGroup, by_owner


class ShardedIndex:
    """The coordinator's side of a sharded index: what the service and `hybrid search` use in place of an OpenIndex
    (pipeline, presenter, manifest, embedder), with the shards answering through `clients` (in process: ShardSearcher;
    Ray Serve deployments: cluster.serve). Queries are embedded here, once, with the index's model.

    `writers` (one per shard, in shard order) take the writes (`collection`); without them, or when the shards cannot
    take writes, the index is read-only and `read_only_reason` says why. Once any shard has taken a write, the
    corpus's BM25 statistics are no longer the split's: each BM25 leg first sums the shards' statistics of the query's
    terms (search.segments.CorpusStatistics) and every shard scores with them, as Elasticsearch's DFS query does."""

    def __init__(
        self,
        folder: Path | str,
        clients: list,
        device: str = "auto",
        query_precision: str = "auto",
        own: list | None = None,
        verify: str = "full",
        writers: list | None = None,
    ):
        self.path = Path(folder)
        self.info = read_shards(self.path)
        store.verify_inventory(self.path, self.info["model_files"], verify)  # the query model is the shards' model
        if len(clients) != len(self.info["shards"]) or (writers is not None and len(writers) != len(clients)):
            raise IndexOpenError(f"{self.path} has {len(self.info['shards'])} shards, {len(clients)} clients were given")
        first = read_manifest(self.path / self.info["shards"][0]["folder"])
        if first.embedder.model_checksum != self.info["model_checksum"]:
            raise IndexOpenError(f"{self.path}: shard-000 was embedded with another model than {SHARDS_FILE} names: split again")
        self.manifest = replace(
            first, counts={**first.counts, "documents": self.info["documents"]}, shard={"shards": len(clients), "hash": self.info["hash"]}
        )
        self.analyzer = first.analyzer
        self.shards = ShardGroup(clients)
        # in process the writers are the searchers themselves: one group, one describe
        self.writers = self.shards if writers is clients else ShardGroup(writers) if writers is not None else None
        self._own = own or []  # shards opened in this process, closed with it
        described = self.shards.all("describe")
        split_documents = self.info["documents"]  # positions below it are the split's; written documents get later ones
        self.owner = np.full(split_documents, -1, dtype=np.int32)
        for i, shard in enumerate(described):
            if shard["shard"]["index"] != i or shard["shard"]["shards"] != len(clients):
                raise IndexOpenError(f"{self.path}: shard {i} answers as shard {shard['shard']['index']} of {shard['shard']['shards']}")
            positions = np.asarray(shard["positions"])
            self.owner[positions[positions < split_documents]] = i
        # the writers know the latest writes (a search replica may not have caught up with them yet)
        latest = self.writers.all("describe") if self.writers not in (None, self.shards) else described
        self.written = any(shard["written"] for shard in latest)
        if not self.written and (self.owner < 0).any():
            raise IndexOpenError(f"{self.path}: {int((self.owner < 0).sum())} documents belong to no shard")
        # per shard, the writer's sequence number that searches must see (a replica catches up with its log first)
        self.visible = [int(shard["seq"]) for shard in latest]
        self.next_position = max([split_documents, *(int(np.max(d["positions"], initial=-1)) + 1 for d in latest)])
        self.documents_count = sum(int(shard["documents_alive"]) for shard in latest)
        self.embedder = OnnxEmbedder(self.path / store.MODEL_DIR, device=device, precision=first.embedder.document_precision)
        self.query_precision = resolve_precision(query_precision, self.path / store.MODEL_DIR, on_gpu(self.embedder))
        self.hubness = None
        if first.hubness is not None:
            biases = [shard["max_bias"] for shard in described if shard["max_bias"] is not None]
            self.hubness = ShardedHubness(first.hubness.params, {name: max(b[name] for b in biases) for name in biases[0]})
        self.metadata = None
        if any(info.filterable for info in first.metadata.values()):
            self.metadata = ShardedColumns(first.metadata, self.shards, self.owners, self.consistency)
        self.read_only_reason = self._read_only_reason()

    def _read_only_reason(self) -> str | None:
        if self.hubness is not None:
            return (
                "a sharded index with a fitted hubness correction takes no writes (its shards do not carry the banks "
                "that extend it to new documents): split an index without one, or write to the whole index and split again"
            )
        missing = [shard["folder"] for shard in self.info["shards"] if not (self.path / shard["folder"] / POSTINGS_DIR).is_dir()]
        if missing:
            return f"{', '.join(missing[:3])} were split before shards took writes (no {POSTINGS_DIR}/): split the index again"
        return "this sharded index was opened read-only" if self.writers is None else None

    @property
    def num_docs(self) -> int:
        return self.info["documents"]

    @functools.cached_property
    def query_embedder(self):
        if self.query_precision == self.manifest.embedder.document_precision:
            return self.embedder
        return OnnxEmbedder(self.path / store.MODEL_DIR, device="cpu", precision=self.query_precision)

    def consistency(self, query: str | None = None) -> dict:
        """What a shard request carries once the index took writes: the writer sequence number each shard must have
        caught up with (`min_seq`, by shard) and, for a BM25 leg of `query`, the corpus statistics of its terms."""
        if not self.written:
            return {}
        extras: dict = {"min_seq": list(self.visible)}
        if query is not None:
            terms = self.analyzer.query_terms(query)
            extras["statistics"] = CorpusStatistics.total(self.shards.all("statistics", terms, extras["min_seq"]))
        return extras

    def owners(self, positions: np.ndarray) -> np.ndarray:
        """The shard of each position (-1: written since the split, which shard is not recorded here)."""
        positions = np.asarray(positions, dtype=np.int64)
        out = np.full(len(positions), -1, dtype=np.int32)
        split = positions < len(self.owner)
        out[split] = self.owner[positions[split]]
        return out

    def document(self, position: int) -> dict:
        return self.documents(np.array([position]))[0]

    def documents(self, positions: np.ndarray) -> list[dict]:
        """Stored documents by position: one call to each shard that holds some (every shard, for written ones)."""
        positions = np.asarray(positions, dtype=np.int64)
        asked = by_owner(self.owners(positions), positions, len(self.shards))
        min_seq = self.consistency().get("min_seq", 0)
        answers = self.shards.some("documents", {i: (part, min_seq) for i, part in asked.items()})
        found: dict[int, dict] = {}
        for i, part in asked.items():
            found.update((int(p), doc) for p, doc in zip(part, answers[i]) if doc is not None)
        return [found[int(p)] for p in positions]

    def doc_texts(self, positions: np.ndarray) -> list[str]:
        return [indexed_text(doc["title"], doc["text"]) for doc in self.documents(positions)]

    def owner_of(self, doc_id: str) -> int:
        return int(shard_of([doc_id], len(self.shards))[0])

    def document_by_id(self, doc_id: str) -> dict | None:
        """The stored document with this id, from the shard its hash names."""
        return self.shards.clients[self.owner_of(doc_id)].document_by_id(doc_id)

    def pipeline(self, overrides: dict | None = None, executor=None, cross_encoder=None, cross_encoder_name: str = "", embedder=None):
        reranker = Reranker(cross_encoder, None, cross_encoder_name, texts_of=self.doc_texts) if cross_encoder is not None else None
        return ShardedPipeline(
            self.shards,
            embedder or self.query_embedder,
            self.manifest.defaults.merge(overrides),
            self.hubness,
            self.metadata,
            reranker,
            self.consistency,
        )

    def presenter(self, embedder=None):
        return Presenter(
            self.document, self.analyzer, embedder or self.embedder, list(self.manifest.metadata), self.metadata, documents=self.documents
        )

    def close(self) -> None:
        for searcher in self._own:
            searcher.close()
        self.shards.close()
        if self.writers not in (None, self.shards):
            self.writers.close()
