"""Collections (their settings as created, patched and described) and aliases."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from hybrid_retrieval.app.schemas.documents import DocumentId, Stats
from hybrid_retrieval.app.schemas.search import MAX_QUERY_CHARS
from hybrid_retrieval.app.schemas.shared import Float, Int, Strict, documented
from hybrid_retrieval.app.schemas.spec import DefaultsBody
from hybrid_retrieval.common.names import NAME_RULE, NAME_RULE_TEXT
from hybrid_retrieval.engine.schema import CHUNKING_METHODS
from hybrid_retrieval.models.onnx_export import PRECISIONS
from hybrid_retrieval.models.profiles import PROFILES
from hybrid_retrieval.models.registry import DEFAULT_MODEL
from hybrid_retrieval.search.analyzer import LANGUAGES, NORMALIZATIONS, STEMMERS, STOPWORD_LISTS
from hybrid_retrieval.search.cjk import CJK_MODES
from hybrid_retrieval.search.curation import MAX_CURATED, MAX_RULES
from hybrid_retrieval.search.dense import DEFAULT_PARAMS, FAISS_KINDS
from hybrid_retrieval.search.vectors import MAX_DIMENSION

SETTINGS_EXAMPLE = {
    "embedder": {"model": "all-MiniLM-L6-v2"},
    "analyzer": {"language": "english"},
    "synonyms": [{"equivalent": ["laptop", "notebook"]}],
    "bm25": {"k1": 1.2, "b": 0.75},
    "vectors": {"kind": "flat"},
    "filterable": ["year", "tags"],
    "defaults": {"mode": "hybrid", "fusion": {"method": "rrf", "rrf_k": 60}},
}


# The Literal[...] of choices computed at import (which mypy cannot read) are typed `type: ignore[valid-type]`;
# pydantic checks them.


class EmbedderSettings(Strict):
    kind: Literal["model", "none"] = Field(
        default="model", description="none: the collection embeds nothing; documents and dense searches bring their own `vector`"
    )
    dimension: Int | None = Field(default=None, ge=1, le=MAX_DIMENSION, description="with kind none (required): numbers in every vector")
    model: str = Field(
        default=DEFAULT_MODEL,
        min_length=1,
        description="a sentence-transformers model name or folder the server has (exported to ONNX once; the bundled "
        "all-MiniLM-L6-v2 needs nothing), or an ONNX export folder",
    )
    profile: Literal[tuple(PROFILES)] = Field(  # type: ignore[valid-type]
        default="full",
        description="full: the model itself; small: a student `hybrid distil` made from it, given as the model; "
        "fast: a static model distilled from it (fp32 only)",
    )
    precision: Literal[tuple(PRECISIONS)] = Field(default="fp32", description="the ONNX weights that embed the documents")  # type: ignore[valid-type]


class AnalyzerSettings(Strict):
    language: str | None = Field(
        default=None,
        description="sets the stemmer and stop words (and for chinese, japanese, korean: neither): "
        f"{', '.join(LANGUAGES)}, or an ISO 639-1 code",
        examples=["german", "ja"],
    )
    stemmer: Literal[STEMMERS] | None = Field(default=None, description="a Snowball stemmer; default: the language's (porter for English)")  # type: ignore[valid-type]
    stopwords: Literal[STOPWORD_LISTS] | list[Annotated[str, Field(min_length=1)]] | None = Field(  # type: ignore[valid-type]
        default=None, description="a named list (en: Lucene's short English one), none, or a list of words; default: the language's, or en"
    )
    normalization: Literal[NORMALIZATIONS] | None = Field(  # type: ignore[valid-type]
        default=None, description="nfkc: full-width and compatibility forms folded (default none)"
    )
    fold_accents: StrictBool | None = Field(default=None, description="café matches cafe (default false)")
    cjk: Literal[CJK_MODES] | None = Field(  # type: ignore[valid-type]
        default=None,
        description="Chinese, Japanese and Korean runs: bigram (default, no dictionary), jieba, sudachi or kiwi (dictionary "
        "segmenters, extras zh, ja, ko), none (a run is one word)",
    )
    lowercase: StrictBool | None = Field(default=None, description="default true")


class SynonymRule(Strict):
    """{"equivalent": [phrases]}: each brings the others; {"from": phrase(s), "to": [phrases]}: one way."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    equivalent: list[str] | None = None
    from_: str | list[str] | None = Field(default=None, alias="from")
    to: list[str] | None = None


