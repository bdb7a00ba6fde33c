"""A chunked index: built with passages, its dense leg ranks documents by their best passage, exactly as brute force."""

import html
import itertools
import json
import shutil
import threading

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.common.errors import ConfigError, SpecError
from hybrid_retrieval.evaluation.server import running_server
from hybrid_retrieval.indexer import build_process
from hybrid_retrieval.indexer.build import BuildOptions, build_index
from hybrid_retrieval.indexer.chunking import ChunkingParams
from hybrid_retrieval.indexer.corpus import indexed_text, split_queries
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.manifest import read_manifest
from hybrid_retrieval.indexer.reembed import reembed
from hybrid_retrieval.indexer.shards.split import split_index
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.quality.metrics import evaluate
from hybrid_retrieval.search.bm25 import BM25Index
from hybrid_retrieval.search.passages import aggregate
from hybrid_retrieval.search.ranking import top_k
from hybrid_retrieval.search.spec import PassageSpec
from hybrid_retrieval.training.fusion import tune_fusion_on_index
from tests.conftest import LengthScorer, write_jsonl

CHUNKING = ChunkingParams("tokens", 64, 8)
OPTIONS = BuildOptions(precision="int8", device="cpu", progress=False, chunking=CHUNKING)


def long_documents(scifact, first: int, count: int, parts: int = 4) -> list[dict]:
    """`count` long documents of `parts` consecutive scifact abstracts each, from abstract `first` on."""
    with (scifact / "corpus.jsonl").open() as fh:
        docs = [json.loads(line) for line in itertools.islice(fh, first, first + count * parts)]
    return [
        {
            "_id": f"long-{(first + i) // parts}",
            "title": f"part {(first + i) // parts}",
            "text": "\n\n".join(f"{d['title']}. {d['text']}" for d in docs[i : i + parts]),
            "metadata": {"source": f"s{(first + i) // parts % 3}"},
        }
        for i in range(0, count * parts, parts)
    ]


@pytest.fixture(scope="module")
def chunked(scifact, tmp_path_factory):
    """12 long documents of 4 consecutive scifact abstracts each, cut into passages of 64 word pieces."""
    folder = tmp_path_factory.mktemp("chunked")
    build_index(write_jsonl(folder / "corpus.jsonl", long_documents(scifact, 0, 12)), folder / "index", OPTIONS)
    index = open_index(folder / "index", device="cpu", query_precision="int8")
    yield index
    index.close()


def test_the_manifest_and_files_describe_the_passages(chunked):
    manifest, passages = chunked.manifest, chunked.passages
    assert manifest.chunking == CHUNKING and manifest.counts["passages"] == len(passages) > 12 * 4
    assert any(name.startswith("passages/") for name in manifest.files)  # checksummed like every other file
    assert np.array_equal(np.unique(passages.rows), np.arange(12))
    for row in (0, 5, 11):
        doc = chunked.docs.get(row)
        mine = passages.passages_of(np.array([row]))
        np.testing.assert_array_equal(chunked.embeddings[row], passages.vectors[mine[0]])  # the document keeps its head's vector
        texts = [indexed_text(doc["title"], doc["text"][start:end]) for start, end in passages.spans[mine]]
        np.testing.assert_allclose(chunked.embedder.encode(texts), passages.vectors[mine], atol=1e-5)


@pytest.mark.parametrize("query", ["white matter development in infants", "DNA methylation", "myelin basic protein gene"])
def test_dense_ranks_documents_by_their_best_passage(chunked, query):
    pipeline = chunked.pipeline()
    result = pipeline.search(query, 5, {"mode": "dense"})
    vector = chunked.query_embedder.encode([query])[0]
    docs, scores = aggregate(chunked.passages.vectors @ vector, chunked.passages.rows, PassageSpec("max"))
    expected = top_k(scores, 5)
    assert result.ranking.doc_idx.tolist() == docs[expected.doc_idx].tolist()
    np.testing.assert_allclose(result.ranking.scores, expected.scores, atol=1e-5)
    hybrid = pipeline.search(query, 12, {"mode": "hybrid"})
    candidates = hybrid.fused.candidates
    np.testing.assert_allclose(candidates.scores["dense"], scores[candidates.doc_idx], atol=1e-5)  # every candidate by its passages


