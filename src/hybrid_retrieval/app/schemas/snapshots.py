"""Snapshots of a collection: taken, listed and restored."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from hybrid_retrieval.app.schemas.shared import Strict


class SnapshotOut(BaseModel):
    id: str = Field(examples=["products-20261125T101500123456Z"])
    collection: str = Field(description="the collection it was taken of")
    sequence: int = Field(description="the last write it holds: a restore holds exactly the writes acknowledged up to it")
    documents: int
    bytes: int = Field(description="size of the snapshot file")
    created_at: str
    manifest_sha256: str = Field(description="sha256 of the collection's manifest.json it holds")
    model: Literal["included", "referenced"] = Field(
        default="included", description="referenced: it holds its model's sha256s, not its files, and restores where that model is"
    )
    format: int


class SnapshotList(BaseModel):
    snapshots: list[SnapshotOut] = Field(description="oldest first")


class SnapshotRestore(Strict):
    snapshot: str = Field(description="the id of a listed snapshot", examples=["products-20261125T101500123456Z"])
