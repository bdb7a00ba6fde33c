"""The documents of a collection: writes, reads, their counts (GET /stats), and the bulk loads (tasks)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from hybrid_retrieval.app.schemas.shared import CONTROL_CHARS, SPACE_CHARS, Float, Strict

DOC_ID_PATTERN = f"[^{SPACE_CHARS}{CONTROL_CHARS}]"  # holds a character that is neither space nor control


class DocumentIn(BaseModel):
    """The format `hybrid index` reads a corpus line in too: any other field is a metadata field (over the `metadata`
    object's field of that name), and `_id` may stand for `id`."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {"id": "n1", "title": "Quokkas", "text": "The quokka is a small marsupial.", "metadata": {"year": 2024}},
                {"_id": "n2", "title": "Falcons", "text": "Falcons dive fast.", "year": 2023, "tags": ["birds"]},
            ]
        },
    )

    id: str | int = Field(
        description="unique id (or `_id`, as in a BEIR corpus), at most 512 bytes of UTF-8, no control characters, not . "
        "or ..; an existing id is replaced. `/documents/{id}` takes it percent-encoded (a/b as a%2Fb)"
    )
    title: str | None = None
    text: str | list[str] = Field(
        description="the body (may be empty when the title is not), or its paragraphs as a list (stored joined by a blank line)"
    )
    metadata: dict[str, Any] | None = Field(
        default=None,
        description="strings, numbers, true/false, lists of strings, ISO-8601 dates; "
        "a field keeps the type the index or its first write gave it (another "
        "type answers 422)",
    )
    vector: list[Float] | None = Field(
        default=None,
        description="the document's embedding, of the collection's dimension (normalised to unit length): stored instead "
        "of embedding its text; required by collections whose embedder is `none`",
    )


class DocumentBatch(BaseModel):
    documents: list[DocumentIn] = Field(description="upserted all or nothing; at most HYBRID_MAX_BATCH_DOCS (1,000)")


DocumentId = Annotated[str, Field(min_length=1, max_length=512, pattern=r"\S", description="at most 512 bytes of UTF-8")]


class DeleteRequest(Strict):
    ids: list[DocumentId | StrictInt] = Field(  # an integer id too, as a document may have been written with
        ..., min_length=1, description="documents to delete (an id that does not exist is no error)", examples=[["n1", "n2"]]
    )


class DocumentOut(BaseModel):
    id: str
    title: str
    text: str
    metadata: dict[str, Any]


class WriteResult(BaseModel):
    sequence: int = Field(description="the write's sequence number: durable in the write-ahead log when answered")
    documents: int = Field(description="documents in the write")
    visible: bool = Field(description="whether searches see it yet (always true with ?wait=true)")


class Stats(BaseModel):
    documents: int = Field(description="documents that exist now (searchable)")
    base_documents: int = Field(description="documents of the built index (the base segment), deleted ones included")
    deleted_base_documents: int | None = None
    live_documents: int | None = Field(default=None, description="documents written since the build (the live segment)")
    last_sequence: int | None = Field(default=None, description="the last acknowledged write")
    visible_sequence: int | None = Field(default=None, description="the last write searches see")
    writable: bool = Field(description="whether writes can be taken now")
    write_refusal: str | None = Field(
        default=None,
        description="why not: this index takes no writes, its folder is read-only, "
        "or the last write failed (the disk was full); cleared by the next write that succeeds",
    )
    temporary_bytes: int | None = Field(
        default=None,
        description="disk used beside the index by builds and compactions in progress (or left by a killed one: removed at the next start)",
    )


class TaskInfo(BaseModel):
    id: str
    collection: str
    state: Literal["queued", "running", "succeeded", "failed", "interrupted"]
    documents_total: int
    documents_done: int = Field(description="documents durable in the collection (acknowledged)")
    documents_per_second: float | None = None
    last_sequence: int | None = Field(default=None, description="the sequence number of the last batch logged")
    error: str | None = None
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    seconds: float


class TaskList(BaseModel):
    tasks: list[TaskInfo]
