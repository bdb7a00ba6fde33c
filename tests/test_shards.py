"""Sharded indexes in one process: corpus-wide BM25 statistics, and a coordinator whose answers equal the whole index's."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.common.errors import ConfigError, HybridError, SpecError
from hybrid_retrieval.indexer.build import BuildOptions, build_index
from hybrid_retrieval.indexer.shards.layout import SHARDS_FILE, read_shards, shard_of
from hybrid_retrieval.indexer.shards.open import open_sharded
from hybrid_retrieval.indexer.shards.split import global_bm25, split_index
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.bm25 import BM25Params
from hybrid_retrieval.search.curation import Curation
from hybrid_retrieval.search.postings import Postings
from tests.conftest import REPO, STEERED_SPECS, sample_queries
from tests.conftest import SHARDED_SLICE as SLICE

# Every mode, both fusions, tmm floors under a correction, static and dynamic hubness, filters of each field type.
SPECS = [
    {"mode": "bm25"},
    {"mode": "dense"},
    {"mode": "hybrid"},
    {"mode": "hybrid", "fusion": {"method": "rrf", "rrf_k": 10, "weights": [0.7, 1.3]}, "depth": 30},
    {"mode": "hybrid", "fusion": {"method": "cc", "norm": "zscore", "alpha": 0.6}},
    {"mode": "hybrid", "fusion": {"method": "cc", "norm": "tmm", "alpha": 0.4}, "hubness": {"method": "qbnorm", "dynamic": True}},
    {"mode": "dense", "hubness": {"method": "dbnorm"}},
    {"mode": "dense", "hubness": {"method": "dbnorm", "dynamic": True}},
    {"mode": "hybrid", "fusion": {"method": "cc", "norm": "minmax"}, "hubness": {"method": "qbnorm"}},
    {"mode": "hybrid", "filter": {"year": {"gte": 2005}}},
    {"mode": "hybrid", "filter": {"tags": "b"}, "hubness": {"method": "qbnorm", "dynamic": True}},
    {"mode": "dense", "filter": {"flag": True}},
    {"mode": "bm25", "filter": {"$not": {"tags": "z"}}},
    {"mode": "bm25", "text_fields": {"title": 3, "text": 1}},  # BM25F with the corpus's fields' average lengths
    {"mode": "hybrid", "text_fields": {"title": 1}, "filter": {"year": {"lt": 2010}}},
    *STEERED_SPECS,
]


def test_split_puts_each_document_in_the_shard_its_id_hashes_to(whole_index, sharded_index):
    whole = open_index(whole_index)
    info = read_shards(sharded_index)
    assert info["documents"] == SLICE and sum(s["documents"] for s in info["shards"]) == SLICE
    for i, shard in enumerate(info["shards"]):
        index = open_index(sharded_index / shard["folder"])
        positions = np.load(sharded_index / shard["folder"] / "positions.npy")
        assert list(positions) == sorted(positions) and index.num_docs == len(positions) > 0
        for position, doc_id in zip(positions, index.doc_ids):
            assert whole.doc_ids[position] == doc_id
            digest = int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8).digest(), "big")
            assert digest % 3 == i
        np.testing.assert_array_equal(index.embeddings, whole.embeddings[positions])
        assert index.manifest.shard["corpus_documents"] == SLICE and index.manifest.defaults == whole.manifest.defaults


def test_a_document_scores_the_same_bm25_in_its_shard_as_in_the_whole_index(whole_index, sharded_index, scifact):
    whole = open_index(whole_index)
    shards = [open_index(sharded_index / s["folder"]) for s in read_shards(sharded_index)["shards"]]
    for query in sample_queries(scifact, 10, 50):
        expected = whole.bm25.scores(query)
        for shard in shards:
            positions = np.load(shard.path / "positions.npy")
            np.testing.assert_allclose(shard.bm25.scores(query), expected[positions], rtol=1e-6, atol=1e-6)


def test_global_bm25_uses_the_corpus_statistics_given():
    analyzer = Analyzer(stopwords="none", stemmer="none")
    params = BM25Params(k1=1.2, b=0.75)
    tokens = [["apple", "pear", "apple"], ["pear"]]
    # the shard holds 2 documents of a 10-document corpus, average length 4; apple is in 5 documents, pear in 2
    bm25 = global_bm25(*Postings.from_tokens(tokens), analyzer, params, {"apple": 5, "pear": 2}, {"documents": 10, "avgdl": 4.0})
    idf_apple, idf_pear = np.log(1 + (10 - 5 + 0.5) / (5 + 0.5)), np.log(1 + (10 - 2 + 0.5) / (2 + 0.5))
    norm0, norm1 = 1.2 * (1 - 0.75 + 0.75 * 3 / 4), 1.2 * (1 - 0.75 + 0.75 * 1 / 4)
    np.testing.assert_allclose(
        bm25.scores("apple pear"), [idf_apple * 2 / (2 + norm0) + idf_pear * 1 / (1 + norm0), idf_pear * 1 / (1 + norm1)], rtol=1e-6
    )


def same_answers(whole, sharded, queries, specs=SPECS, k=20):
    """Every query of every spec: the same ids in the same order, scores within 1e-5 (the whole index matching terms
    a typo's variants chosen by the coordinator as the whole index chooses them: search.typo)."""
    pw, ps = whole.pipeline(), sharded.pipeline()
    compared = 0
    for spec in specs:
        for query in queries:
            a, b = pw.search(query, k, dict(spec)), ps.search(query, k, dict(spec))
            ids_a = [whole.doc_ids[i] for i in a.ranking.doc_idx]
            ids_b = [doc["id"] for doc in sharded.documents(b.ranking.doc_idx)]
            assert ids_a == ids_b, (spec, query)
            np.testing.assert_allclose(b.ranking.scores, a.ranking.scores, rtol=0, atol=1e-5, err_msg=str((spec, query)))
            assert a.has_more == b.has_more
            compared += 1
    return compared


def test_sharded_search_equals_the_whole_index_in_every_mode(whole_index, sharded_index, scifact):
    whole, sharded = open_index(whole_index), open_sharded(sharded_index)
    try:
        # typos too: each query with its longest word's middle letters swapped, the variants chosen as one index would
        queries = sample_queries(scifact, 12, 100)
        misspelt = [
            query.replace(word, word[:2] + word[3] + word[2] + word[4:], 1)
            for query in queries[:6]
            for word in [max(query.split(), key=len)]
        ]
        assert same_answers(whole, sharded, queries + misspelt) == 18 * len(SPECS)
        result = sharded.pipeline().search("brain development", 10, {"mode": "hybrid"})
        expected = whole.pipeline().search("brain development", 10, {"mode": "hybrid"})
        assert sharded.presenter().facets(result, ["tags", "year", "flag"]) == whole.presenter().facets(expected, ["tags", "year", "flag"])
        # a page further down is the same page
        a = whole.pipeline().search("brain development", 5, {"mode": "hybrid"}, offset=7)
        b = sharded.pipeline().search("brain development", 5, {"mode": "hybrid"}, offset=7)
        assert [whole.doc_ids[i] for i in a.ranking.doc_idx] == [d["id"] for d in sharded.documents(b.ranking.doc_idx)]
    finally:
        sharded.close()


def test_sharded_curation_pins_and_hides_like_the_whole_index(whole_index, sharded_index, scifact):
    whole, sharded = open_index(whole_index), open_sharded(sharded_index)
    pw, ps = whole.pipeline(), sharded.pipeline()
    filtered_out = next(i for i in range(whole.num_docs) if whole.docs.get(i)["metadata"]["year"] < 2005)
    for query in sample_queries(scifact, 3, 40):
        for spec in ({"mode": "hybrid"}, {"mode": "bm25", "filter": {"year": {"gte": 2005}}}, {"mode": "dense", "sort": ["year"]}):
            top = pw.search(query, 3, dict(spec)).ranking.doc_idx
            pins = (whole.doc_ids[150], whole.doc_ids[filtered_out], "no-such-id", whole.doc_ids[int(top[2])])
            curation = Curation(pins, (whole.doc_ids[int(top[0])], whole.doc_ids[150]))  # a hidden pin is no pin
            a, b = pw.search(query, 10, dict(spec), curation=curation), ps.search(query, 10, dict(spec), curation=curation)
            assert [whole.doc_ids[i] for i in a.ranking.doc_idx] == [doc["id"] for doc in sharded.documents(b.ranking.doc_idx)]
            np.testing.assert_allclose(b.ranking.scores, a.ranking.scores, rtol=0, atol=1e-5)
            assert len(a.pinned) == len(b.pinned) == (1 if "filter" in spec else 2)


def test_a_sharded_index_checks_specs_like_the_whole_one(sharded_index):
    sharded = open_sharded(sharded_index)
    try:
        pipeline = sharded.pipeline()
        with pytest.raises(SpecError, match="unknown field; filterable fields: flag, tags, year") as bad_field:
            pipeline.search("cells", 5, {"filter": {"nope": 1}})
        assert bad_field.value.field.startswith("filter")
        with pytest.raises(SpecError, match="rerank"):
            pipeline.search("cells", 5, {"rerank": {"enabled": True}})
    finally:
        sharded.close()


@pytest.mark.server
def test_the_service_serves_a_sharded_index_with_hubness_read_only(whole_index, sharded_index, scifact):
    whole = TestClient(create_app(Settings(index=whole_index)))
    sharded = TestClient(create_app(Settings(index=sharded_index, write_keys="writer")))
    with whole, sharded:
        for query in [*sample_queries(scifact, 3, 200), "vitamn D defciency and bone densty"]:
            body = {"query": query, "k": 8, "mode": "hybrid", "highlight": True, "facets": ["tags"], "fields": "*", "explain": True}
            a = whole.post("/search", json=body).json()
            b = sharded.post("/search", json=body, headers={"X-API-Key": "writer"}).json()
            assert b["spec"]["typo"] == "auto" and a["typos"] == b["typos"]
            assert [h["id"] for h in a["hits"]] == [h["id"] for h in b["hits"]]
            assert [h["highlight"] for h in a["hits"]] == [h["highlight"] for h in b["hits"]]
            assert [h["fields"] for h in a["hits"]] == [h["fields"] for h in b["hits"]]
            assert a["facets"] == b["facets"]
            np.testing.assert_allclose([h["score"] for h in b["hits"]], [h["score"] for h in a["hits"]], atol=1e-5)
        some_id = a["hits"][0]["id"]
        writer = {"X-API-Key": "writer"}
        assert sharded.get(f"/documents/{some_id}", headers=writer).json() == whole.get(f"/documents/{some_id}").json()
        assert sharded.get("/documents/no-such-id", headers=writer).status_code == 404
        refused = sharded.put("/documents", json={"documents": [{"id": "x", "text": "new"}]}, headers=writer)
        assert refused.status_code == 409 and "fitted hubness correction takes no writes" in refused.json()["detail"]
        assert sharded.get("/ready").json()["documents"] == SLICE
        bad = sharded.post("/search", json={"query": "cells", "filter": {"year": {"gte": "x"}}}, headers=writer)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:3] == ["body", "filter", "year"]


