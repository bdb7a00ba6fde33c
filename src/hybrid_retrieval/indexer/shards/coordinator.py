"""The coordinator of a sharded index: what the service and `hybrid search` use in place of an OpenIndex, its
shards answering through clients (in process or on Ray Serve) that search.sharded fans out to and merges.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from hybrid_retrieval.indexer import store
from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.manifest import IndexOpenError, Manifest, read_manifest
from hybrid_retrieval.indexer.shards.layout import SHARDS_FILE, read_shards, shard_of
from hybrid_retrieval.indexer.shards.shard import ShardSearcher
from hybrid_retrieval.indexer.shards.wire import ShardDescription, ShardReader, ShardWriter
from hybrid_retrieval.models.cross_encoder import CrossEncoder
from hybrid_retrieval.models.embedder import Embedder, OnnxEmbedder
from hybrid_retrieval.models.onnx_export import resolve_precision
from hybrid_retrieval.models.providers import on_gpu
from hybrid_retrieval.search.hits import Presenter
from hybrid_retrieval.search.postings import POSTINGS_DIR
from hybrid_retrieval.search.rerank import Reranker
from hybrid_retrieval.search.segments import CorpusStatistics
from hybrid_retrieval.search.sharded import (
    Consistency,
    MinSeq,
    ShardedColumns,
    ShardedHubness,
    ShardedPipeline,
    ShardGroup,
    by_owner,
)


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
        clients: Sequence[ShardReader],
        device: str = "auto",
        query_precision: str = "auto",
        own: Sequence[ShardSearcher] = (),
        verify: str = "full",
        writers: Sequence[ShardWriter] | None = None,
    ):
        """`own`: the shards opened in this process, closed with it."""
        self.path = Path(folder)
        self.info = read_shards(self.path)
        first = self._first_manifest(len(clients), writers, verify)
        self.manifest = replace(
            first, counts={**first.counts, "documents": self.info["documents"]}, shard={"shards": len(clients), "hash": self.info["hash"]}
        )
        self.analyzer = first.analyzer
        self.own = tuple(own)
        if writers is not None and writers is clients:  # in process the writers are the searchers: one group, one describe
            self.writers: ShardGroup[ShardWriter] | None = ShardGroup(writers)
            self.shards: ShardGroup[ShardReader] = self.writers
        else:
            self.shards, self.writers = ShardGroup(clients), ShardGroup(writers) if writers is not None else None
        described = self.shards.all(lambda shard: shard.describe())
        self.owner = self._owners(described)
        # the writers know the latest writes (a search replica may not have caught up with them yet)
        apart = self._writers_apart()
        latest = apart.all(lambda writer: writer.describe()) if apart is not None else described
        self.written = any(shard.written for shard in latest)
        if not self.written and (self.owner < 0).any():
            raise IndexOpenError(f"{self.path}: {int((self.owner < 0).sum())} documents belong to no shard")
        # per shard, the writer's sequence number that searches must see (a replica catches up with its log first)
        self.visible = [shard.seq for shard in latest]
        self.next_position = max([self.num_docs, *(int(np.max(shard.positions, initial=-1)) + 1 for shard in latest)])
        self.documents_count = sum(shard.documents_alive for shard in latest)
        self.fields = all(shard.fields for shard in described)  # every shard can weigh title and text (search.fields)
        self.embedder = OnnxEmbedder(self.path / store.MODEL_DIR, device=device, precision=first.embedder.document_precision)
        self.query_precision = resolve_precision(query_precision, self.path / store.MODEL_DIR, on_gpu(self.embedder))
        self.hubness: ShardedHubness | None = None
        if first.hubness is not None:
            biases = [shard.max_bias for shard in described if shard.max_bias is not None]
            self.hubness = ShardedHubness(first.hubness.params, {name: max(b[name] for b in biases) for name in biases[0]})
        self.metadata: ShardedColumns | None = None
        if any(info.filterable for info in first.metadata.values()):
            self.metadata = ShardedColumns(first.metadata, self.shards, self.owners, self.min_seq)
        self.read_only_reason = self._read_only_reason()

    def _first_manifest(self, clients: int, writers: Sequence[ShardWriter] | None, verify: str) -> Manifest:
        """shard-000's manifest, once the query model and the number of clients are checked against shards.json."""
        store.verify_inventory(self.path, self.info["model_files"], verify)  # the query model is the shards' model
        if clients != len(self.info["shards"]) or (writers is not None and len(writers) != clients):
            raise IndexOpenError(f"{self.path} has {len(self.info['shards'])} shards, {clients} clients were given")
        first = read_manifest(self.path / self.info["shards"][0]["folder"])
        if first.embedder.model_checksum != self.info["model_checksum"]:
            raise IndexOpenError(f"{self.path}: shard-000 was embedded with another model than {SHARDS_FILE} names: split again")
        return first

    def _owners(self, described: list[ShardDescription]) -> np.ndarray:
        """The shard of each position of the split (-1: none answers for it), after checking each shard's number."""
        owner = np.full(self.num_docs, -1, dtype=np.int32)  # positions below it are the split's; writes get later ones
        for i, shard in enumerate(described):
            if shard.index != i or shard.shards != len(described):
                raise IndexOpenError(f"{self.path}: shard {i} answers as shard {shard.index} of {shard.shards}")
            owner[shard.positions[shard.positions < self.num_docs]] = i
        return owner

    def _writers_apart(self) -> ShardGroup[ShardWriter] | None:
        """The writers when they are not the searching clients (Ray Serve's writer deployments)."""
        return self.writers if self.writers is not self.shards else None

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
    def query_embedder(self) -> OnnxEmbedder:
        if self.query_precision == self.manifest.embedder.document_precision:
            return self.embedder
        return OnnxEmbedder(self.path / store.MODEL_DIR, device="cpu", precision=self.query_precision)

    def min_seq(self) -> MinSeq:
        """By shard, the writer sequence number a shard must have caught up with before it answers, once the index
        took writes (empty: none)."""
        return tuple(self.visible) if self.written else ()

    def consistency(self, query: str | None = None, fields: bool = False, variants: Sequence[str] = ()) -> Consistency:
        """What a shard search request carries: min_seq and, for a BM25 leg of `query` once the index took writes or
        when it weighs `fields` (whose average lengths the split's scores do not hold), the corpus statistics of its
        terms and of its typos' `variants`."""
        min_seq = self.min_seq()
        if query is None or not (min_seq or fields):
            return Consistency(min_seq)
        terms = [*self.analyzer.query_terms(query), *variants]
        return Consistency(min_seq, CorpusStatistics.total(self.shards.all(lambda shard: shard.statistics(terms, min_seq))))

    def owners(self, positions: np.ndarray) -> np.ndarray:
        """The shard of each position (-1: written since the split, which shard is not recorded here)."""
        positions = np.asarray(positions, dtype=np.int64)
        out = np.full(len(positions), -1, dtype=np.int32)
        split = positions < len(self.owner)
        out[split] = self.owner[positions[split]]
        return out

    def document(self, position: int) -> dict[str, Any]:
        return self.documents(np.array([position]))[0]

    def documents(self, positions: np.ndarray) -> list[dict[str, Any]]:
        """Stored documents by position: one call to each shard that holds some (every shard, for written ones)."""
        positions = np.asarray(positions, dtype=np.int64)
        asked = by_owner(self.owners(positions), positions, len(self.shards))
        min_seq = self.min_seq()
        answers = self.shards.some(lambda shard, part: shard.documents(part, min_seq), asked)
        found: dict[int, dict[str, Any]] = {}
        for i, part in asked.items():
            found.update((int(p), doc) for p, doc in zip(part, answers[i]) if doc is not None)
        return [found[int(p)] for p in positions]

    def doc_texts(self, positions: np.ndarray) -> list[str]:
        return [indexed_text(doc["title"], doc["text"]) for doc in self.documents(positions)]

    def owner_of(self, doc_id: str) -> int:
        return int(shard_of([doc_id], len(self.shards))[0])

    def document_by_id(self, doc_id: str) -> dict[str, Any] | None:
        """The stored document with this id, from the shard its hash names."""
        return self.shards.clients[self.owner_of(doc_id)].document_by_id(doc_id)

    def positions_of(self, ids: Sequence[str]) -> list[int | None]:
        """Each document's position (None: no such document), from the shards its hash names (curation's pins)."""
        owners, min_seq = shard_of(list(ids), len(self.shards)), self.min_seq()
        asked = {int(shard): [doc_id for doc_id, owner in zip(ids, owners) if owner == shard] for shard in set(owners.tolist())}
        found = self.shards.some(lambda shard, part: dict(zip(part, shard.positions_of(part, min_seq))), asked)
        return [found[int(owner)][doc_id] for doc_id, owner in zip(ids, owners)]

    def pipeline(
        self,
        overrides: dict[str, Any] | None = None,
        executor: ThreadPoolExecutor | None = None,  # as OpenIndex.pipeline's; the shards run the legs
        cross_encoder: CrossEncoder | None = None,
        cross_encoder_name: str = "",
        embedder: Embedder | None = None,
    ) -> ShardedPipeline:
        reranker = None
        if cross_encoder is not None:  # texts_of reads each shard's texts in one call; text_of is then never used
            reranker = Reranker(cross_encoder, None, cross_encoder_name, texts_of=self.doc_texts)  # type: ignore[arg-type]
        return ShardedPipeline(
            self.shards,
            embedder or self.query_embedder,
            self.manifest.defaults.merge(overrides),
            self.hubness,
            self.metadata,
            self.consistency,
            reranker,
            fields=self.fields,
            positions_of=self.positions_of,
            analyzer=self.analyzer,
        )

    def presenter(self, embedder: Embedder | None = None) -> Presenter:
        return Presenter(
            self.document, self.analyzer, embedder or self.embedder, list(self.manifest.metadata), self.metadata, documents=self.documents
        )

    def close(self) -> None:
        for searcher in self.own:
            searcher.close()
        self.shards.close()
        apart = self._writers_apart()
        if apart is not None:
            apart.close()