class CurationRuleBody(Strict):
    """Documents pinned first or hidden when a query matches (search.curation)."""

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, pattern=r"\S", description="the query, case and spacing aside")
    match: Literal["exact", "contains"] = Field(
        default="exact", description="exact: the whole query; contains: the query holds it as a run of whole words"
    )
    pinned: list[DocumentId] | None = Field(default=None, max_length=MAX_CURATED, description="shown first, in this order")
    hidden: list[DocumentId] | None = Field(default=None, max_length=MAX_CURATED, description="never returned")


SYNONYMS_DESCRIPTION = (
    "query-time synonym rules of the lexical leg, each phrase analysed like the documents; a query holding a rule's "
    "phrase also searches its other phrases"
)


class BM25Settings(Strict):
    k1: Float = Field(default=1.5, ge=0, le=1e6)
    b: Float = Field(default=0.75, ge=0, le=1)


class VectorSettings(Strict):
    kind: Literal[FAISS_KINDS] = Field(  # type: ignore[valid-type]
        default=DEFAULT_PARAMS.kind, description="the vector index once the collection holds `exact_below` documents"
    )
    exact_below: Int = Field(
        default=DEFAULT_PARAMS.exact_below, ge=0, description="below this many documents the vector index is exact (Flat)"
    )
    nlist: Int | None = Field(default=None, ge=1, description="ivf, ivfpq, ivf_sq8: clusters (default ~4*sqrt(n))")
    nprobe: Int = Field(default=DEFAULT_PARAMS.nprobe, ge=1, le=65536, description="ivf, ivfpq, ivf_sq8: clusters visited per query")
    hnsw_m: Int = Field(default=32, ge=2, le=256, description="hnsw, hnsw_sq8: links per node")
    pq_m: Int = Field(default=48, ge=1, le=1024, description="ivfpq: bytes a vector (must divide the dimension)")
    pq_refine: Int = Field(default=4, ge=1, le=64, description="ivfpq, sq8, hnsw_sq8, ivf_sq8: candidates rescored exactly per result")
    ef_construction: Int = Field(default=200, ge=1, le=65536)
    ef_search: Int = Field(default=128, ge=1, le=65536)
    flat_search_cutoff: Int = Field(
        default=10_000, ge=0, description="ivf, hnsw: filters admitting at most this many documents are scored exactly"
    )


class ChunkingSettings(Strict):
    method: str | None = documented("cut documents into passages for the dense leg (default none)", enum=list(CHUNKING_METHODS))
    size: Int | None = documented("word pieces of the model per passage (default 128)", minimum=8)
    overlap: Int | None = documented("tokens: word pieces a passage repeats of the previous one (default 16)", minimum=0)


class CollectionSettingsBody(Strict):
    embedder: EmbedderSettings | None = None
    analyzer: AnalyzerSettings | None = None
    synonyms: list[SynonymRule] | None = Field(default=None, description=SYNONYMS_DESCRIPTION + " (PATCH .../settings changes them)")
    bm25: BM25Settings | None = None
    vectors: VectorSettings | None = None
    filterable: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, description="metadata fields indexed for filters; null: every field whose values share a type"
    )
    chunking: ChunkingSettings | None = Field(default=None, description="passages for long documents (the dense leg ranks by its best)")
    defaults: DefaultsBody | None = Field(default=None, description="the search spec a request that says nothing gets")


