"""Reranking stage (with a transparent stand-in cross-encoder) and micro-batching."""

import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from indexer.store import open_index
from models.batching import BatchingCrossEncoder, BatchingEmbedder, MicroBatcher
from search.pipeline import SearchError
from search.rerank import Reranker, RerankOptions, interpolate
from tests.conftest import LengthScorer


@pytest.fixture(scope="module")
def index(scifact_slice_index):
    opened = open_index(scifact_slice_index, verify="size", device="cpu")
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def pipeline(index):
    return index.pipeline(rerank=RerankOptions(LengthScorer(), depth=20, name="length"))


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_rerank_reorders_the_first_stage_top_by_the_cross_encoder(index, pipeline, mode):
    query = "vitamin D deficiency and bone density"
    first = pipeline.search(query, k=20, mode=mode, rerank=False).ranking
    result = pipeline.search(query, k=5, mode=mode)  # reranked by default, top 20
    lengths = {int(d): len(index.doc_text(int(d))) / 100.0 for d in first.doc_idx}
    expected = sorted(first.doc_idx.tolist(), key=lambda d: -lengths[d])[:5]
    assert result.ranking.doc_idx.tolist() == expected
    np.testing.assert_allclose(result.ranking.scores, [lengths[d] for d in expected], rtol=1e-6)
    for position, doc in enumerate(expected):
        explained = result.explain(position)
        stage = first.doc_idx.tolist().index(doc)
        assert explained["final"] == explained["rerank"]["score"] == pytest.approx(lengths[doc])
        assert explained["rerank"]["first_stage_rank"] == stage + 1
        assert explained["rerank"]["first_stage_score"] == pytest.approx(float(first.scores[stage]))
        assert ("fused" in explained) == (mode == "hybrid")
    assert "rerank" in result.timings_ms


def test_rerank_depth_limits_what_the_cross_encoder_sees(pipeline):
    query = "smoking and lung cancer"
    first = pipeline.search(query, k=3, mode="bm25", rerank=False).ranking
    result = pipeline.search(query, k=3, mode="bm25", rerank_depth=3)
    assert set(result.ranking.doc_idx.tolist()) == set(first.doc_idx.tolist())
    assert pipeline.search(query, k=60, mode="bm25").reranked.ranking.doc_idx.size == 60  # depth grows to k


def test_min_score_applies_to_the_reranker_score(pipeline):
    result = pipeline.search("protein folding", k=20, mode="hybrid", min_score=12.0)
    assert len(result.ranking) and (result.ranking.scores >= 12.0).all()


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_huge_min_score_empties_the_ranking_without_overflow(pipeline):
    assert len(pipeline.search("protein folding", k=5, mode="bm25", min_score=1e308, rerank=False).ranking) == 0


def test_bad_rerank_requests_name_the_field(index, pipeline):
    assert len(pipeline.search("cells", k=10, rerank_depth=5).reranked.ranking) == 10  # raised to k
    with pytest.raises(SearchError, match="rerank_depth: must be between 1 and 200"):
        pipeline.search("cells", k=10, rerank_depth=500)
    with pytest.raises(SearchError, match="rerank: no reranker is configured"):
        index.pipeline().search("cells", rerank=True)
    assert index.pipeline().search("cells").reranked is None  # no reranker: nothing to do by default
    with pytest.raises(ValueError, match="between 1 and 200"):
        RerankOptions(LengthScorer(), depth=500)


def test_http_rerank_and_explain(scifact_slice_index):
    app = create_app(Settings(index=scifact_slice_index, device="cpu"),
                     rerank=RerankOptions(LengthScorer(), depth=10, by_default=False, name="length"))
    with TestClient(app) as client:
        plain = client.post("/search", json={"query": "vitamin D", "k": 5}).json()
        assert plain["rerank"] is None and "rerank" not in plain["timings_ms"]
        body = client.post("/search", json={"query": "vitamin D", "k": 5, "rerank": True, "explain": True}).json()
        assert body["rerank"] == {"model": "length", "depth": 10, "weight": 1.0}
        scores = [h["score"] for h in body["hits"]]
        assert scores == sorted(scores, reverse=True)
        for hit in body["hits"]:
            assert hit["explain"]["final"] == hit["explain"]["rerank"]["score"] == hit["score"]
            assert hit["explain"]["fused"] is not None
        raised = client.post("/search", json={"query": "vitamin D", "k": 5, "rerank": True, "rerank_depth": 3}).json()
        assert raised["rerank"]["depth"] == 5
        bad = client.post("/search", json={"query": "vitamin D", "rerank": True, "rerank_depth": 201})
        assert bad.status_code == 422 and "rerank_depth" in bad.text
        blended = client.post("/search", json={"query": "vitamin D", "k": 5, "rerank": True, "rerank_weight": 0.5, "explain": True}).json()
        assert blended["rerank"]["weight"] == 0.5
        for hit in blended["hits"]:
            assert hit["explain"]["rerank"]["weight"] == 0.5 and hit["explain"]["final"] == hit["score"]
        for weight in (1.5, -0.1, "NaN"):
            bad = client.post("/search", json={"query": "vitamin D", "rerank": True, "rerank_weight": weight})
            assert bad.status_code == 422 and "rerank_weight" in bad.text


