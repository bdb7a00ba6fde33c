"""A collection's settings as an application sends them (`POST /collections`): checked field by field (SpecError
naming `settings.<field>`), then turned into the build options and default search spec of its index.

    {"embedder": {"model": "all-MiniLM-L6-v2", "precision": "fp32"},
     "analyzer": {"language": "german", "normalization": "nfkc", "fold_accents": true, "cjk": "bigram"},
                                                       # or stemmer / stopwords (a list: custom) given one by one
     "synonyms": [{"equivalent": ["car", "automobile"]}],  # search.synonyms; PATCH changes them without a rebuild
     "bm25": {"k1": 1.2, "b": 0.75},
     "vectors": {"kind": "ivf_sq8", ...},            # search.dense.FaissParams' fields
     "filterable": ["year", "tags"],                   # null or absent: every metadata field that can be
     "chunking": {"method": "tokens", "size": 128, "overlap": 16},   # indexer.chunking's (default none)
     "defaults": {"mode": "hybrid", ...}}              # a partial search spec (search.spec)

Every field is optional; what is absent takes `hybrid index`'s default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from hybrid_retrieval.common.errors import ConfigError, SpecError
from hybrid_retrieval.indexer.build import BuildOptions
from hybrid_retrieval.indexer.chunking import ChunkingParams
from hybrid_retrieval.models.embedder import NO_MODEL
from hybrid_retrieval.models.onnx_export import PRECISIONS
from hybrid_retrieval.models.profiles import PRECISION_PROFILES, PROFILES
from hybrid_retrieval.models.registry import DEFAULT_MODEL
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.bm25 import BM25Params
from hybrid_retrieval.search.dense import DEFAULT_PARAMS, FaissParams
from hybrid_retrieval.search.spec import SearchSpec
from hybrid_retrieval.search.synonyms import Synonyms
from hybrid_retrieval.search.vectors import MAX_DIMENSION

SECTIONS = ("embedder", "analyzer", "synonyms", "bm25", "vectors", "filterable", "chunking", "defaults")
CHUNKING_FIELDS = ("method", "size", "overlap")
EMBEDDER_FIELDS = ("kind", "model", "profile", "precision", "dimension")
EMBEDDER_KINDS = ("model", "none")  # none: documents and dense searches bring their vectors
ANALYZER_FIELDS = ("language", "stemmer", "stopwords", "normalization", "fold_accents", "cjk", "lowercase")
BM25_FIELDS = ("k1", "b")  # the method stays lucene: live writes score with it (search.segments)


@dataclass(frozen=True)
class CollectionSettings:
    model: str = DEFAULT_MODEL
    profile: str = "full"  # models.profiles.PROFILES
    precision: str = "fp32"
    dimension: int | None = None  # set: the embedder is `none`, and every vector has this many numbers
    analyzer: Analyzer = field(default_factory=Analyzer)
    bm25: BM25Params = field(default_factory=BM25Params)
    vectors: FaissParams = DEFAULT_PARAMS
    filterable: tuple[str, ...] | None = None
    defaults: SearchSpec = field(default_factory=SearchSpec)
    chunking: ChunkingParams = field(default_factory=ChunkingParams)
    synonyms: tuple[dict, ...] = ()

    @classmethod
    def parse(cls, data: Any) -> CollectionSettings:  # noqa: C901
        """The settings of a request body's `settings` object; SpecError naming the first invalid field."""
        if data is None:
            return cls()
        section = _object(data, "settings", SECTIONS)
        embedder = _object(section.get("embedder", {}), "settings.embedder", EMBEDDER_FIELDS)
        kind = embedder.get("kind", "model")
        if kind not in EMBEDDER_KINDS:
            raise SpecError("settings.embedder.kind", f"must be one of {', '.join(EMBEDDER_KINDS)}, not {kind!r}")
        dimension = embedder.get("dimension")
        if kind == "none":
            if isinstance(dimension, bool) or not isinstance(dimension, int) or not 1 <= dimension <= MAX_DIMENSION:
                raise SpecError("settings.embedder.dimension", f"required with kind none: an integer from 1 to {MAX_DIMENSION}")
            if set(embedder) - {"kind", "dimension"}:
                raise SpecError("settings.embedder", "kind none takes a dimension only (no model, no precision)")
        elif dimension is not None:
            raise SpecError("settings.embedder.dimension", "the model decides the dimension: give it with kind none only")
        model = embedder.get("model", DEFAULT_MODEL)
        if not isinstance(model, str) or not model.strip():
            raise SpecError("settings.embedder.model", "must be a model name or a folder the server has")
        profile = embedder.get("profile", "full")
        if profile not in PROFILES:
            raise SpecError("settings.embedder.profile", f"must be one of {', '.join(PROFILES)}, not {profile!r}")
        precision = embedder.get("precision", "fp32")
        if precision not in PRECISIONS:
            raise SpecError("settings.embedder.precision", f"must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        if profile not in PRECISION_PROFILES and precision != "fp32":
            raise SpecError("settings.embedder.precision", f"the {profile} profile embeds at fp32 only (it has no int8 weights)")
        analyzer = parse_analyzer(section.get("analyzer", {}), "settings.analyzer")
        synonyms = tuple(Synonyms(section.get("synonyms", []), analyzer.analyze, "settings.synonyms").rules)
        bm25 = _build(BM25Params, "settings.bm25", _object(section.get("bm25", {}), "settings.bm25", BM25_FIELDS))
        vector_fields = tuple(f.name for f in fields(FaissParams))
        vectors = _object(section.get("vectors", {}), "settings.vectors", vector_fields)
        vectors = _build(FaissParams, "settings.vectors", {**DEFAULT_PARAMS.to_dict(), **vectors})
        filterable = section.get("filterable")
        if filterable is not None and (not isinstance(filterable, list) or not all(isinstance(n, str) and n for n in filterable)):
            raise SpecError("settings.filterable", "must be a list of metadata field names, or null for every field that can be")
        if "filter" in (section.get("defaults") or {}):
            raise SpecError("settings.defaults.filter", "a collection's defaults take no filter: send one with each search")
        try:
            defaults = SearchSpec().merge(section.get("defaults"))
        except SpecError as exc:
            raise exc.within("settings.defaults") from None
        filterable = tuple(filterable) if filterable is not None else None
        chunking = _build(ChunkingParams, "settings.chunking", _object(section.get("chunking", {}), "settings.chunking", CHUNKING_FIELDS))
        if chunking.enabled and kind == "none":
            raise SpecError("settings.chunking", "a collection without a model cannot embed passages: chunk with kind model")
        shared = {
            "analyzer": analyzer,
            "bm25": bm25,
            "vectors": vectors,
            "filterable": filterable,
            "defaults": defaults,
            "chunking": chunking,
            "synonyms": synonyms,
        }
        if kind == "none":
            return cls(model=NO_MODEL, dimension=dimension, **shared)
        return cls(model=model, profile=profile, precision=precision, **shared)

    def build_options(self) -> BuildOptions:
        return BuildOptions(
            model=self.model,
            profile=self.profile,
            backend=NO_MODEL if self.dimension is not None else "onnx",
            precision=self.precision,
            analyzer=self.analyzer,
            bm25=self.bm25,
            faiss=self.vectors,
            device="cpu",
            progress=False,
            filterable=self.filterable,
            chunking=self.chunking,
            synonyms=self.synonyms,
        )


def parse_analyzer(value: Any, where: str) -> Analyzer:
    """An analyzer from its settings: a `language` (name or ISO code) sets the stemmer and stop words, which may also
    be given (or overridden) one by one; `stopwords` as a list is a custom list. SpecError naming the field."""
    spec = dict(_object(value, where, ANALYZER_FIELDS))
    for name in ("fold_accents", "lowercase"):
        if name in spec and not isinstance(spec[name], bool):
            raise SpecError(f"{where}.{name}", "must be true or false")
    stopwords = spec.get("stopwords")
    if isinstance(stopwords, list):
        if not stopwords or not all(isinstance(w, str) and w.strip() for w in stopwords):
            raise SpecError(f"{where}.stopwords", "a custom list needs at least one non-empty word")
        spec["stopwords"], spec["stopword_list"] = "custom", tuple(stopwords)
    if not isinstance(spec.get("language", ""), str):
        raise SpecError(f"{where}.language", "must be a language name or ISO 639-1 code")
    return _build(_analyzer, where, spec)


def _analyzer(language: str | None = None, **fields: Any) -> Analyzer:
    return Analyzer.for_language(language, **fields) if language is not None else Analyzer(**fields)


def _object(value: Any, where: str, known: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise SpecError(where, f"must be an object with any of {', '.join(known)}")
    for name in value:
        if name not in known:
            raise SpecError(f"{where}.{name}", f"unknown setting; valid: {', '.join(known)}")
    return value


def _build(kind: Callable[..., Any], where: str, values: dict) -> Any:
    """`kind(**values)`, its ConfigError (which names the parameter) turned into a SpecError naming the field."""
    for name, value in values.items():
        if isinstance(value, (dict, list)):
            raise SpecError(f"{where}.{name}", "must be a number or a string")
    try:
        return kind(**values)
    except (ConfigError, TypeError, ValueError) as exc:
        named = next((name for name in values if name in str(exc)), None)
        raise SpecError(f"{where}.{named}" if named else where, str(exc)) from None