def test_what_a_chunked_index_does_not_do_is_refused_by_name(chunked, tmp_path):
    with pytest.raises(SpecError) as refused:
        chunked.pipeline().search("DNA", 5, {"mode": "dense", "hubness": {"method": "qbnorm"}})
    assert refused.value.field == "hubness.method" and "passages" in refused.value.reason
    with pytest.raises(ConfigError, match="chunked into passages"):
        split_index(chunked.path, tmp_path / "sharded", 2)
    with pytest.raises(ConfigError, match="re-embedding does not redo"):
        reembed(chunked.path, "all-MiniLM-L6-v2")


def test_hits_show_their_best_passages(chunked, tiny_index):
    pipeline, presenter = chunked.pipeline(), chunked.presenter()
    query = "diffusion tensor imaging of the newborn brain"
    for mode in ("dense", "bm25", "hybrid"):
        result = pipeline.search(query, 4, {"mode": mode})
        hits = presenter.hits(result, query, passages=presenter.check_passages(2))
        for hit in hits:
            text = chunked.document_by_id(hit["id"])["text"]
            shown = hit["passages"]
            assert len(shown) == 2 and shown[0]["score"] >= shown[1]["score"]
            assert all(text[p["start"] : p["end"]] == p["text"] and p["text"] for p in shown)
            if mode == "dense":  # a document scores as its best passage
                assert shown[0]["score"] == pytest.approx(hit["score"], abs=1e-5)
    with pytest.raises(SpecError, match="not chunked") as refused:
        open_index(tiny_index).presenter().check_passages(1)
    assert refused.value.field == "passages"


@pytest.mark.server
def test_the_service_shows_passages_and_groups(chunked, tiny_index):
    body = {"query": "myelination of white matter", "k": 3, "passages": 2, "group_by": {"field": "source", "size": 2}}
    with TestClient(create_app(Settings(index=chunked.path))) as client:
        answer = client.post("/search", json=body)
        assert answer.status_code == 200, answer.text
        hits = answer.json()["hits"]
        assert len(hits) == 3 and len({hit["group"]["value"] for hit in hits}) == 3
        for hit in hits:
            text = chunked.document_by_id(hit["id"])["text"]
            assert [text[p["start"] : p["end"]] for p in hit["passages"]] == [p["text"] for p in hit["passages"]]
            assert hit["group"]["hits"][0] == {"id": hit["id"], "score": hit["score"]}
        refused = client.post("/search", json={**body, "group_by": {"field": "title"}})
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "group_by", "field"]
        assert client.post("/search", json={**body, "passages": 21}).status_code == 422
    with TestClient(create_app(Settings(index=tiny_index))) as client:
        refused = client.post("/search", json={"query": "cat", "passages": 1})
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "passages"]


def test_the_reranker_reads_each_documents_best_passage(chunked):
    class Recorder(LengthScorer):
        def score(self, query, texts, batch_size=32):
            self.texts = list(texts)
            return super().score(query, texts)

    query = "DNA methylation in blood cells"
    recorder = Recorder()
    pipeline = chunked.pipeline(cross_encoder=recorder)
    result = pipeline.search(query, 4, {"mode": "bm25", "rerank": {"enabled": True, "depth": 4}})
    vector = chunked.query_embedder.encode([query])[0]
    first_stage = pipeline.search(query, 4, {"mode": "bm25"}).ranking.doc_idx
    expected = []
    for doc_idx in first_stage:
        doc = chunked.docs.get(int(doc_idx))
        passages = chunked.passages.passages_of(np.array([doc_idx]))
        start, end = chunked.passages.spans[passages[np.argmax(chunked.passages.vectors[passages] @ vector)]]
        expected.append(indexed_text(doc["title"], doc["text"][start:end]))
    assert recorder.texts == expected and result.reranked is not None


def hits_of(pipeline, query: str, ids, spec: dict) -> dict[str, float]:
    result = pipeline.search(query, 20, spec)
    return {ids(int(i)): float(s) for i, s in zip(result.ranking.doc_idx, result.ranking.scores)}


def dense_hits(pipeline, query: str, ids) -> dict[str, float]:
    return hits_of(pipeline, query, ids, {"mode": "dense"})


