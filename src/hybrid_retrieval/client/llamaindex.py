"""A LlamaIndex retriever over a collection: nodes for a query, scored by the service. Install llama-index-core
(`pip install "hybrid-retrieval-client[llamaindex]"`).

    retriever = HybridRetriever(client=Client(url, api_key=key), collection="docs", spec={"k": 5})
    retriever.retrieve("what is a quokka?")  # -> [NodeWithScore(node=TextNode(id_=..., text=...), score=...)]
"""

from __future__ import annotations

from typing import Any

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from hybrid_retrieval.client.client import AsyncClient, Client
from hybrid_retrieval.client.hits import hit_metadata, hit_text, retriever_request
from hybrid_retrieval.client.models import SearchRequest, SearchResponse


class HybridRetriever(BaseRetriever):
    """`spec`: any fields of a search (k, mode, fusion, filter, rerank, ...) as a SearchRequest or dict. Async
    retrieval uses `async_client` when given, else the blocking client."""

    def __init__(
        self,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        collection: str | None = None,
        spec: SearchRequest | dict | None = None,
        **kwargs: Any,
    ):
        if client is None and async_client is None:
            raise ValueError("HybridRetriever needs client= or async_client=")
        self.client, self.async_client, self.collection, self.spec = client, async_client, collection, spec
        super().__init__(**kwargs)

    def _nodes(self, response: SearchResponse) -> list[NodeWithScore]:
        return [
            NodeWithScore(node=TextNode(id_=hit.id, text=hit_text(hit), metadata=hit_metadata(hit, self.collection)), score=hit.score)
            for hit in response.hits
        ]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self.client is None:
            raise ValueError("this HybridRetriever has only an async_client: use aretrieve")
        return self._nodes(self.client.search(self.collection, retriever_request(self.spec, query_bundle.query_str)))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self.async_client is None:
            return self._retrieve(query_bundle)
        return self._nodes(await self.async_client.search(self.collection, retriever_request(self.spec, query_bundle.query_str)))
