"""The index manifest: what was built, how and from what. The only module that reads or writes
`manifest.json`; everything else holds a `Manifest`.

Format version 2 keeps the index's default search spec (search.spec) under `defaults`; version 1
indexes (fusion and hubness defaults in separate sections) are read by migrating them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hybrid_retrieval.common.errors import HybridError
from hybrid_retrieval.common.publish import write_atomic
from hybrid_retrieval.indexer.chunking import ChunkingParams
from hybrid_retrieval.search.analyzer import Analyzer, AnalyzerError
from hybrid_retrieval.search.bm25 import BM25Params
from hybrid_retrieval.search.dense import FaissParams
from hybrid_retrieval.search.filters.types import FieldInfo
from hybrid_retrieval.search.hubness import HubnessParams
from hybrid_retrieval.search.spec import SearchSpec

FORMAT = "hybrid-retrieval-index"
FORMAT_VERSION = 3  # 3: a flat or hnsw index holds the document vectors; no embeddings.npy beside it
READABLE_VERSIONS = (1, 2, 3)
MANIFEST = "manifest.json"


class IndexOpenError(HybridError, RuntimeError):
    """The index folder is missing, incomplete, corrupted or from an incompatible builder."""


@dataclass(frozen=True)
class CorpusInfo:
    source: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class EmbedderInfo:
    """The ONNX export's config (models.onnx_export) and how the documents were embedded."""

    model: str
    model_checksum: str
    dimension: int
    max_seq_length: int
    pooling: str
    normalize: bool
    inputs: list[str]
    pad_token: str
    pad_token_id: int
    document_backend: str
    document_precision: str = "fp32"  # the ONNX weights that embedded the documents (and embed written ones)
    training: dict | None = None  # a fine-tuned model's recipe and held-out result (models.onnx_export.embedder_recipe)
    profile: str = "full"  # full: the model's transformer; small: a student distilled from it; fast: a static model (models.profiles)
    recipe: dict | None = None  # how a profile's model was made from the named model (models.student, models.static)


@dataclass(frozen=True)
class FaissInfo:
    factory: str
    metric: str
    built_on_gpu: bool
    params: FaissParams


@dataclass(frozen=True)
class FusionTuning:
    """What `hybrid tune` measured when it chose `defaults.fusion`. `value`: the served fusion's own figure on the
    split: the tuned fusion's cross-validated score when tuning won, else the untuned default's (which fits nothing).
    `best_in_sample`: the best fusion of the sweep scored on the queries it was picked on (optimistic; when the
    decision was to keep the default, a candidate that was rejected)."""

    metric: str
    value: float
    queries: int
    qrels: str
    depth: int
    best_per_norm: dict[str, float]
    best_rrf_k: float
    tuned_at: str | None = None  # UTC, ISO 8601 (absent from manifests written before it was recorded)
    decision: str | None = None  # "tuned" or "kept untuned" (None: a manifest from before, whose value is best_in_sample)
    best_in_sample: float | None = None


@dataclass(frozen=True)
class HubnessInfo:
    """A fitted hubness correction: its files live in `folder` (see indexer.hubness)."""

    folder: str
    params: HubnessParams
    bank: dict
    gallery: dict
    activation: dict[str, int]
    fit_seconds: float
    tuning: dict | None = None  # betas chosen by cross-fitting on the bank's labels
    beta_source: dict | None = None  # how the betas were set: given, scaled to the score spread, or tuned