@pytest.mark.slow  # 10 s or more: a fresh build, a server, threads or a tuning
def test_writes_replace_all_of_a_documents_passages_and_rank_as_a_fresh_build(chunked, scifact, tmp_path):
    shutil.copytree(chunked.path, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index", device="cpu", query_precision="int8"))
    documents = {doc["_id"]: doc for doc in long_documents(scifact, 0, 12)}
    first, second = long_documents(scifact, 100, 1)[0], long_documents(scifact, 200, 1)[0]
    for doc in (first, {**second, "_id": first["_id"]}):  # written, then replaced by other text
        collection.upsert([{"id": doc["_id"], "title": doc["title"], "text": doc["text"], "metadata": doc["metadata"]}])
        documents[doc["_id"]] = doc
        snapshot = collection.refresh()
        presenter, pipeline = snapshot.presenter(), snapshot.pipeline()
        query = doc["text"].split("\n\n")[2][:120]  # the third part's opening: only this version holds it
        result = pipeline.search(query, 3, {"mode": "dense"})
        hits = presenter.hits(result, query, passages=3)
        assert hits[0]["id"] == doc["_id"]
        assert all(p["text"] in doc["text"] for p in hits[0]["passages"])  # no passage of the replaced version
    collection.delete(["long-3"])
    documents.pop("long-3")
    snapshot = collection.refresh()
    build_index(write_jsonl(tmp_path / "fresh.jsonl", list(documents.values())), tmp_path / "fresh", OPTIONS)
    fresh = open_index(tmp_path / "fresh", device="cpu", query_precision="int8")
    queries = ["white matter in preterm infants", "myelodysplastic syndrome", "DNA methylation", first["text"][:80]]
    ids = lambda i: snapshot.document(i)["id"]
    for query in queries:
        for spec in ({"mode": "bm25", "passage_scoring": {"bm25": "passages"}}, {"mode": "bm25"}):
            live, built = hits_of(snapshot.pipeline(), query, ids, spec), hits_of(fresh.pipeline(), query, lambda i: fresh.doc_ids[i], spec)
            assert live.keys() == built.keys() and all(live[d] == pytest.approx(built[d], rel=1e-4) for d in built), (query, spec)
        live, built = dense_hits(snapshot.pipeline(), query, ids), dense_hits(fresh.pipeline(), query, lambda i: fresh.doc_ids[i])
        assert set(live) == set(built) and "long-3" not in live
        for doc_id, score in built.items():
            assert live[doc_id] == pytest.approx(score, abs=1e-4), (query, doc_id)
    compacted = collection.compact()
    assert compacted.index.manifest.counts["passages"] == fresh.manifest.counts["passages"]
    for query in queries:
        after = dense_hits(compacted.pipeline(), query, lambda i: compacted.document(i)["id"])
        built = dense_hits(fresh.pipeline(), query, lambda i: fresh.doc_ids[i])
        assert after.keys() == built.keys() and all(after[d] == pytest.approx(built[d], abs=1e-4) for d in built)


@pytest.mark.process
def test_a_chunked_collection_compacted_in_a_child_process_writes_the_same_base(chunked, scifact, tmp_path, monkeypatch):
    """The passages a compaction carries reach a child build as files it maps: the same base as an in-process build."""
    written = long_documents(scifact, 100, 1)[0]

    def compacted(folder) -> dict[str, str]:
        shutil.copytree(chunked.path, folder)
        collection = Collection(open_index(folder, device="cpu", query_precision="int8"))
        collection.upsert([{"id": written["_id"], "title": written["title"], "text": written["text"], "metadata": written["metadata"]}])
        collection.delete(["long-3"])
        files = collection.compact().index.manifest.files
        collection.close()
        return {name: entry["sha256"] for name, entry in files.items()}

    in_process = compacted(tmp_path / "here")
    monkeypatch.setattr(build_process, "CHILD_ABOVE", 0)
    in_child = compacted(tmp_path / "child")
    assert in_child == in_process and any(name.startswith("passages/") for name in in_child)


def test_a_chunked_collection_takes_no_vectors(chunked, tmp_path):
    shutil.copytree(chunked.path, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index", device="cpu", query_precision="int8"))
    with pytest.raises(SpecError) as refused:
        collection.upsert([{"id": "x", "text": "a note", "vector": [0.1] * 384}])
    assert refused.value.field == "documents[0].vector"


@pytest.mark.slow  # 10 s or more: a fresh build, a server, threads or a tuning
def test_an_application_creates_fills_and_searches_a_chunked_collection(scifact, tmp_path):
    from tests.test_collections import WRITER, env_for

    data = tmp_path / "data"
    settings = {"embedder": {"precision": "int8"}, "chunking": {"method": "tokens", "size": 64, "overlap": 8}}
    docs = [{"id": d["_id"], "title": d["title"], "text": d["text"], "metadata": d["metadata"]} for d in long_documents(scifact, 0, 6)]
    with running_server(None, env_for(data)) as (url, _), httpx.Client(base_url=url, timeout=120, headers=WRITER) as client:
        for chunking, field in (({"method": "sentences"}, "method"), ({"method": "tokens", "size": 1000}, "size")):
            bad = client.post("/collections", json={"name": "x", "settings": {"chunking": chunking}})
            assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "settings", "chunking", field], bad.text
        created = client.post("/collections", json={"name": "long", "settings": settings})
        assert created.status_code == 201, created.text
        assert created.json()["settings"]["chunking"] == settings["chunking"]
        written = client.put("/collections/long/documents?wait=true", json={"documents": docs})
        assert written.status_code == 200, written.text
        query = docs[4]["text"].split("\n\n")[3][:100]  # the last part of one document
        hits = client.post("/collections/long/search", json={"query": query, "k": 2, "mode": "dense", "passages": 1}).json()["hits"]
        assert hits[0]["id"] == docs[4]["id"] and hits[0]["passages"][0]["text"] in docs[4]["text"]
        assert hits[0]["passages"][0]["start"] > len(docs[4]["text"]) // 2  # found by a passage far past the head
        refused = client.put("/collections/long/documents", json={"documents": [{"id": "v", "text": "x", "vector": [0.0] * 384}]})
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][-1] == "vector"


