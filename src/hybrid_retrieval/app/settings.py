"""Service settings: environment variables prefixed HYBRID_ (e.g. HYBRID_INDEX=/data/index)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hybrid_retrieval.common.devices import DEVICES
from hybrid_retrieval.common.names import name_of_folder
from hybrid_retrieval.engine.collections import DEFAULT_MAX_SNAPSHOT_BYTES
from hybrid_retrieval.engine.schema import VERIFY_MODES
from hybrid_retrieval.models.onnx_export import SERVED_PRECISIONS
from hybrid_retrieval.search.rerank import DEFAULT_RERANK_DEPTH
from hybrid_retrieval.search.spec import SearchSpec


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HYBRID_", extra="ignore")

    index: Path | None = Field(
        default=None, description="an index folder built by `hybrid index`, served as one more collection (named after the folder)"
    )
    data: Path | None = Field(
        default=None, description="the data directory of named collections; default ./data when no --index is given, else none"
    )
    default_collection: str | None = Field(
        default=None, description="the collection (or alias) the unprefixed routes act on; default: the --index folder's, else 'default'"
    )
    max_collections: int = Field(default=100, ge=1, description="collections served at once; creating one more answers 409")
    task_workers: int = Field(
        default=2,
        ge=1,
        description="collections whose bulk loads (PUT .../documents?wait=false) run at once; one collection's loads run "
        "one after another, in the order they came",
    )
    snapshots: Path | None = Field(
        default=None, description="the folder of collection snapshots; default: `snapshots` in the data directory"
    )
    snapshot_keep: int = Field(
        default=5, ge=0, description="snapshots kept per collection (the oldest go when one more is taken); 0: all of them"
    )
    max_snapshot_bytes: int = Field(
        default=DEFAULT_MAX_SNAPSHOT_BYTES,
        ge=1024,
        description="the largest snapshot file POST .../snapshots/restore takes as an upload, and the most bytes of files "
        "any restore writes",
    )
    snapshot_key: SecretStr | None = Field(
        default=None,
        description="a secret that signs every snapshot taken (HMAC-SHA256); when set, only snapshots signed with it "
        "restore (a server restoring another's snapshots needs the same key)",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    # Literal[...] of choices computed at import (which mypy cannot read): `type: ignore[valid-type]`; pydantic checks them
    device: Literal[DEVICES] = "auto"  # type: ignore[valid-type]
    verify: Literal[VERIFY_MODES] = Field(  # type: ignore[valid-type]
        default="full", description="index file check at startup"
    )
    depth: int | None = Field(default=None, description="hybrid candidates per retriever (default: the index's)")
    parallel_legs: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="run the BM25 leg beside embedding + dense search; auto: only when queries are embedded on a GPU "
        "(docs/deployment.md: when it pays)",
    )
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    max_in_flight: int = Field(default=64, ge=1, description="searches processed at once; more get 503 + Retry-After")
    search_threads: int | None = Field(
        default=None,
        ge=1,
        description="threads that run searches; more in flight wait for one (up "
        "to HYBRID_MAX_IN_FLIGHT). Default: cores + 1, one model run per core and one thread "
        "in Python; more threads lengthen the tail (docs/deployment.md)",
    )
    http: Literal["auto", "h11", "httptools"] = Field(default="auto", description="uvicorn's HTTP parser; auto: httptools when installed")
    loop: Literal["auto", "asyncio", "uvloop"] = Field(default="auto", description="uvicorn's event loop; auto: uvloop when installed")
    inference_threads: int | Literal["auto"] = Field(
        default="auto",
        description="threads of each CPU model run that embeds a query or a highlight's sentences; auto: all cores "
        "while a search runs alone, one per search while several run (so concurrent searches never oversubscribe the cores); "
        "N: always N",
    )
    query_cache_size: int = Field(
        default=10_000,
        ge=0,
        description="query embeddings kept (LRU, keyed by the model's checksum and the query's token ids); 0: no cache",
    )
    api_keys: str | None = Field(
        default=None, description="comma-separated read keys (search); unset, with no write keys either: searches need no key"
    )
    api_keys_file: Path | None = Field(default=None, description="file with one read key per line")
    metrics_key: SecretStr | None = Field(
        default=None,
        description="a key that reads every series of /metrics and nothing else (for a Prometheus scraper); without it, "
        "per-collection series are shown only to keys that may use the collection",
    )
    write_keys: str | None = Field(
        default=None,
        description="comma-separated write keys: search, write documents, /admin/*; unset "
        "(and no file): writes and admin endpoints are refused",
    )
    write_keys_file: Path | None = Field(default=None, description="file with one write key per line")
    refresh_interval: float = Field(default=1.0, gt=0, le=3600, description="seconds between publishing writes to searches")
    max_batch_docs: int = Field(default=1000, ge=1, description="documents per write batch")
    write_threads: int | None = Field(
        default=None,
        ge=1,
        description="cores that embedding written documents may use, one batch "
        "at a time; default: all while no search runs, half while searches run",
    )
    blas_threads: int = Field(
        default=1,
        ge=1,
        description="threads of NumPy's BLAS in the service (its products per request are "
        "small; more threads spin beside ONNX Runtime's and slow searches down under load)",
    )
    compact_fraction: float = Field(
        default=0.1,
        gt=0,
        description="compact in the background once live documents and deletions "
        "reach this share of the base segment (and HYBRID_COMPACT_MIN_DOCS)",
    )
    compact_min_docs: int = Field(default=1000, ge=1, description="the fewest changed documents worth a background compaction")
    max_write_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="body limit of the write endpoints (PUT /documents, deletes); HYBRID_MAX_BODY_BYTES is every other route's",
    )
    request_timeout: float = Field(
        default=30.0, gt=0, le=3600, description="seconds a search (or a batch of them) may run; past it its work stops and it answers 504"
    )
    write_timeout: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="seconds a write may spend before it is logged (embedding "
        "its documents); past it nothing is written and it answers 504",
    )
    graceful_shutdown: float = Field(
        default=5.0,
        ge=0,
        le=3600,
        description="seconds a stop waits for requests in progress; then they are cancelled (their work stops too)",
    )
    cors_origins: str = Field(default="", description="comma-separated origins allowed by CORS; empty: CORS off")
    log_level: str = "info"
    reranker: str | None = Field(
        default=None,
        description="cross-encoder: a `hybrid train-reranker` folder, an ONNX export folder, "
        "or a sentence-transformers CrossEncoder name or path (exported to ONNX on first use; needs torch)",
    )
    query_precision: Literal[SERVED_PRECISIONS] = Field(  # type: ignore[valid-type]
        default="auto",
        description="ONNX weights that embed queries (documents are always embedded in fp32); auto: int8 on CPU "
        '(about as good, faster: docs/BENCHMARKS.md, "Query precision and cache") and fp32 on GPU; `hybrid eval` and `hybrid tune` '
        "embed queries the same way (--query-precision)",
    )
    reranker_precision: Literal[SERVED_PRECISIONS] = Field(  # type: ignore[valid-type]
        default="auto",
        description="ONNX weights of the reranker; auto: int8 on CPU (about as good, faster: docs/BENCHMARKS.md, "
        '"Rerankers") and fp32 on GPU',
    )
    reranker_workers: int | None = Field(
        default=None,
        ge=1,
        description="cross-encoder runs side by side on CPU, each on one core "
        "(a request's pairs are spread over them; concurrent requests share them); "
        "default: one per core",
    )
    rerank_depth: int = Field(default=DEFAULT_RERANK_DEPTH, description="first-stage hits reranked when a request does not say")
    rerank_weight: float | None = Field(
        default=None,
        description="interpolation weight of the cross-encoder when a request does not "
        "say (1: its logit alone); default: the weight `hybrid train-reranker` tuned on "
        "held-out queries, else 1",
    )
    rerank_by_default: bool = Field(default=True, description="rerank requests that do not say `rerank` (when a reranker is set)")
    batch_queries: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="coalesce concurrent requests' query embedding and reranking into shared model runs; auto: only "
        "when the models run on a GPU (docs/deployment.md: when it pays)",
    )

    def spec_overrides(self, reranking: bool, tuned_weight: float | None = None, gained: bool | None = None) -> dict[str, Any]:
        """The partial search spec these settings put over the index's defaults. `tuned_weight` and `gained`:
        what `hybrid train-reranker` recorded; a reranker that did not beat the first stage on held-out
        queries is not used by default unless HYBRID_RERANK_WEIGHT is set (the simpler default)."""
        spec: dict[str, Any] = {} if self.depth is None else {"depth": self.depth}
        if reranking:
            weight = self.rerank_weight if self.rerank_weight is not None else (1.0 if tuned_weight is None else tuned_weight)
            by_default = self.rerank_by_default and (self.rerank_weight is not None or gained is not False)
            spec["rerank"] = {"enabled": by_default, "depth": self.rerank_depth, "weight": weight}
        return spec

    @field_validator("inference_threads")
    @classmethod
    def _at_most_the_cores(cls, threads: int | Literal["auto"]) -> int | Literal["auto"]:
        cores = len(os.sched_getaffinity(0))
        if threads != "auto" and not 1 <= threads <= cores:
            raise ValueError(f"must be 'auto' or between 1 and the {cores} cores of this machine, not {threads}")
        return threads

    @property
    def data_dir(self) -> Path | None:
        return self.data if self.data is not None or self.index is not None else Path("data")

    @property
    def snapshot_secret(self) -> bytes | None:
        return self.snapshot_key.get_secret_value().encode() or None if self.snapshot_key is not None else None

    @property
    def snapshot_dir(self) -> Path | None:
        if self.snapshots is not None:
            return self.snapshots
        data = self.data_dir
        return data / "snapshots" if data is not None else None

    @property
    def default_collection_name(self) -> str:
        if self.default_collection is not None:
            return self.default_collection
        return name_of_folder(self.index) if self.index is not None else "default"

    @property
    def search_workers(self) -> int:
        return self.search_threads or len(os.sched_getaffinity(0)) + 1

    @model_validator(mode="after")
    def _installed(self) -> Settings:
        for setting, module in (("http", "httptools"), ("loop", "uvloop")):
            if getattr(self, setting) == module and importlib.util.find_spec(module) is None:
                raise ValueError(f"{setting}={module} needs the {module} package: pip install {module} (or use auto)")
        return self

    @model_validator(mode="after")
    def _valid_spec(self) -> Settings:
        SearchSpec().merge(self.spec_overrides(reranking=True))  # the spec's own checks, naming the field
        return self
