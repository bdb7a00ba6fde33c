"""Checking writes before they are embedded and logged: a batch of documents (check_batch), the ids of a delete
(check_ids), and the types of the metadata fields a batch adds to the collection (decide_types). A checked batch is
converted to what the log holds, so a logged record always applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hybrid_retrieval.common.errors import SpecError
from hybrid_retrieval.indexer.chunking import joined_paragraphs
from hybrid_retrieval.search.filters.types import encodable, type_of_kind, written_value
from hybrid_retrieval.search.vectors import check_vector

MAX_ID_BYTES = 512
DOCUMENT_FIELDS = ("id", "title", "text", "metadata", "vector")
ID_FIELDS = ("id", "_id")  # `_id` as in a BEIR corpus


def gathered(doc: dict, where: tuple, vectors: bool) -> dict:
    """A document in the one format the API, the offline build (indexer.corpus) and the client share: the id as `id`
    or `_id`, and every field beside id, title, text, metadata and vector a metadata field (over the `metadata`
    object's field of that name, as `hybrid index` reads a corpus line). `vectors`: whether it may bring a vector."""
    if "vector" in doc and not vectors:
        raise SpecError((*where, "vector"), "this collection takes no document vectors: it embeds its documents (or their passages) itself")
    if "id" in doc and "_id" in doc:
        raise SpecError((*where, "_id"), "give the id once, as `id` or `_id`")
    extra = {name: value for name, value in doc.items() if name not in DOCUMENT_FIELDS and name not in ID_FIELDS}
    if not extra and "_id" not in doc:
        return doc
    metadata = doc.get("metadata")
    if extra and metadata is not None and not isinstance(metadata, dict):
        raise SpecError((*where, "metadata"), "must be an object")
    document = {name: value for name, value in doc.items() if name in DOCUMENT_FIELDS}
    if "_id" in doc:
        document["id"] = doc["_id"]
    if extra:
        document["metadata"] = {**(metadata or {}), **extra}
    return document


def field_types_of(fields: dict) -> dict[str, str | None]:
    """Each metadata field's type as an index's manifest decided it (None: not filterable)."""
    return {name: info.type for name, info in fields.items()}


def filterable_fields(manifest) -> frozenset[str] | None:
    """The fields a write may make filterable: the names the index was built with (`--filterable`, a collection's
    `filterable` setting), or None for every field. Indexes that predate the record: their filterable fields when a
    `--filterable` list left others out, else None."""
    if manifest.filterable is not None:
        return frozenset(manifest.filterable)
    fields = manifest.metadata
    if any(info.reason == "not listed in --filterable" for info in fields.values()):
        return frozenset(name for name, info in fields.items() if info.filterable)
    return None


@dataclass(frozen=True)
class VectorRule:
    """Documents may bring their own vector of `dimension` numbers; `required`: every one must (a collection whose
    embedder is `none`)."""

    dimension: int
    required: bool = False


def check_batch(documents, max_batch_docs: int, types: dict[str, str | None], vectors: VectorRule | None = None) -> list[dict]:  # noqa: C901
    """A write batch, checked whole and converted to what the log holds (so a logged record always applies):
    SpecError naming `documents[i].field` of the first problem. `types`: each metadata field's type in the collection
    (None: not filterable); a value its field cannot take is refused (decide_types settles the fields it adds).
    `vectors`: whether documents may (or must) carry a `vector`, kept as a unit float32 array."""
    if not isinstance(documents, list) or not documents:
        raise SpecError("documents", "must be a non-empty list of documents")
    if len(documents) > max_batch_docs:
        raise SpecError("documents", f"at most {max_batch_docs} documents per batch (HYBRID_MAX_BATCH_DOCS), got {len(documents)}")
    seen: dict[str, int] = {}
    checked = []
    for i, doc in enumerate(documents):
        where = ("documents", i)
        if not isinstance(doc, dict):
            raise SpecError(where, "must be an object with id, text and optionally title and metadata")
        doc = gathered(doc, where, vectors is not None)
        doc_id = check_id(doc.get("id"), (*where, "id"), written=True)
        if doc_id in seen:
            raise SpecError((*where, "id"), f"{doc_id!r} repeats documents[{seen[doc_id]}]: one version per id in a batch")
        seen[doc_id] = i
        doc = {**doc, "text": joined_paragraphs(doc["text"])} if "text" in doc else doc
        if "text" not in doc or not isinstance(doc["text"], str):
            raise SpecError((*where, "text"), "required: a string, or a list of strings (paragraphs, joined by a blank line)")
        title = "" if doc.get("title") is None else doc["title"]  # 0 or false is a mistake, not "no title"
        if not isinstance(title, str):
            raise SpecError((*where, "title"), "must be a string")
        for name, value in (("title", title), ("text", doc["text"])):
            if not encodable(value):
                raise SpecError((*where, name), "not valid Unicode (a lone surrogate such as \\ud800)")
        if not (doc["text"].strip() or title.strip()):
            raise SpecError((*where, "text"), "the document has neither text nor title")
        metadata = {} if doc.get("metadata") is None else doc["metadata"]
        if not isinstance(metadata, dict):
            raise SpecError((*where, "metadata"), "must be an object")
        converted = {}
        for name, value in metadata.items():
            if not encodable(name):
                raise SpecError((*where, "metadata"), "a field name is not valid Unicode (a lone surrogate such as \\ud800)")
            converted[name] = written_value(types.get(name), value, (*where, "metadata", name))[0]
        document = {"id": doc_id, "title": title, "text": doc["text"], "metadata": converted}
        if vectors is not None and "vector" in doc:
            document["vector"] = check_vector(doc["vector"], vectors.dimension, (*where, "vector"))
        elif vectors is not None and vectors.required:
            raise SpecError((*where, "vector"), "required: this collection embeds nothing itself (its embedder is `none`)")
        checked.append(document)
    return checked


def decide_types(documents: list[dict], types: dict[str, str | None], filterable: frozenset[str] | None) -> dict[str, str | None]:
    """The types of the metadata fields these (checked) documents add to a collection whose fields have `types`: a new
    field takes the type of its first value (not filterable when `filterable` (filterable_fields) leaves it out, or
    for a reserved `$` name); SpecError naming the value when a field's type cannot take it."""
    added: dict[str, str | None] = {}
    for i, doc in enumerate(documents):
        for name, value in doc["metadata"].items():
            known = types[name] if name in types else added.get(name)
            kind = written_value(known, value, ("documents", i, "metadata", name))[1]
            if kind is not None and name not in types and name not in added:
                allowed = filterable is None or name in filterable
                added[name] = type_of_kind(kind) if allowed and not name.startswith("$") else None
    return added


def check_ids(ids) -> list[str]:
    """The ids of a delete, checked (SpecError naming `ids[i]`)."""
    if not isinstance(ids, list) or not ids:
        raise SpecError("ids", "must be a non-empty list of document ids")
    return [check_id(doc_id, ("ids", i)) for i, doc_id in enumerate(ids)]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_id(doc_id, where, written: bool = False) -> str:
    """A document id: a non-empty string (or integer) of at most MAX_ID_BYTES of UTF-8; one `written` now also without
    control characters and not `.` or `..` (a URL path cannot carry those). Any other character, `/` included, is
    addressed percent-encoded in `/documents/{id}`."""
    if isinstance(doc_id, int) and not isinstance(doc_id, bool) and doc_id.bit_length() > 3 * MAX_ID_BYTES:
        raise SpecError(where, f"at most {MAX_ID_BYTES} bytes in UTF-8")  # (str() refuses integers of 4,300+ digits)
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or str(doc_id).strip() == "":
        raise SpecError(where, "required: a non-empty string (or integer) id")
    doc_id = str(doc_id)
    if not encodable(doc_id):
        raise SpecError(where, "not valid Unicode (a lone surrogate such as \\ud800)")
    size = len(doc_id.encode("utf-8"))
    if size > MAX_ID_BYTES:
        raise SpecError(where, f"at most {MAX_ID_BYTES} bytes in UTF-8, got {size}")
    if written and (_CONTROL.search(doc_id) or doc_id in (".", "..")):
        raise SpecError(where, "an id may not hold control characters, nor be . or ..")
    return doc_id