@pytest.mark.slow  # 10 s or more: a fresh build, a server, threads or a tuning
def test_searches_during_rewrites_never_see_a_stale_passage(chunked, scifact, tmp_path):
    """A document rewritten back and forth between two texts while four threads search: every hit's passages lie in
    the text that hit shows, and a delete leaves none of it."""
    shutil.copytree(chunked.path, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index", device="cpu", query_precision="int8"))
    versions = [doc["text"] for doc in (long_documents(scifact, 100, 1)[0], long_documents(scifact, 200, 1)[0])]
    queries = [text.split("\n\n")[1][:100] for text in versions]
    stop, problems, checked = threading.Event(), [], [0]

    def search() -> None:
        while not stop.is_set():
            snapshot = collection.view
            for query in queries:
                result = snapshot.pipeline().search(query, 5, {"mode": "hybrid"})
                for hit in snapshot.presenter().hits(result, query, include_text=True, passages=3):
                    checked[0] += 1
                    if any(p["text"] != hit["text"][p["start"] : p["end"]] for p in hit["passages"]):
                        problems.append(hit["id"])

    searchers = [threading.Thread(target=search) for _ in range(4)]
    for thread in searchers:
        thread.start()
    for i in range(6):
        collection.upsert([{"id": "moving", "title": "", "text": versions[i % 2]}])
        collection.refresh()
    collection.delete(["moving"])
    final = collection.refresh()
    stop.set()
    for thread in searchers:
        thread.join()
    assert checked[0] > 20 and problems == []
    for query in queries:
        assert "moving" not in {final.document(int(i))["id"] for i in final.pipeline().search(query, 20).ranking.doc_idx}


def test_semantic_highlights_are_the_nearest_passage_without_a_model_run(chunked):
    class NoModel:
        def encode(self, texts, batch_size=32):
            raise AssertionError("a chunked index's semantic highlight needs no model run")

    query = "zzqxv"  # no term of it is in the corpus: every hit is a purely dense match
    result = chunked.pipeline().search(query, 3, {"mode": "dense", "highlight": {"semantic": True}})
    presenter = chunked.presenter(embedder=NoModel())
    for hit in presenter.hits(result, query, passages=1):
        nearest = hit["passages"][0]
        assert hit["highlight"]["semantic"] == {**nearest, "text": html.escape(nearest["text"])}


@pytest.mark.slow  # 10 s or more: a fresh build, a server, threads or a tuning
def test_tuning_chooses_passage_scoring_on_train_queries_and_records_why(chunked, scifact, tmp_path):
    shutil.copytree(chunked.path, tmp_path / "index")
    with (scifact / "corpus.jsonl").open() as fh:
        long_of = {json.loads(line)["_id"]: f"long-{i // 4}" for i, line in enumerate(itertools.islice(fh, 48))}
    queries, qrels = split_queries(scifact, "train")
    qrels = {q: {long_of[d]: g for d, g in judged.items() if d in long_of} for q, judged in qrels.items()}
    qrels = {q: judged for q, judged in qrels.items() if judged}
    queries = {q: queries[q] for q in qrels}
    assert len(queries) >= 5
    tune_fusion_on_index(tmp_path / "index", queries, qrels, "train.tsv", progress=False, query_precision="int8")
    manifest = read_manifest(tmp_path / "index")
    proof, lexical = manifest.evidence["passage_scoring"]["dense"], manifest.evidence["passage_scoring"]["bm25"]
    assert set(proof["candidates"]) == {"max", "soft t=0.02 top=3", "soft t=0.05 top=3", "soft t=0.1 top=3"}
    assert set(lexical["candidates"]) == {"document", "passages"}
    chosen = manifest.defaults.passage_scoring
    assert (chosen.aggregation != "max") == (proof["decision"] == "tuned")
    assert (chosen.bm25 == "passages") == (lexical["decision"] == "tuned")
    assert proof["values"]["untuned max"] == proof["candidates"]["max"]
    index = open_index(tmp_path / "index", device="cpu", query_precision="int8")
    run = {}
    for qid, text in queries.items():  # the untuned value is the dense leg's nDCG@10 with max, recomputed here
        ranking = index.pipeline().search(text, 100, {"mode": "dense", "passage_scoring": {"aggregation": "max"}}).ranking
        run[qid] = {index.doc_ids[i]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores)}
    assert evaluate(run, qrels, ("ndcg@10",))["ndcg@10"] == pytest.approx(proof["values"]["untuned max"], abs=1e-4)


