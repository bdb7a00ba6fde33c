"""Label-free training data: pseudo-queries cut out of the corpus itself, kept only where our own hybrid retriever
finds their document, for `hybrid adapt` (fine-tuning the encoder, training.embedder) and `hybrid tune --pseudo`.

Recipes (each yields at most one pseudo-query per document):
- `title`: a document's title is a query for its body.
- `ict` (the inverse cloze task): one sentence of the body is the query for the rest of the document (its title
  and the other sentences). The sentence is chosen at random among those of a query's length (MIN_WORDS..MAX_WORDS
  words).
- `both`: the two, on alternate sampled documents.

The query is cut out of the text it must be matched with (`passages`): left in, the pair is a verbatim match the
base model already gets right (held-out nDCG@10 0.98 for titles on scifact), and there is nothing to learn.

Filter: a pseudo-query whose own document is not in the hybrid top-`filter_depth` is noise (a generic title, a
sentence like "Results are discussed") and is dropped.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from tqdm import tqdm

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.indexer.corpus import indexed_text
from hybrid_retrieval.indexer.store import OpenIndex

RECIPES = ("title", "ict", "both")
SOURCE_PREFIX = "pseudo:"  # how a fit on pseudo-queries names its split: pseudo:<recipe>:<max queries>:<filter depth>
MIN_WORDS, MAX_WORDS = 5, 40
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[])")


@dataclass(frozen=True)
class PseudoQueries:
    queries: dict[str, str]  # pseudo-query id -> text
    qrels: dict[str, dict[str, int]]  # pseudo-query id -> {its document id: 1}
    passages: dict[str, str]  # pseudo-query id -> its document's text with the query cut out
    stats: dict  # generated, kept, per recipe


def sentences(text: str) -> list[str]:
    """The sentences of `text` that could stand for a query (MIN_WORDS..MAX_WORDS words)."""
    return [s.strip() for s in _SENTENCE_END.split(text) if MIN_WORDS <= len(s.split()) <= MAX_WORDS]


def _candidate(doc: dict, recipe: str, rng: random.Random) -> tuple[str, str] | None:
    """(pseudo-query, the document's text without it), or None when the document has no candidate."""
    if recipe == "title":
        title = doc["title"].strip()
        return (title, doc["text"]) if len(title.split()) >= 2 and doc["text"].strip() else None
    found = sentences(doc["text"])
    if not found:
        return None
    sentence = rng.choice(found)
    rest = " ".join(doc["text"].replace(sentence, " ", 1).split())
    return (sentence, indexed_text(doc["title"], rest)) if rest else None


def generate(index: OpenIndex, recipe: str, max_queries: int, filter_depth: int, seed: int = 0, progress: bool = True) -> PseudoQueries:
    """Up to `max_queries` filtered pseudo-queries from a seeded sample of the index's documents."""
    if recipe not in RECIPES:
        raise ConfigError(f"unknown pseudo-query recipe {recipe!r}; valid: {', '.join(RECIPES)}")
    if max_queries < 1 or filter_depth < 1:
        raise ConfigError(f"max_queries and filter_depth must be >= 1, got {max_queries} and {filter_depth}")
    rng = random.Random(seed)
    order = list(range(index.num_docs))
    rng.shuffle(order)
    pipeline = index.pipeline()
    queries, qrels, passages = {}, {}, {}
    stats = {"recipe": recipe, "filter_depth": filter_depth, "documents_seen": 0, "generated": {}, "kept": {}}
    bar = tqdm(total=max_queries, desc=f"pseudo-queries ({recipe})", disable=not progress)
    for position, doc_idx in enumerate(order):
        if len(queries) >= max_queries:
            break
        kind = recipe if recipe != "both" else ("title", "ict")[position % 2]
        doc = index.docs.get(doc_idx)
        candidate = _candidate(doc, kind, rng)
        stats["documents_seen"] += 1
        if candidate is None:
            continue
        text, passage = candidate
        stats["generated"][kind] = stats["generated"].get(kind, 0) + 1
        if doc_idx not in pipeline.search(text, k=filter_depth).ranking.doc_idx.tolist():
            continue
        stats["kept"][kind] = stats["kept"].get(kind, 0) + 1
        qid = f"pseudo-{kind}-{doc['id']}"
        queries[qid], qrels[qid], passages[qid] = text, {doc["id"]: 1}, passage
        bar.update()
    bar.close()
    if not queries:
        raise ConfigError(
            f"no pseudo-query survived the filter (recipe {recipe}, {stats['documents_seen']} documents seen): "
            "the documents may lack titles or sentences; try another --recipe"
        )
    return PseudoQueries(queries, qrels, passages, stats)


def source_name(recipe: str, max_queries: int, filter_depth: int) -> str:
    """The split name a fit on these pseudo-queries records (and `parse_source` reads back to make them again)."""
    return f"{SOURCE_PREFIX}{recipe}:{max_queries}:{filter_depth}"


def parse_source(name: str) -> tuple[str, int, int] | None:
    """(recipe, max_queries, filter_depth) of a `source_name`, None for any other split name (a qrels path)."""
    if not name.startswith(SOURCE_PREFIX):
        return None
    recipe, max_queries, filter_depth = name[len(SOURCE_PREFIX) :].split(":")
    return recipe, int(max_queries), int(filter_depth)
