"""The Python client against a real server process: every method, blocking and async (one scenario run through both),
the typed error of each 4xx, retries observed against a server answering 503 with Retry-After, the bulk load's
progress, and the LangChain and LlamaIndex retrievers returning what POST /search returns."""

from __future__ import annotations

import ast
import asyncio
import inspect
import itertools
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from hybrid_retrieval.client import (
    NO_RETRY,
    RRF,
    AsyncClient,
    AuthError,
    Client,
    CollectionSettings,
    Conflict,
    ConvexCombination,
    CurationRule,
    NotFound,
    PayloadTooLarge,
    Retry,
    SearchRequest,
    SynonymRule,
    Unavailable,
    ValidationError,
)
from hybrid_retrieval.client.calls import Call, nothing
from hybrid_retrieval.evaluation.server import free_port, running_server

WRITE, READ = "client-writer", "client-reader"
TOPICS = ["quokka", "harbor", "maple", "quartz", "falcon", "lantern"]


def corpus(count: int, prefix: str = "d") -> list[dict]:
    return [
        {
            "id": f"{prefix}{i}",
            "title": f"{TOPICS[i % 6]} note {i}",
            "text": f"a note about the {TOPICS[i % 6]} and the {TOPICS[(i * 5) % 6]}, number {i}",
            "metadata": {"year": 2000 + i % 5, "tag": TOPICS[i % 3]},
        }
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data = tmp_path_factory.mktemp("client") / "data"
    env = {
        "HYBRID_DATA": str(data),
        "HYBRID_WRITE_KEYS": WRITE,
        "HYBRID_API_KEYS": READ,
        "HYBRID_VERIFY": "size",
        "HYBRID_REFRESH_INTERVAL": "0.1",
        "HYBRID_MAX_IN_FLIGHT": "1",  # the retry test fills it
        "HYBRID_MAX_WRITE_BODY_BYTES": "65536",  # the 413 test passes it
    }
    with running_server(None, env) as (url, _):
        yield url


class Blocking:
    """Calls a Client's methods."""

    def __init__(self, url: str, **options):
        self.client = Client(url, **options)

    def __call__(self, method: str, *args, **kwargs):
        result = getattr(self.client, method)(*args, **kwargs)
        return list(result) if inspect.isgenerator(result) else result

    def close(self):
        self.client.close()


class Awaited:
    """Calls an AsyncClient's methods, each awaited on one event loop."""

    def __init__(self, url: str, **options):
        self.loop = asyncio.new_event_loop()
        self.client = AsyncClient(url, **options)

    def __call__(self, method: str, *args, **kwargs):
        result = getattr(self.client, method)(*args, **kwargs)
        if inspect.isasyncgen(result):

            async def collect():
                return [item async for item in result]

            return self.loop.run_until_complete(collect())
        return self.loop.run_until_complete(result)

    def close(self):
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


# the async run of the scenario is slow-marked (CI runs it) to keep the default suite within its time
@pytest.fixture(params=[Blocking, pytest.param(Awaited, marks=pytest.mark.slow)], ids=["Client", "AsyncClient"])
def kind(request):
    return request.param


@pytest.mark.server
def test_every_method_of_both_clients(server, kind, tmp_path):
    call = kind(server, api_key=WRITE)
    name = f"notes-{kind.__name__.lower()}"
    try:
        assert call("health") is True
        assert call("ready").ready is True
        info = call("create_collection", name, CollectionSettings(filterable=["year", "tag"], bm25={"k1": 1.2}))
        assert (info.name, info.documents, info.settings["bm25"]["k1"]) == (name, 0, 1.2)
        assert name in {c.name for c in call("list_collections")}

        # a bulk load from a JSONL file, as tasks of 7 documents, its progress reported
        source = tmp_path / "corpus.jsonl"
        beir = [{"_id": d["id"], "title": d["title"], "text": d["text"], "metadata": d["metadata"]} for d in corpus(24)]
        source.write_text("".join(json.dumps(row) + "\n" for row in beir))
        seen: list[tuple[int, int | None]] = []
        report = call("load", name, source, batch_documents=7, progress=lambda done, total: seen.append((done, total)))
        assert [t.documents_total for t in report.tasks] == [7, 7, 7, 3] and report.loaded == report.sent == 24
        assert seen[-1] == (24, 24) and all(a[0] <= b[0] for a, b in itertools.pairwise(seen))
        assert call("task", report.tasks[0].id).state == "succeeded"
        assert {t.id for t in report.tasks} <= {t.id for t in call("tasks", name)}
        written = call(
            "upsert", name, [{"id": "extra", "text": "the quokka smiles", "metadata": {"year": 2024, "tag": "quokka"}}], wait=True
        )
        assert written.visible and written.documents == 1
        assert call("get_document", name, "extra").text == "the quokka smiles"

        # searches: keywords, a typed request, a batch, every page
        plain = call("search", name, query="quokka", k=5)
        assert "extra" in [h.id for h in plain.hits] and [h.rank for h in plain.hits] == [1, 2, 3, 4, 5]
        typed = call(
            "search",
            name,
            SearchRequest(query="quokka falcon", k=4, fusion=ConvexCombination(alpha=0.3), explain=True, filter={"year": {"gte": 2002}}),
            highlight=True,
            facets=["tag"],
            fields="*",
        )
        assert typed.spec["fusion"]["method"] == "cc" and typed.spec["fusion"]["alpha"] == 0.3
        assert all(h.fields["year"] >= 2002 and h.explain.final == pytest.approx(h.score) for h in typed.hits)
        assert typed.facets["tag"] and any(h.highlight.text or h.highlight.title for h in typed.hits)
        batch = call("search_batch", name, [{"query": "maple"}, SearchRequest(query="harbor", fusion=RRF(rrf_k=10), k=3)])
        assert [len(r.hits) for r in batch] == [10, 3] and batch[1].spec["fusion"]["rrf_k"] == 10
        everything = call("search", name, query="note", mode="bm25", k=100)
        paged = call("iter_hits", name, query="note", mode="bm25", page_size=4)
        assert [h.id for h in paged] == [h.id for h in everything.hits] and len(paged) == 24

        # changes
        assert call("update_settings", name, {"mode": "bm25"}).defaults["mode"] == "bm25"
        assert call("search", name, query="wombat", mode="bm25").hits == []
        info = call("update_settings", name, synonyms=[SynonymRule(from_="wombat", to=["quokka"])])
        assert info.settings["synonyms"] == [{"from": ["wombat"], "to": ["quokka"]}]
        expanded, direct = (call("search", name, query=q, mode="bm25", k=100).hits for q in ("wombat", "quokka"))
        assert [h.id for h in expanded] == [h.id for h in direct] and direct
        # steering: a boost explained, a sort, pins and hidden documents, a curation rule (kept by the compaction below)
        boosted = call(
            "search", name, SearchRequest(query="note", mode="bm25", k=5, explain=True, boosts=[{"field": "year", "weight": 0.1}])
        )
        for hit in boosted.hits:
            assert hit.explain.boosted.base + sum(b.contribution for b in hit.explain.boosted.boosts) == pytest.approx(hit.score)
            assert hit.explain.boosted.boosts[0].value in range(2000, 2005)
        by_year = call("search", name, query="note", mode="bm25", k=30, sort=["year:desc"], fields=["year"])
        years = [h.fields["year"] for h in by_year.hits if "year" in h.fields]
        assert years == sorted(years, reverse=True) and len(years) > 20
        top = boosted.hits[0].id
        curated = call("search", name, query="note", mode="bm25", k=3, pinned=["d20", "missing"], hidden=[top])
        assert curated.hits[0].id == "d20" and top not in [h.id for h in curated.hits]
        info = call("update_settings", name, curation=[CurationRule(query="Quokka  Note", match="contains", pinned=["d9"])])
        assert info.curation == [{"query": "Quokka  Note", "match": "contains", "pinned": ["d9"], "hidden": []}]
        assert call("search", name, query="the quokka note", k=2).hits[0].id == "d9"
        assert call("delete", name, ["d1", "d2"], wait=True).documents == 2
        assert call("delete_document", name, "d3", wait=True).documents == 1
        stats = call("stats", name)
        assert stats.documents == 22 and stats.writable
        assert call("compact", name).live_documents == 0
        assert call("search", name, query="quokka note", k=1).hits[0].id == "d9" and call("get_collection", name).curation
        assert call("set_alias", f"{name}-live", name) == {**call("aliases")}
        assert call("search", f"{name}-live", query="quokka", k=5).hits == call("search", name, query="quokka", k=5).hits

        # snapshots: take, list, download, restore from the list and from the file, delete
        snapshot = call("create_snapshot", name)
        assert snapshot.documents == 22 and [s.id for s in call("snapshots", name)] == [snapshot.id]
        downloaded = call("download_snapshot", name, snapshot.id, tmp_path)
        assert downloaded.stat().st_size == snapshot.bytes
        assert call("restore_snapshot", f"{name}-copy", snapshot_id=snapshot.id).documents == 22
        assert call("restore_snapshot", f"{name}-copy", file=downloaded, replace=True).documents == 22
        assert call("search", f"{name}-copy", query="quokka", k=3).hits == call("search", name, query="quokka", k=3).hits
        call("delete_snapshot", name, snapshot.id)
        assert call("snapshots", name) == []

        assert "hybrid_requests_total" in call("metrics")
        assert call("reload").collections >= 2
        call("drop_alias", f"{name}-live")
        for dropped in (f"{name}-copy", name):
            call("drop_collection", dropped)
        assert name not in {c.name for c in call("list_collections")}
    finally:
        call.close()


@pytest.mark.server
def test_each_refusal_raises_its_error(server):
    with Client(server, api_key=WRITE) as client:
        client.create_collection("errors")
        client.upsert("errors", corpus(3), wait=True)
        with pytest.raises(ValidationError) as invalid:
            client.search("errors", query="quokka", k=0)
        assert invalid.value.status == 422 and invalid.value.field == ["body", "k"]
        with pytest.raises(ValidationError) as bad_fusion:
            client.search("errors", query="quokka", fusion={"method": "cc", "alpha": 2})
        assert bad_fusion.value.field[:3] == ["body", "fusion", "alpha"]
        with pytest.raises(NotFound):
            client.get_document("errors", "missing")
        with pytest.raises(NotFound):
            client.search("no-such-collection", query="x")
        with pytest.raises(Conflict):
            client.create_collection("errors")
        with pytest.raises(PayloadTooLarge):
            client.upsert("errors", [{"id": "big", "text": "word " * 20_000}])
    with Client(server) as anonymous, pytest.raises(AuthError) as missing:
        anonymous.search("errors", query="quokka")
    assert missing.value.status == 401
    with Client(server, api_key=READ) as reader:
        assert reader.search("errors", query="quokka").hits
        with pytest.raises(AuthError) as forbidden:
            reader.upsert("errors", corpus(1))
        assert forbidden.value.status == 403


@pytest.mark.server
def test_busy_answers_are_retried_after_what_retry_after_says(server):
    """HYBRID_MAX_IN_FLIGHT is 1: while other clients keep batches of searches in flight, a search is answered 503 with
    Retry-After: 1; the client waits that long and tries again until it gets through."""
    with Client(server, api_key=WRITE) as client:
        client.create_collection("busy")
        client.upsert("busy", corpus(30), wait=True)
    stop = threading.Event()

    def flood():
        with httpx.Client(base_url=server, headers={"X-API-Key": READ}, timeout=60) as http:
            searches = [{"query": f"{TOPICS[i % 6]} {i}", "k": 30, "highlight": True} for i in range(16)]
            while not stop.is_set():
                http.post("/collections/busy/search/batch", json={"searches": searches})

    def seen(response):
        answers.append((time.monotonic(), response.status_code))
        if response.status_code == 503:
            stop.set()  # the floods stop once the client has been turned away: its retry gets through

    floods = [threading.Thread(target=flood) for _ in range(3)]
    for thread in floods:
        thread.start()
    answers: list[tuple[float, int]] = []
    http = httpx.Client(base_url=server, headers={"X-API-Key": READ}, event_hooks={"response": [seen]}, timeout=60)
    deadline = time.monotonic() + 60
    try:
        with Client(server, http=http, retry=Retry(attempts=30)) as client:
            # a search can slip between two batches: search until one is turned away
            while not stop.is_set() and time.monotonic() < deadline:
                response = client.search("busy", query="quokka", k=3)
    finally:
        stop.set()
        for thread in floods:
            thread.join()
    statuses = [status for _, status in answers]
    assert response.hits and statuses[-1] == 200 and 503 in statuses, statuses
    waits = [later - earlier for (earlier, status), (later, _) in itertools.pairwise(answers) if status == 503]
    assert min(waits) >= 0.95, waits  # Retry-After: 1


class LosesAnAnswer(httpx.HTTPTransport):
    """The network between client and server: while `armed`, a request reaches the server, which acts on it, and its
    answer is lost on the way back."""

    armed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if self.armed:
            self.armed = False
            response.read()
            response.close()
            raise httpx.ReadTimeout("the answer was lost", request=request)
        return response


@pytest.mark.server
def test_a_retried_drop_whose_first_answer_was_lost_succeeds(server):
    """A drop answered 404 on its retry, after a try that reached the server, was done by that try: the caller is
    told it succeeded. A 404 on a first try is still NotFound."""
    network = LosesAnAnswer()
    http = httpx.Client(base_url=server, headers={"X-API-Key": WRITE}, transport=network, timeout=60)
    with Client(server, http=http, retry=Retry(attempts=3, backoff=0.01)) as client:
        client.create_collection("lost")
        client.create_collection("kept")
        client.set_alias("lost-live", "lost")
        client.set_alias("kept-live", "kept")
        network.armed = True
        left = client.drop_alias("lost-live")
        assert "lost-live" not in left and left["kept-live"] == "kept" and left == client.aliases()
        network.armed = True
        assert client.drop_collection("lost") is None
        assert "lost" not in [c.name for c in client.list_collections()]
        with pytest.raises(NotFound):
            client.drop_collection("lost")
        with pytest.raises(NotFound):
            client.drop_alias("lost-live")
        client.drop_alias("kept-live")
        client.drop_collection("kept")


def test_no_server_answers_unavailable_after_the_retries():
    port = free_port()
    tries = []
    hooks = {"request": [lambda request: tries.append(request.url)]}
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", event_hooks=hooks, timeout=2)
    with Client(http=http, retry=Retry(attempts=3, backoff=0.01)) as client, pytest.raises(Unavailable):
        client.health()
    assert len(tries) == 3
    with Client(f"http://127.0.0.1:{port}", retry=NO_RETRY) as client, pytest.raises(Unavailable):
        client.health()


def test_the_retry_policy():
    policy = Retry(attempts=3, backoff=0.5, max_wait=10)
    read, write = Call("GET", "/x", nothing), Call("POST", "/x", nothing, idempotent=False)
    busy = httpx.Response(503, headers={"Retry-After": "4"})
    assert policy.wait(read, 0, busy) == 4.0
    assert policy.wait(read, 0, httpx.Response(429, headers={"Retry-After": "60"})) == 10  # capped
    assert policy.wait(read, 2, busy) is None  # the last attempt
    assert policy.wait(write, 0, busy) is None
    assert policy.wait(read, 0, httpx.Response(500)) is None and policy.wait(read, 0, httpx.Response(200)) is None
    assert 0.75 * 0.5 <= policy.wait(read, 0, None) <= 1.25 * 0.5  # a connection error: backoff with jitter
    assert 0.75 <= policy.wait(read, 1, httpx.Response(502)) <= 1.25
    dated = httpx.Response(503, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert policy.wait(read, 0, dated) == 0.0  # a date in the past


@pytest.mark.server
def test_a_bulk_load_draws_a_progress_bar(server, capsys):
    with Client(server, api_key=WRITE) as client:
        client.create_collection("progress")
        report = client.load("progress", corpus(12), batch_documents=5, progress=True)
    assert report.loaded == 12
    bar = capsys.readouterr().err
    assert "12/12" in bar and "docs/s" in bar


@pytest.mark.server
def test_framework_retrievers_return_what_search_returns(server):
    from hybrid_retrieval.client.langchain import HybridRetriever as LangChainRetriever
    from hybrid_retrieval.client.langchain import HybridVectorStore
    from hybrid_retrieval.client.llamaindex import HybridRetriever as LlamaIndexRetriever

    with Client(server, api_key=WRITE) as client:
        client.create_collection("rag", {"filterable": ["year", "tag"]})
        client.upsert("rag", corpus(30), wait=True)
    spec = {"k": 6, "filter": {"tag": "quokka"}}
    with httpx.Client(base_url=server, headers={"X-API-Key": READ}) as http:
        expected = http.post("/collections/rag/search", json={"query": "falcon lantern", **spec}).json()["hits"]
    ids, scores = [h["id"] for h in expected], [h["score"] for h in expected]
    assert len(ids) == 6

    with Client(server, api_key=READ) as client:
        lc = LangChainRetriever(client=client, collection="rag", spec=spec)
        li = LlamaIndexRetriever(client=client, collection="rag", spec=spec)

        async def awaited():
            async with AsyncClient(server, api_key=READ) as aclient:
                lc_async = LangChainRetriever(client=client, async_client=aclient, collection="rag", spec=spec)
                li_async = LlamaIndexRetriever(async_client=aclient, collection="rag", spec=spec)
                return await lc_async.ainvoke("falcon lantern"), await li_async.aretrieve("falcon lantern")

        lc_awaited, li_awaited = asyncio.run(awaited())
        for documents in (lc.invoke("falcon lantern"), lc_awaited):
            assert [d.metadata["id"] for d in documents] == ids and [d.metadata["score"] for d in documents] == scores
            assert documents[0].page_content.startswith("a note about") and documents[0].metadata["tag"] == "quokka"
        for nodes in (li.retrieve("falcon lantern"), li_awaited):
            assert [n.node.node_id for n in nodes] == ids and [n.score for n in nodes] == scores
            assert nodes[0].node.metadata["year"] >= 2000

    with Client(server, api_key=WRITE) as writer:
        store = HybridVectorStore.from_texts(
            ["the quokka smiles at dawn", "a falcon over the harbor"], metadatas=[{"n": 1}, {"n": 2}], client=writer, collection="store"
        )
        found = store.similarity_search_with_score("quokka", k=1)
        assert found[0][0].page_content == "the quokka smiles at dawn" and found[0][0].metadata["n"] == 1
        store.delete([found[0][0].metadata["id"]])
        assert [d.page_content for d in store.similarity_search("quokka", k=2)] == ["a falcon over the harbor"]


@pytest.mark.process
def test_a_store_gives_a_text_the_same_id_in_every_process():
    """Ids made from Python's hash() differ between processes (PYTHONHASHSEED): the same document added by two runs
    of an app was stored twice. Without ids given, a text's id is a hash of its content and metadata."""
    script = (
        "from hybrid_retrieval.client.langchain import HybridVectorStore\n"
        "class Sink:\n"
        "    def upsert(self, collection, documents, wait=None): pass\n"
        "print(HybridVectorStore(Sink(), 'c').add_texts(['a quokka', 'a falcon'], [{'n': 1}, {'n': 2}]))\n"
    )
    command = [sys.executable, "-c", script]
    runs = [subprocess.run(command, env={**os.environ, "PYTHONHASHSEED": s}, capture_output=True, text=True, check=True) for s in "12"]
    assert runs[0].stdout == runs[1].stdout and len(set(ast.literal_eval(runs[0].stdout))) == 2
