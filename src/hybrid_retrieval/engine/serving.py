"""What the service is serving right now, and swapping it for a freshly opened index (hot reload)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from hybrid_retrieval.common.errors import Conflict, HybridError, SpecError
from hybrid_retrieval.engine.writable import WritableCollection
from hybrid_retrieval.indexer.leftovers import folder_bytes, remove_leftovers, temporary_bytes
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.live.fence import Closed
from hybrid_retrieval.indexer.live.replay import ReplayError
from hybrid_retrieval.indexer.live.view import ReadView
from hybrid_retrieval.indexer.shards.coordinator import ShardedIndex
from hybrid_retrieval.indexer.shards.open import open_any
from hybrid_retrieval.indexer.shards.writes import ShardedCollection, ShardedView
from hybrid_retrieval.indexer.store import MODEL_DIR, RERANKER_DIR, OpenIndex, model_identity
from hybrid_retrieval.indexer.wal import CorruptLog
from hybrid_retrieval.models.batching import BatchingCrossEncoder, BatchingEmbedder, LoadAwareEmbedder
from hybrid_retrieval.models.cross_encoder import (
    CrossEncoder,
    load_cross_encoder,
    rerank_weight,
    reranking_gained,
    tuned_weight,
    weight_evidence,
)
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.models.onnx_export import ONNX_SUBDIR
from hybrid_retrieval.models.providers import on_gpu
from hybrid_retrieval.models.query_cache import CachedEmbedder, QueryCache
from hybrid_retrieval.search.curation import CurationRule, check_rules
from hybrid_retrieval.search.hits import Presenter
from hybrid_retrieval.search.pipeline import SearchPipeline
from hybrid_retrieval.search.synonyms import Synonyms

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Serving:
    """An index snapshot and its pipeline, swapped as one object so a request never mixes two snapshots."""

    index: OpenIndex | ShardedIndex
    pipeline: SearchPipeline
    presenter: Presenter
    rerank_evidence: dict | None = None  # the reranker's tuned weight, when it is the one served
    collection: WritableCollection | None = None  # None: this index takes no writes (`write_refusal` says why)
    write_refusal: str | None = None
    view: ReadView | ShardedView | None = None
    curation_rules: tuple[CurationRule, ...] = ()  # the collection's (search.curation), from its manifest

    @property
    def documents(self) -> int:
        return self.view.documents if self.view is not None else self.index.num_docs

    @property
    def disk_bytes(self) -> int:
        """The size of its folder on disk."""
        return folder_bytes(self.index.path)

    @property
    def temporary_bytes(self) -> int:
        """Disk used beside its folder by builds and compactions in progress, or left by killed ones."""
        return temporary_bytes(self.index.path)

    @property
    def evidence(self) -> dict[str, dict]:
        """What each active default rests on: the index's fitted defaults and the reranker's weight."""
        return {**self.index.manifest.evidence, **({"rerank": self.rerank_evidence} if self.rerank_evidence else {})}


def open_folder(folder: Path, settings, embedder=None):
    """An index folder, whole or sharded (opened in this process), after removing what killed builds and compactions
    left beside it; `embedder`: a session shared with other collections of its model."""
    remove_leftovers(folder)
    return open_any(folder, verify=settings.verify, device=settings.device, query_precision=settings.query_precision, embedder=embedder)


def load_reranker(settings, batch: bool = False, folder: str | Path | None = None) -> CrossEncoder | None:
    """The cross-encoder in `folder`, default the one the settings name, loaded once for the life of the service
    (reloads keep it)."""
    folder = folder or settings.reranker
    if not folder:
        return None
    model = load_cross_encoder(folder, device=settings.device, precision=settings.reranker_precision, workers=settings.reranker_workers)
    return BatchingCrossEncoder(model) if batch else model


@dataclass(frozen=True)
class Reranking:
    """How a collection reranks: the cross-encoder (None: it does not), its name, the partial spec it puts over the
    index's defaults, and the evidence of its weight."""

    cross_encoder: CrossEncoder | None
    name: str
    spec: dict
    evidence: dict | None


class ReloadInProgress(RuntimeError):
    pass