def test_interpolate_blends_z_scores():
    logits, first = np.array([3.0, 1.0, 2.0]), np.array([0.9, 0.5, 0.1])
    np.testing.assert_array_equal(interpolate(logits, first, 1.0), logits)  # plain reranking keeps the logits
    # z(logits) = [1, -1, 0] * sqrt(3/2); z(first) = [1, 0, -1] * sqrt(3/2)
    z = np.sqrt(1.5)
    np.testing.assert_allclose(interpolate(logits, first, 0.5), [z, -z / 2, -z / 2], rtol=1e-6)
    np.testing.assert_allclose(interpolate(logits, first, 0.0), [z, 0, -z], rtol=1e-6)
    np.testing.assert_allclose(interpolate(logits, first, 0.25), [z, -0.25 * z, -0.75 * z], rtol=1e-6)
    with pytest.raises(ValueError, match="between 0 and 1"):
        interpolate(logits, first, 1.2)


def test_rerank_weight_blends_the_first_stage_back_in(index, pipeline):
    query = "vitamin D deficiency and bone density"
    first = pipeline.search(query, k=20, mode="hybrid", rerank=False).ranking
    lengths = np.array([len(index.doc_text(int(d))) / 100.0 for d in first.doc_idx])

    def z(x):
        return (x - x.mean()) / x.std()

    expected = 0.3 * z(lengths) + 0.7 * z(first.scores.astype(np.float64))  # brute force over the reranked top 20
    result = pipeline.search(query, k=20, mode="hybrid", rerank_weight=0.3)
    order = np.argsort(-expected, kind="stable")
    assert result.ranking.doc_idx.tolist() == first.doc_idx[order].tolist()
    np.testing.assert_allclose(result.ranking.scores, expected[order], rtol=1e-5, atol=1e-6)
    explained = result.explain(0)
    assert explained["rerank"] == {"score": pytest.approx(lengths[order[0]]), "weight": 0.3, "first_stage_rank": int(order[0]) + 1,
                                   "first_stage_score": pytest.approx(float(first.scores[order[0]]))}
    # weight 0: the first stage's order, whatever the cross-encoder says
    assert pipeline.search(query, k=20, mode="hybrid", rerank_weight=0.0).ranking.doc_idx.tolist() == first.doc_idx.tolist()
    with pytest.raises(SearchError, match="rerank_weight: must be between 0 and 1"):
        pipeline.search(query, rerank_weight=2.0)


def test_tuned_weight_is_served_unless_overridden(tmp_path):
    from models.cross_encoder import rerank_weight, tuned_weight

    (tmp_path / "onnx").mkdir()
    assert tuned_weight(tmp_path) is None and rerank_weight(tmp_path) == 1.0  # not tuned: plain reranking
    (tmp_path / "training.json").write_text('{"interpolation": {"weight": 0.35}}')
    assert tuned_weight(tmp_path) == tuned_weight(tmp_path / "onnx") == 0.35
    assert rerank_weight(tmp_path) == 0.35 and rerank_weight(tmp_path, 0.8) == 0.8
    (tmp_path / "training.json").write_text('{"interpolation": {"weight": "high"}}')
    with pytest.raises(ValueError, match="training.json of .*: interpolation weight must be a number between 0 and 1, got 'high'"):
        rerank_weight(tmp_path)


def test_dev_split_holds_out_whole_queries_and_always_leaves_one_to_train():
    from models.reranker_training import split_dev

    queries = {f"q{i}": "text" for i in range(10)}
    qrels = {**{f"q{i}": {"d": 1} for i in range(9)}, "q9": {"d": 0}, "unknown": {"d": 1}}  # q9: no relevant doc
    train, dev = split_dev(queries, qrels, 0.25, seed=1)
    assert len(dev) == 2 and len(train) == 7 and not set(train) & set(dev) and set(train) | set(dev) == {f"q{i}" for i in range(9)}
    assert split_dev(queries, qrels, 0.25, seed=1) == (train, dev)  # seeded
    assert len(split_dev(queries, qrels, 0.99, seed=1)[0]) == 1
    assert split_dev(queries, qrels, 0.0, seed=1) == (sorted(train + dev), [])
    assert split_dev({"q0": "t"}, {"q0": {"d": 1}}, 0.5, seed=1) == (["q0"], [])


def test_eval_refuses_a_reranker_on_the_split_it_was_trained_on(tmp_path):
    from evaluation.runner import RerankChoice
    from evaluation.suite import EvalConfig, _Rerankers

    (tmp_path / "training.json").write_text('{"data": {"split": "test"}}')
    with pytest.raises(ValueError, match="trained and tuned on the 'test' split"):
        _Rerankers(EvalConfig(split="test", reranker=str(tmp_path)), index=None).get(RerankChoice())