@pytest.mark.parametrize("query", ["white matter development in infants", "DNA methylation of blood cells"])
def test_bm25_on_passages_scores_each_document_by_its_best_passage(chunked, tiny_index, query):
    passages = chunked.passages
    texts = []
    for row, (start, end) in zip(passages.rows.tolist(), passages.spans.tolist()):
        doc = chunked.docs.get(row)
        texts.append(indexed_text(doc["title"], doc["text"][start:end]))
    reference = BM25Index.build([chunked.analyzer.analyze(t) for t in texts], chunked.analyzer, chunked.manifest.bm25)  # bm25s's scores
    scores = reference.scores(query)
    hit = np.flatnonzero(scores)
    docs, best = aggregate(scores[hit], passages.rows[hit], PassageSpec())
    expected = top_k(best, 12)
    result = chunked.pipeline().search(query, 12, {"mode": "bm25", "passage_scoring": {"bm25": "passages"}})
    assert result.ranking.doc_idx.tolist() == docs[expected.doc_idx].tolist()
    np.testing.assert_allclose(result.ranking.scores, expected.scores, rtol=1e-5)
    with pytest.raises(SpecError, match="not chunked") as refused:
        open_index(tiny_index).pipeline().search(query, 3, {"mode": "bm25", "passage_scoring": {"bm25": "passages"}})
    assert refused.value.field == "passage_scoring.bm25"


def test_framework_retrievers_hand_on_the_best_passages():
    from hybrid_retrieval.client.hits import hit_metadata, hit_text
    from hybrid_retrieval.client.models import Hit

    passages = [{"text": "the best part", "start": 40, "end": 53, "score": 0.8}, {"text": "another", "start": 2, "end": 9, "score": 0.6}]
    hit = Hit.model_validate({"id": "d", "score": 0.8, "rank": 1, "title": "T", "text": "whole text", "passages": passages})
    assert hit_text(hit) == "the best part\n\nanother"
    assert hit_metadata(hit, "c")["passages"] == [{k: v for k, v in p.items() if k != "text"} for p in passages]
    whole = Hit.model_validate({"id": "d", "score": 0.8, "rank": 1, "title": "T", "text": "whole text"})
    assert hit_text(whole) == "whole text" and "passages" not in hit_metadata(whole, "c")


@pytest.mark.process
def test_the_search_command_shows_passages_and_bad_chunking_is_one_line(chunked, tmp_path):
    from tests.test_cli import hybrid

    result = hybrid("search", chunked.path, "myelin basic protein", "--mode", "dense", "--k", "2", "--passages", "2", "--json")
    assert result.returncode == 0, result.stderr
    for hit in json.loads(result.stdout)["hits"]:
        text = chunked.document_by_id(hit["id"])["text"]
        assert len(hit["passages"]) == 2 and all(text[p["start"] : p["end"]] == p["text"] for p in hit["passages"])
    refused = hybrid("index", tmp_path / "corpus.jsonl", "--out", tmp_path / "index", "--chunking", "tokens:64:40")
    assert refused.returncode == 2 and "overlap" in refused.stderr and not (tmp_path / "index").exists()