class Resources:
    """What every served collection shares, made once: the settings, the search threads and policies, the reranker,
    the query-embedding cache, and one ONNX session per model, precision and thread count (collections of one model
    share them). `metrics`: where collections report (the service's Prometheus metrics); `in_flight`: the searches
    running now (`.active`), which writes yield cores to."""

    def __init__(self, settings, metrics, in_flight, executor=None, cross_encoder=None, batch: bool = False):
        self.settings, self.executor, self.batch = settings, executor, batch
        self.metrics, self.in_flight = metrics, in_flight
        # its keys carry the model files' identity, so another model never hits
        self.query_cache = QueryCache(settings.query_cache_size, on_lookup=self.metrics.observe_query_cache)
        self.metrics.query_cache_hit_ratio.set_function(self.query_cache.hit_ratio)
        self._sessions: dict[tuple, OnnxEmbedder] = {}  # (model identity, precision, device, threads) -> session
        self._sessions_lock = threading.Lock()
        self._own_rerankers: dict[str, CrossEncoder | None] = {}  # an index's own reranker, by its files' checksums
        self._own_reranking: dict[int, Reranking] = {}  # by id of the opened index, dropped when it is released
        tuned = rerank_weight(settings.reranker) if settings.reranker else None
        gained = reranking_gained(settings.reranker) if settings.reranker else None
        self.reranking = Reranking(
            cross_encoder,
            settings.reranker or (type(cross_encoder).__name__ if cross_encoder is not None else ""),
            settings.spec_overrides(reranking=cross_encoder is not None, tuned_weight=tuned, gained=gained),
            weight_evidence(settings.reranker) if settings.reranker and settings.rerank_weight is None else None,
        )
        if cross_encoder is not None:
            self._log(self.reranking)

    def _log(self, reranking: Reranking) -> None:
        rerank = reranking.spec["rerank"]
        logger.info(
            "reranking with %s (%s) on the top %d, weight %g, by default=%s",
            reranking.name,
            self.settings.reranker_precision,
            rerank["depth"],
            rerank["weight"],
            rerank["enabled"],
        )

    def reranking_of(self, index) -> Reranking:
        """The service's reranker (HYBRID_RERANKER) when it has one, else the index's own (`hybrid optimize` puts one in
        the index when reranking beat the first stage on held-out queries): made once per opened index (refreshes
        reuse it), its model loaded once per set of files and shared."""
        folder = index.path / RERANKER_DIR if isinstance(index, OpenIndex) else None
        if self.reranking.cross_encoder is not None or folder is None or not (folder / ONNX_SUBDIR).is_dir():
            return self.reranking
        with self._sessions_lock:
            if id(index) not in self._own_reranking:
                files = {k: v for k, v in index.manifest.files.items() if k.startswith(RERANKER_DIR + "/")}
                key = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest() if files else str(folder)
                if key not in self._own_rerankers:
                    self._own_rerankers[key] = load_reranker(self.settings, self.batch, folder / ONNX_SUBDIR)
                weakref.finalize(index, self._own_reranking.pop, id(index), None)
                self._own_reranking[id(index)] = Reranking(
                    self._own_rerankers[key],
                    f"{index.path.name}/{RERANKER_DIR}",
                    self.settings.spec_overrides(reranking=True, tuned_weight=tuned_weight(folder), gained=True),
                    weight_evidence(folder) if self.settings.rerank_weight is None else None,
                )
                self._log(self._own_reranking[id(index)])
            return self._own_reranking[id(index)]

    def session(self, folder: Path, identity: str, precision: str, device: str = "cpu", threads: int | None = None) -> OnnxEmbedder:
        """The session of the model in `folder` (whose files have `identity`: indexer.store.model_identity), opened once."""
        key = (identity, precision, device, threads)
        with self._sessions_lock:
            if key not in self._sessions:
                self._sessions[key] = OnnxEmbedder(folder, device=device, threads=threads, precision=precision)
                logger.info("%s session of %s on %s, %s thread(s)", precision, folder, device, threads or "all")
            return self._sessions[key]

    def keep_sessions(self, identities: set[str]) -> None:
        """Release the sessions of models no served collection uses any more."""
        with self._sessions_lock:
            self._sessions = {key: session for key, session in self._sessions.items() if key[0] in identities}