def test_split_refuses_what_it_cannot_split(whole_index, sharded_index, tmp_path, tiny_index):
    with pytest.raises(ConfigError, match="from 1 to"):
        split_index(whole_index, tmp_path / "out", 0)
    with pytest.raises(ConfigError, match="empty: use fewer shards"):
        split_index(tiny_index, tmp_path / "out", 8)  # 6 documents
    with pytest.raises(ConfigError, match="another folder"):
        split_index(whole_index, whole_index, 2)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(HybridError, match="not a sharded index"):
        split_index(whole_index, tmp_path / "taken", 2)
    with pytest.raises(ConfigError, match="is itself a shard"):
        split_index(sharded_index / "shard-000", tmp_path / "out", 2)
    robertson = tmp_path / "robertson"
    build_index(tiny_index.parent / "corpus.jsonl", robertson, BuildOptions(progress=False, bm25=BM25Params(method="robertson")))
    with pytest.raises(ConfigError, match="lucene"):
        split_index(robertson, tmp_path / "out", 2)
    assert not (tmp_path / "out").exists()


@pytest.mark.process
def test_shard_and_index_commands(tiny_index, tmp_path):
    def hybrid(*args):
        return subprocess.run(
            [sys.executable, "-m", "hybrid_retrieval.cli", *map(str, args)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        )

    done = hybrid("shard", tiny_index, "--shards", 2, "--out", tmp_path / "sharded")
    assert done.returncode == 0, done.stderr
    assert "split 6 documents" in done.stdout and (tmp_path / "sharded" / SHARDS_FILE).is_file()
    built = hybrid("index", tiny_index.parent / "corpus.jsonl", "--out", tmp_path / "built", "--shards", 2, "--quiet")
    assert built.returncode == 0, built.stderr
    assert "(2 shards)" in built.stdout
    for name in ("shard-000", "shard-001"):  # the same split as from the built index
        assert (tmp_path / "built" / name / "docs.jsonl").read_bytes() == (tmp_path / "sharded" / name / "docs.jsonl").read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # the whole index was a temporary
    searched = hybrid("search", tmp_path / "built", "cats", "--json")
    assert searched.returncode == 0, searched.stderr
    assert json.loads(searched.stdout)["hits"][0]["id"] in {"d1", "d6"}
    refused = hybrid("shard", tiny_index, "--shards", 0, "--out", tmp_path / "x")
    assert refused.returncode == 2 and "from 1 to" in refused.stderr


@pytest.mark.process
def test_bm25_files_do_not_depend_on_the_process(tmp_path):
    """bm25s numbers terms in set order, which string hashing salts per process: our build sorts them."""
    script = (
        "import sys; from hybrid_retrieval.search.bm25 import BM25Index, BM25Params; "
        "from hybrid_retrieval.search.analyzer import Analyzer; "
        "from pathlib import Path; a = Analyzer(); "
        "BM25Index.build([a.analyze(t) for t in ('cats chase dogs', 'dogs bark at the mailman', 'quantum qubits')], a, "
        "BM25Params()).save(Path(sys.argv[1]))"
    )
    for seed in ("1", "2"):
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / seed)],
            check=True,
            cwd=REPO,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
        )
    for path in sorted((tmp_path / "1").iterdir()):
        assert path.read_bytes() == (tmp_path / "2" / path.name).read_bytes(), path.name
    assert shard_of(["d1", "d2"], 7).tolist() == [
        int.from_bytes(hashlib.blake2b(i.encode(), digest_size=8).digest(), "big") % 7 for i in ("d1", "d2")
    ]


def test_the_query_model_of_a_sharded_index_is_verified(whole_index, tmp_path):
    split_index(whole_index, tmp_path / "sharded", 2)
    model = next((tmp_path / "sharded" / "model").glob("*.onnx"))
    damaged = model.read_bytes()[:-1]
    model.unlink()  # the split hard-links the whole index's model: replaced, as every writer here does
    model.write_bytes(damaged)
    with pytest.raises(HybridError, match="model"):
        open_sharded(tmp_path / "sharded", verify="size")