def test_interpolation_tuning_scores_every_weight_on_the_dev_queries(index, scifact):
    from training.metrics import evaluate
    from evaluation.runner import doc_ids
    from indexer.corpus import split_queries
    from models.reranker_training import WEIGHT_GRID, tune_interpolation

    queries, qrels = split_queries(scifact, "train")
    ids, in_slice = doc_ids(index), set(doc_ids(index))
    dev = sorted(q for q, rels in qrels.items() if set(rels) & in_slice)[:8]
    dev_queries, dev_qrels = {q: queries[q] for q in dev}, {q: qrels[q] for q in dev}
    tuned = tune_interpolation(index, LengthScorer(), dev_queries, dev_qrels, depth=20)

    plain = index.pipeline()
    first_stage = {q: {ids[int(i)]: float(s) for i, s in zip(r.doc_idx, r.scores)}
                   for q in dev for r in [plain.search(dev_queries[q], k=20, rerank=False).ranking]}
    by_length = {q: {d: len(index.doc_text(ids.index(d))) / 100.0 for d in docs} for q, docs in first_stage.items()}
    ndcg = tuned["dev"]["ndcg@10"]
    assert ndcg["first_stage"] == pytest.approx(evaluate(first_stage, dev_qrels, ("ndcg@10",))["ndcg@10"])
    assert ndcg["reranker_only"] == pytest.approx(evaluate(by_length, dev_qrels, ("ndcg@10",))["ndcg@10"])
    grid = {float(w): v for w, v in tuned["dev"]["grid"].items()}
    assert set(grid) == set(WEIGHT_GRID) and tuned["weight"] in WEIGHT_GRID
    assert ndcg["interpolated"] == pytest.approx(max(grid.values()), abs=1e-4) == pytest.approx(grid[tuned["weight"]], abs=1e-4)
    assert tuned["weight"] == min(w for w, v in grid.items() if v == grid[tuned["weight"]])  # ties: the smaller weight


def test_micro_batcher_returns_each_caller_its_own_rows_and_coalesces():
    calls = []

    def run(items):
        calls.append(len(items))
        time.sleep(0.02)  # a model run: callers arriving meanwhile queue for the next batch
        return np.array([[x, 2 * x] for x in items], dtype=np.float32)

    batcher = MicroBatcher(run)
    results = {}

    def caller(i):
        results[i] = batcher([i, i + 1000])

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(16):
        np.testing.assert_array_equal(results[i], [[i, 2 * i], [i + 1000, 2 * (i + 1000)]])
    assert sum(calls) == 32 and len(calls) < 16 and batcher.batches == len(calls)


def test_micro_batcher_gives_every_caller_the_error():
    def run(items):
        time.sleep(0.01)
        raise RuntimeError("model failed")

    batcher = MicroBatcher(run)
    errors = []

    def caller():
        try:
            batcher(["x"])
        except RuntimeError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=caller) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == ["model failed"] * 6


def test_batching_wrappers_match_the_models(index):
    texts = ["vitamin D", "lung cancer and smoking", "protein"]
    np.testing.assert_allclose(BatchingEmbedder(index.embedder).encode(texts), index.embedder.encode(texts), atol=1e-5)
    scorer = BatchingCrossEncoder(LengthScorer())
    np.testing.assert_array_equal(scorer.score("q", texts), LengthScorer().score("q", texts))


def test_evaluation_reranks_the_head_and_keeps_the_tail(index, pipeline):
    from evaluation.runner import CachedScorer, doc_ids, run_queries

    class Counting(LengthScorer):
        pairs = 0

        def score(self, query, texts, batch_size=32):
            Counting.pairs += len(texts)
            return super().score(query, texts)

    scorer = CachedScorer(Counting())
    reranker = Reranker(RerankOptions(scorer, depth=10), index.doc_text)
    queries = {"q1": "vitamin D deficiency", "q2": "smoking"}
    ids = doc_ids(index)
    run, rankings = run_queries(pipeline, ids, queries, "bm25", k=30, reranker=reranker)
    for qid, ranking in zip(queries, rankings):
        first = pipeline.search(queries[qid], k=30, mode="bm25", rerank=False).ranking
        assert sorted(ranking.doc_idx[:10].tolist()) == sorted(first.doc_idx[:10].tolist())
        assert ranking.doc_idx[10:].tolist() == first.doc_idx[10:].tolist()
        assert (np.diff(ranking.scores) <= 0).all() and len(run[qid]) == len(first)
    assert Counting.pairs == 10 + min(10, len(rankings[1]))
    run_queries(pipeline, ids, queries, "bm25", k=30, reranker=reranker)
    assert Counting.pairs == 10 + min(10, len(rankings[1]))  # every pair came from the cache


def test_service_batches_only_when_asked_on_cpu(scifact_slice_index):
    for setting, batched in (("auto", False), ("on", True), ("off", False)):
        app = create_app(Settings(index=scifact_slice_index, device="cpu", batch_queries=setting),
                         rerank=RerankOptions(LengthScorer(), depth=10, name="length"))
        with TestClient(app) as client:
            assert isinstance(app.state.serving.pipeline.embedder, BatchingEmbedder) == batched
            body = client.post("/search", json={"query": "vitamin D", "k": 3}).json()
            assert body["rerank"]["depth"] == 10 and len(body["hits"]) == 3