@dataclass
class Manifest:
    builder_version: str
    created_at: str
    versions: dict[str, str]
    corpus: CorpusInfo
    counts: dict[str, int]  # documents, bm25_vocabulary
    analyzer: Analyzer
    bm25_engine: str
    bm25: BM25Params
    embedder: EmbedderInfo
    faiss: FaissInfo
    defaults: SearchSpec  # what a request that says nothing gets (tuned fusion, fitted hubness)
    files: dict[str, dict]  # relative path -> {bytes, sha256}
    build: dict[str, Any] = field(default_factory=dict)  # timings, peak memory, where it was re-embedded from
    fusion_tuning: FusionTuning | None = None
    hubness: HubnessInfo | None = None
    # Why each fitted default is what it is: for "fusion" and "hubness", the metric, queries, split and the
    # held-out values it was chosen on, and the decision (training.fusion, training.hubness).
    evidence: dict[str, dict] = field(default_factory=dict)
    # Every top-level metadata field of the corpus: its filter type (search.filters) or why it has none.
    metadata: dict[str, FieldInfo] = field(default_factory=dict)
    # The last live write (indexer.live) this base holds: a compaction's; its log replays only what follows.
    applied_sequence: int = 0
    # A shard of a sharded index (indexer.shards): which one, of how many, and the corpus-wide BM25 statistics its
    # scores were computed with. None: a whole index.
    shard: dict | None = None
    # The metadata fields the build was asked to make filterable (`--filterable`, a collection's setting); None: every
    # field that can be. Writes follow it for the fields they add.
    filterable: list[str] | None = None
    # A collection's defaults set through the API (PATCH /collections/{name}/settings): a partial search spec applied
    # over `defaults` and over the server's settings.
    overrides: dict = field(default_factory=dict)
    # How documents were cut into passages (indexer.chunking); absent from manifests before chunking: none.
    chunking: ChunkingParams = field(default_factory=ChunkingParams)
    # Query-time synonym rules of the lexical leg (search.synonyms): changed without a rebuild, so kept beside the
    # analyzer rather than in it; the open analyzer is given them.
    synonyms: list[dict] = field(default_factory=list)
    # A collection's curation rules (search.curation: documents pinned or hidden for a query), set through the API.
    curation: list[dict] = field(default_factory=list)

    @property
    def documents(self) -> int:
        return self.counts["documents"]

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "builder_version": self.builder_version,
            "created_at": self.created_at,
            "versions": self.versions,
            "corpus": asdict(self.corpus),
            "counts": self.counts,
            "analyzer": self.analyzer.to_dict(),
            "bm25": {"engine": self.bm25_engine, **asdict(self.bm25)},
            "embedder": asdict(self.embedder),
            "faiss": asdict(self.faiss),
            "defaults": self.defaults.to_dict(),
            "fusion_tuning": asdict(self.fusion_tuning) if self.fusion_tuning else None,
            "hubness": asdict(self.hubness) if self.hubness else None,
            "evidence": self.evidence,
            "metadata": {name: info.to_dict() for name, info in self.metadata.items()},
            "applied_sequence": self.applied_sequence,
            "shard": self.shard,
            "filterable": self.filterable,
            "overrides": self.overrides,
            "chunking": self.chunking.to_dict(),
            "synonyms": self.synonyms,
            "curation": self.curation,
            "files": self.files,
            "build": self.build,
        }

    @classmethod
    def from_dict(cls, data: dict, where: str = MANIFEST) -> Manifest:
        """The manifest of `data`, after checking its format and version (the one place that does)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise IndexOpenError(f"{where}: format is {found!r}, expected {FORMAT!r}")
        version = data.get("format_version")
        if version not in READABLE_VERSIONS:
            raise IndexOpenError(
                f"{where}: format version {version} is not supported by this build "
                f"(reads {', '.join(map(str, READABLE_VERSIONS))}); rebuild the index with `hybrid index`"
            )
        try:
            if version == 1:
                data = _from_version_1(data)
            bm25 = dict(data["bm25"])
            faiss = dict(data["faiss"])
            hubness = data.get("hubness")
            tuning = data.get("fusion_tuning")
            manifest = cls(
                builder_version=data["builder_version"],
                created_at=data["created_at"],
                versions=data["versions"],
                corpus=CorpusInfo(**data["corpus"]),
                counts=data["counts"],
                analyzer=Analyzer.from_dict(data["analyzer"]),
                bm25_engine=bm25.pop("engine"),
                bm25=BM25Params(**bm25),
                embedder=EmbedderInfo(**data["embedder"]),
                faiss=FaissInfo(**{**faiss, "params": FaissParams(**faiss["params"])}),
                defaults=SearchSpec.from_dict(data["defaults"]),
                files=data["files"],
                build=data.get("build", {}),
                fusion_tuning=FusionTuning(**tuning) if tuning else None,
                hubness=HubnessInfo(**{**hubness, "params": HubnessParams(**hubness["params"])}) if hubness else None,
                evidence=data.get("evidence", {}),
                metadata={name: FieldInfo(**info) for name, info in data.get("metadata", {}).items()},
                applied_sequence=data.get("applied_sequence", 0),
                shard=data.get("shard"),
                filterable=data.get("filterable"),
                overrides=data.get("overrides") or {},
                chunking=ChunkingParams(**data.get("chunking", {})),
                synonyms=data.get("synonyms") or [],
                curation=data.get("curation") or [],
            )
            manifest.analyzer.set_synonyms(manifest.synonyms)
            return manifest
        except AnalyzerError as exc:  # e.g. its segmenter is not installed here
            raise IndexOpenError(f"{where}: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexOpenError(f"{where}: malformed manifest ({exc.__class__.__name__}: {exc}); rebuild the index") from None


def _from_version_1(data: dict) -> dict:
    """Version 1 kept the fusion default and depth under `fusion`, the hubness default under `hubness`."""
    data = dict(data)
    fusion = data.pop("fusion")
    defaults = {"depth": fusion["depth"], "fusion": fusion["default"]}
    hubness = data.get("hubness")
    if hubness:
        hubness = dict(hubness)
        defaults["hubness"] = hubness.pop("default")
        data["hubness"] = {"folder": "hubness", **hubness}
    data["defaults"] = defaults
    data["fusion_tuning"] = fusion.get("tuning")
    return data


def read_json(path: Path, missing: str):
    """The JSON document at `path`; IndexOpenError saying `missing` when there is none, or what is wrong with it."""
    if not path.is_file():
        raise IndexOpenError(missing)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise IndexOpenError(f"{path} is not valid JSON: {exc}") from None


def read_manifest(folder: Path | str) -> Manifest:
    path = Path(folder) / MANIFEST
    data = read_json(path, f"{folder} is not an index: no {MANIFEST} (build one with `hybrid index`)")
    return Manifest.from_dict(data, str(path))


def write_manifest(folder: Path | str, manifest: Manifest) -> None:
    """Replace manifest.json atomically (a crash leaves the old or the new one, never half of one)."""
    write_atomic(Path(folder) / MANIFEST, json.dumps(manifest.to_dict(), indent=2))


def update_manifest(folder: Path | str, change: Callable[[Manifest], None]) -> Manifest:
    """Read the manifest, let `change` edit it, write it back; returns the new manifest."""
    manifest = read_manifest(folder)
    change(manifest)
    write_manifest(folder, manifest)
    return manifest
