"""LangChain integrations: `HybridRetriever` (a BaseRetriever) and `HybridVectorStore` (a VectorStore whose texts the
service embeds). Install langchain-core (`pip install "hybrid-retrieval-client[langchain]"`).

    retriever = HybridRetriever(client=Client(url, api_key=key), collection="docs", spec={"k": 5})
    retriever.invoke("what is a quokka?")  # -> [Document(page_content=..., metadata={"id", "score", "rank", ...})]
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document as LCDocument
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStore
from pydantic import ConfigDict

from hybrid_retrieval.client.client import AsyncClient, Client
from hybrid_retrieval.client.hits import hit_metadata, hit_text, retriever_request
from hybrid_retrieval.client.models import Hit, SearchRequest

UPSERT_BATCH = 1000  # the server's default batch limit


def _document(hit: Hit, collection: str | None) -> LCDocument:
    return LCDocument(page_content=hit_text(hit), metadata=hit_metadata(hit, collection), id=hit.id)


class HybridRetriever(BaseRetriever):
    """Documents for a query from one collection, ranked by the service (hybrid by default, with the collection's
    tuned defaults). `spec`: any fields of a search (k, mode, fusion, filter, rerank, ...) as a SearchRequest or dict.
    Async calls use `async_client` when given, else run the blocking client in a thread."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Client | None = None
    async_client: AsyncClient | None = None
    collection: str | None = None
    spec: SearchRequest | dict | None = None

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[LCDocument]:
        if self.client is None:
            raise ValueError("HybridRetriever needs client= for blocking calls")
        response = self.client.search(self.collection, retriever_request(self.spec, query))
        return [_document(hit, self.collection) for hit in response.hits]

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun) -> list[LCDocument]:
        if self.async_client is None:
            return await super()._aget_relevant_documents(query, run_manager=run_manager)
        response = await self.async_client.search(self.collection, retriever_request(self.spec, query))
        return [_document(hit, self.collection) for hit in response.hits]


def content_id(text: str, metadata: dict) -> str:
    """The id a text gets when the caller gives none: a hash of the text and its metadata, the same in every process
    and run, so adding the same document twice stores it once (an upsert by id)."""
    canonical = json.dumps({"text": text, "metadata": metadata}, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


class HybridVectorStore(VectorStore):
    """A LangChain VectorStore over a collection: texts are upserted and embedded by the service (no Embeddings
    object needed), and searches are the service's hybrid searches. Scores are the service's (fused by default).
    A text added without an id gets `content_id(text, metadata)`: adding it again replaces it, never duplicates it."""

    def __init__(self, client: Client, collection: str, spec: SearchRequest | dict | None = None):
        self.client, self.collection, self.spec = client, collection, spec

    @property
    def embeddings(self) -> Embeddings | None:
        return None  # the service embeds

    def add_texts(
        self, texts: Iterable[str], metadatas: list[dict] | None = None, *, ids: list[str] | None = None, **kwargs: Any
    ) -> list[str]:
        texts = list(texts)
        metadatas = metadatas or [{} for _ in texts]
        ids = list(ids) if ids is not None else [content_id(text, metadata) for text, metadata in zip(texts, metadatas, strict=True)]
        documents = [{"id": i, "text": text, "metadata": metadata} for i, text, metadata in zip(ids, texts, metadatas, strict=True)]
        self.client.load(self.collection, documents) if len(documents) > 1000 else self.client.upsert(self.collection, documents, wait=True)
        return ids

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        if ids:
            self.client.delete(self.collection, list(ids), wait=True)
        return True

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: dict | None = None, **kwargs: Any
    ) -> list[tuple[LCDocument, float]]:
        body = {**retriever_request(self.spec, query), "k": k, **({"filter": filter} if filter else {}), **kwargs}
        response = self.client.search(self.collection, body)
        # a pin from outside the candidates has no score (kwargs may pin): NaN, as the pair needs a float
        return [(_document(hit, self.collection), math.nan if hit.score is None else hit.score) for hit in response.hits]

    def similarity_search(self, query: str, k: int = 4, filter: dict | None = None, **kwargs: Any) -> list[LCDocument]:
        return [document for document, _ in self.similarity_search_with_score(query, k, filter, **kwargs)]

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings | None = None,
        metadatas: list[dict] | None = None,
        *,
        client: Client | None = None,
        collection: str | None = None,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> HybridVectorStore:
        """A store over `collection` (created when it does not exist) holding `texts`; `embedding` is ignored."""
        if client is None or collection is None:
            raise ValueError("from_texts needs client= and collection=")
        if collection not in {c.name for c in client.list_collections()}:
            client.create_collection(collection)
        store = cls(client, collection)
        store.add_texts(texts, metadatas, ids=ids)
        return store