class CollectionCreate(Strict):
    name: str = Field(description=NAME_RULE_TEXT, pattern=f"^{NAME_RULE.pattern}$", examples=["products-v1"])
    settings: CollectionSettingsBody | None = Field(
        default=None, description="every field is optional: what is absent takes `hybrid index`'s default", examples=[SETTINGS_EXAMPLE]
    )

    def settings_dict(self) -> dict[str, Any] | None:
        return self.settings.model_dump(exclude_unset=True, exclude_none=True, by_alias=True) if self.settings is not None else None


class SettingsPatch(Strict):
    defaults: DefaultsBody | None = Field(
        default=None,
        description="fields of the search spec a request that says nothing gets; each replaces that field (over the "
        "server's HYBRID_DEPTH / HYBRID_RERANK_* settings too)",
        examples=[{"mode": "hybrid", "rerank": {"enabled": False}}],
    )
    synonyms: list[SynonymRule] | None = Field(
        default=None,
        description=SYNONYMS_DESCRIPTION + "; replaces the collection's rules whole ([] removes them), served at once",
        examples=[[{"equivalent": ["car", "automobile"]}, {"from": "heart attack", "to": ["myocardial infarction"]}]],
    )
    curation: list[CurationRuleBody] | None = Field(
        default=None,
        max_length=MAX_RULES,
        description="rules that pin documents first or hide them for a query; replaces the collection's rules whole ([] "
        "removes them), served at once. A request's own `pinned` come before its rules', `hidden` adds up",
        examples=[
            [{"query": "iphone", "pinned": ["sku-15", "sku-14"]}, {"query": "charger", "match": "contains", "hidden": ["sku-recalled"]}]
        ],
    )

    def defaults_dict(self) -> dict[str, Any]:
        return self.defaults.model_dump(exclude_unset=True, exclude_none=True) if self.defaults is not None else {}

    def curation_list(self) -> list[dict[str, Any]] | None:
        return [rule.model_dump(exclude_none=True) for rule in self.curation] if self.curation is not None else None

    def synonyms_list(self) -> list[dict[str, Any]] | None:
        if self.synonyms is None:
            return None
        return [rule.model_dump(exclude_none=True, by_alias=True) for rule in self.synonyms]


class CollectionSummary(BaseModel):
    name: str
    documents: int
    state: Literal["ready", "read-only", "failed"] = Field(
        description="read-only: it takes no writes now (GET /collections/{name} says why); failed: its folder cannot be opened "
        "(`error` says why; the other collections serve)"
    )
    aliases: list[str] = Field(description="aliases that point to it")
    error: str | None = Field(default=None, description="why a failed collection cannot be opened, and how to repair it")


class CollectionList(BaseModel):
    collections: list[CollectionSummary]


class CollectionInfo(BaseModel):
    name: str
    aliases: list[str]
    documents: int
    settings: dict[str, Any] = Field(description="what it was created with: embedder, analyzer, bm25, vectors, filterable")
    defaults: dict[str, Any] = Field(description="the search spec a request that says nothing gets")
    evidence: dict[str, Any] = Field(description="what each fitted default rests on (tuning, hubness fit, reranker weight)")
    fusion_tuning: dict[str, Any] | None = Field(default=None, description="what `hybrid tune` measured when it chose the default fusion")
    metadata: dict[str, Any] = Field(description="metadata fields: filter type, or why not filterable")
    curation: list[dict[str, Any]] = Field(default_factory=list, description="its curation rules (PATCH .../settings sets them)")
    stats: Stats
    disk_bytes: int = Field(description="size of its folder on disk (the model files, shared by hard links, counted)")
    memory_bytes: int = Field(description="what it holds in memory or maps: index files but stored texts and model; live vectors")
    created_at: str
    index: str = Field(description="its folder")


class AliasSet(Strict):
    collection: str = Field(pattern=f"^{NAME_RULE.pattern}$", examples=["products-v2"])


class AliasList(BaseModel):
    aliases: dict[str, str] = Field(description="alias -> collection")