class Reloader:
    """One served collection: the index it serves now (`serving`), the writes it takes, and swapping in a freshly
    opened index (hot reload) or a refreshed read view atomically.

    Requests already running keep the `Serving` they started with; the old index is released when
    the last of them finishes. A failed reload leaves the current index in service.
    """

    def __init__(self, name: str, resources: Resources, opener):
        self.name, self.resources, self.settings = name, resources, resources.settings
        self.opener = opener  # what a reload opens
        self.serving: Serving | None = None
        self._compaction: threading.Thread | None = None  # the last background compaction started
        self._rules: tuple[list[dict], tuple[CurationRule, ...]] = ([], ())  # the manifest's curation, parsed once
        self._lock = threading.Lock()

    def open(self, index: OpenIndex | ShardedIndex) -> Serving:
        """Serve `index` and the writes its log holds; writes go to its collection when the index can take them."""
        collection, refusal = self._collection(index)
        previous = self.serving
        serving = self._publish(index, collection.view if collection else None, collection, refusal)
        if previous is not None and previous.collection is not None and previous.collection is not collection:
            previous.collection.close()  # its log is now the new collection's to write
        logger.info(
            "serving %s from %s: %d documents, built %s, defaults %s",
            self.name,
            index.path,
            serving.documents,
            index.manifest.created_at,
            serving.pipeline.defaults.to_string(),
        )
        return serving

    def _collection(self, index: OpenIndex | ShardedIndex) -> tuple[WritableCollection | None, str | None]:
        """The live collection that takes the index's writes, or why it takes none."""
        try:
            if isinstance(index, ShardedIndex):  # each shard's writer embeds its own documents
                sharded = ShardedCollection(index, self.settings.max_batch_docs)
                sharded.on_refresh = functools.partial(self._publish_view, sharded)
                return sharded, None
            in_flight = self.resources.in_flight
            whole = Collection(
                index, self.settings.max_batch_docs, write_threads=self.settings.write_threads, searching=lambda: in_flight.active > 0
            )
            whole.on_refresh = functools.partial(self._publish_view, whole)
            return whole, None
        except (CorruptLog, ReplayError):  # serving the index without its logged writes would hide them: refuse
            raise
        except HybridError as exc:
            logger.warning("serving %s read-only: %s", index.path, exc)
            return None, str(exc)

    def _publish_view(self, collection: WritableCollection, view: ReadView | ShardedView) -> None:
        current = self.serving
        if current is None or current.collection is not collection:
            return  # a collection a reload replaced (its compaction may still finish): never put it back in service
        self._publish(view.index, view, collection, current.write_refusal)

    def _publish(
        self,
        index: OpenIndex | ShardedIndex,
        read_view: ReadView | ShardedView | None,
        collection: WritableCollection | None,
        refusal: str | None,
    ) -> Serving:
        resources = self.resources
        precision, documents = index.query_precision, index.manifest.embedder.document_precision
        served = self._served_model(index, documents)  # highlights compare sentences embedded like the documents
        embedder = BatchingEmbedder(served) if resources.batch else served
        query_model = served if precision == documents else self._served_model(index, precision)
        queries = embedder if query_model is served else BatchingEmbedder(query_model) if resources.batch else query_model
        if resources.query_cache.size:
            queries = CachedEmbedder(queries, resources.query_cache, f"{model_identity(index.manifest)}:{precision}")
        view = read_view if read_view is not None else index
        overrides = index.manifest.overrides
        reranking = resources.reranking_of(index)
        spec = index.manifest.defaults.merge(reranking.spec).merge(overrides).to_dict() if overrides else reranking.spec
        pipeline = view.pipeline(
            spec,
            executor=resources.executor,
            cross_encoder=reranking.cross_encoder,
            cross_encoder_name=reranking.name,
            embedder=queries,
        )
        serving = Serving(
            index, pipeline, view.presenter(embedder), reranking.evidence, collection, refusal, read_view, self._curation_rules(index)
        )
        previous, self.serving = self.serving, serving  # a single reference assignment: atomic
        if previous is None or previous.index is not index:
            resources.metrics.describe_index(self.name, index.manifest, serving.documents)
        else:  # a refresh of the same base: only the count changed
            resources.metrics.documents.labels(self.name).set(serving.documents)
        return serving

    def _curation_rules(self, index: OpenIndex | ShardedIndex) -> tuple[CurationRule, ...]:
        """The manifest's curation rules, parsed again only when they changed (a refresh publishes every second)."""
        source, parsed = self._rules
        if index.manifest.curation is not source:
            parsed = tuple(check_rules(index.manifest.curation))
            self._rules = (index.manifest.curation, parsed)
        return parsed

    def _served_model(self, index: OpenIndex | ShardedIndex, precision: str):
        """What embeds a search's texts at `precision`: on a GPU, the index's own session; on CPU, sessions threaded as
        HYBRID_INFERENCE_THREADS says (auto: all cores for a lone search, one core each for concurrent ones)."""
        own = precision == index.manifest.embedder.document_precision  # the index's own session has these weights
        if own and (on_gpu(index.embedder) or not isinstance(index.embedder, OnnxEmbedder)):
            return index.embedder  # a GPU needs no thread plan; an injected (torch) embedder keeps its own
        threads = self.settings.inference_threads
        if threads != "auto":
            return self._session(index, precision, threads)
        alone = index.embedder if own else self._session(index, precision, None)
        in_flight = self.resources.in_flight
        return LoadAwareEmbedder(alone, self._session(index, precision, 1), busy=lambda: in_flight.active > 1)

    def _session(self, index: OpenIndex | ShardedIndex, precision: str, threads: int | None) -> OnnxEmbedder:
        return self.resources.session(index.path / MODEL_DIR, model_identity(index.manifest), precision, "cpu", threads)

    def change_settings(self, defaults: dict, synonyms: list[dict] | None = None, curation: list[dict] | None = None) -> Serving:
        """Change what needs no rebuild and serve it at once: fields of the collection's default spec (each replaces
        the field whole) and, when given, its synonym rules and curation rules (each replaced whole). SpecError naming
        the field when this collection cannot serve them (e.g. hubness without a fitted correction, a phrase of stop
        words only, curation of a sharded index)."""
        serving = self.serving
        if serving is None or serving.collection is None:
            raise Conflict(f"collection {self.name!r} takes no changes: {serving.write_refusal if serving else 'not loaded'}")
        overrides = {**serving.index.manifest.overrides, **defaults}
        try:
            serving.pipeline.resolve(defaults)
        except SpecError as exc:
            raise exc.within("defaults") from None
        rules = Synonyms(synonyms, serving.index.analyzer.analyze).rules if synonyms is not None else None
        if curation:
            serving.pipeline.check_curation("curation")
        curated = [rule.to_dict() for rule in check_rules(curation)] if curation is not None else None

        def change(manifest) -> None:
            manifest.overrides = overrides
            if rules is not None:
                manifest.synonyms = rules
                manifest.analyzer.set_synonyms(rules)  # the served analyzer is the in-memory manifest's
            if curated is not None:
                manifest.curation = curated

        collection = serving.collection
        collection.update_manifest(change)
        current = self.serving
        assert current is not None  # a collection is unloaded only by its drop
        return self._publish(current.index, current.view, collection, current.write_refusal)

    @property
    def model_identity(self) -> str | None:
        """What its model sessions are shared by (indexer.store.model_identity)."""
        return model_identity(self.serving.index.manifest) if self.serving is not None else None

    def refresh(self) -> None:
        """Publish pending writes to searches (the refresher thread calls this every HYBRID_REFRESH_INTERVAL), and
        start a background compaction when the live segment has grown past its threshold."""
        serving = self.serving
        if serving is None or serving.collection is None:
            return
        collection = serving.collection
        collection.refresh()
        if not collection.compacting and collection.needs_compaction(self.settings.compact_fraction, self.settings.compact_min_docs):
            self._compaction = threading.Thread(target=self._compact_logged, args=(collection,), name="compaction", daemon=True)
            self._compaction.start()

    def wait_for_compaction(self) -> None:
        """Once the collection is closed: its background compaction's thread has ended (or is ending, publishing nothing)."""
        if self._compaction is not None:
            self._compaction.join()

    @staticmethod
    def _compact_logged(collection) -> None:
        try:
            collection.compact()
        except Closed as exc:  # dropped, reloaded or restored over while it built: nothing to publish
            logger.info("background compaction dropped: %s", exc)
        except Exception:  # the previous base stays in service; the next refresh tries again
            logger.exception("background compaction failed")

    def reload(self) -> Serving:
        if not self._lock.acquire(blocking=False):
            raise ReloadInProgress(f"a reload of {self.name!r} is already in progress")
        try:
            previous = self.serving
            # writes wait for the reloaded collection: one acknowledged by the old one now would be logged but
            # missing from the new one's memory
            self.stop_writes(f"collection {self.name!r} is reloading: write again once it is done")
            try:
                return self.open(self.opener())
            except Exception:
                if previous is not None:  # the folder that served before serves again, and takes writes again
                    self.open(previous.index)
                raise
        finally:
            self._lock.release()

    def stop_writes(self, reason: str) -> None:
        """Refuse writes from now on with `reason` (searches go on), once a compaction in progress has stopped: the
        folder can then be replaced (a restore over it)."""
        serving = self.serving
        if serving is not None and serving.collection is not None:
            serving.collection.close(reason)
        self.wait_for_compaction()

    def close(self) -> None:
        """Stop serving (a drop or shutdown): close the log, which stops a compaction in progress at the end of its
        current stage (its log keeps every write: the next start compacts again)."""
        serving = self.serving
        if serving is not None and serving.collection is not None:
            serving.collection.close()
        self.wait_for_compaction()
        self.serving = None  # after the join: a compaction that swapped just before the close publishes no more
