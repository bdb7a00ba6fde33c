"""Reranking stage (with a transparent stand-in cross-encoder) and micro-batching."""

import json
import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hybrid_retrieval.app.main import create_app
from hybrid_retrieval.app.settings import Settings
from hybrid_retrieval.common.errors import ConfigError, SpecError
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.models.batching import BatchingCrossEncoder, BatchingEmbedder, MicroBatcher
from hybrid_retrieval.models.cross_encoder import CachingCrossEncoder
from hybrid_retrieval.search.rerank import interpolate
from tests.conftest import LengthScorer

NO_RERANK = {"rerank": {"enabled": False}}


@pytest.fixture(scope="module")
def index(scifact_slice_index):
    opened = open_index(scifact_slice_index, verify="size", device="cpu")
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def pipeline(index):
    return index.pipeline({"rerank": {"enabled": True, "depth": 20}}, cross_encoder=LengthScorer(), cross_encoder_name="length")


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_rerank_reorders_the_first_stage_top_by_the_cross_encoder(index, pipeline, mode):
    query = "vitamin D deficiency and bone density"
    first = pipeline.search(query, k=20, spec={"mode": mode, **NO_RERANK}).ranking
    result = pipeline.search(query, k=5, spec={"mode": mode})  # reranked by default, top 20
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


def test_rerank_depth_limits_what_the_cross_encoder_sees(index, pipeline):
    query = "smoking and lung cancer"
    first = pipeline.search(query, k=60, spec={"mode": "bm25", **NO_RERANK}).ranking
    result = pipeline.search(query, k=3, spec={"mode": "bm25", "rerank": {"depth": 3}})
    assert set(result.ranking.doc_idx.tolist()) == set(first.doc_idx[:3].tolist())
    # k above the depth: the reranked top 20, then the first stage's 21st.. in their order, scores below
    deep = pipeline.search(query, k=60, spec={"mode": "bm25"})
    assert deep.reranked.depth == 20 and deep.spec.rerank.depth == 20
    assert sorted(deep.ranking.doc_idx[:20].tolist()) == sorted(first.doc_idx[:20].tolist())
    assert deep.ranking.doc_idx[20:].tolist() == first.doc_idx[20:].tolist()
    assert (np.diff(deep.ranking.scores) <= 0).all()
    tail = deep.explain(30)["rerank"]
    assert tail["score"] is None and tail["first_stage_rank"] == 31
    assert tail["first_stage_score"] == pytest.approx(float(first.scores[30]))


def test_min_score_applies_to_the_reranker_score(pipeline):
    result = pipeline.search("protein folding", k=20, spec={"mode": "hybrid", "min_score": 12.0})
    assert len(result.ranking) and (result.ranking.scores >= 12.0).all()


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_huge_min_score_empties_the_ranking_without_overflow(pipeline):
    assert len(pipeline.search("protein folding", k=5, spec={"mode": "bm25", "min_score": 1e308, **NO_RERANK}).ranking) == 0


def test_bad_rerank_requests_name_the_field(index, pipeline):
    shallow = pipeline.search("cells", k=10, spec={"rerank": {"depth": 5}})
    assert shallow.reranked.depth == 5 and len(shallow.ranking) == 10
    with pytest.raises(SpecError, match="rerank.depth: must be between 1 and 200, got 500"):
        pipeline.search("cells", k=10, spec={"rerank": {"depth": 500}})
    with pytest.raises(SpecError, match="rerank.enabled: no reranker is configured"):
        index.pipeline().search("cells", spec={"rerank": {"enabled": True}})
    assert index.pipeline().search("cells").reranked is None  # no reranker: nothing to do by default
    with pytest.raises(SpecError, match="rerank.depth: must be between 1 and 200"):
        index.pipeline({"rerank": {"depth": 500}}, cross_encoder=LengthScorer())


@pytest.mark.server
def test_http_rerank_and_explain(scifact_slice_index):
    app = create_app(
        Settings(index=scifact_slice_index, device="cpu", rerank_depth=10, rerank_by_default=False), cross_encoder=LengthScorer()
    )
    with TestClient(app) as client:
        plain = client.post("/search", json={"query": "vitamin D", "k": 5}).json()
        assert plain["reranker"] is None and "rerank" not in plain["timings_ms"]
        assert plain["spec"]["rerank"] == {"enabled": False, "depth": 10, "weight": 1.0}
        body = client.post("/search", json={"query": "vitamin D", "k": 5, "rerank": {"enabled": True}, "explain": True}).json()
        assert body["reranker"] == "LengthScorer" and body["spec"]["rerank"] == {"enabled": True, "depth": 10, "weight": 1.0}
        scores = [h["score"] for h in body["hits"]]
        assert scores == sorted(scores, reverse=True)
        for hit in body["hits"]:
            assert hit["explain"]["final"] == hit["explain"]["rerank"]["score"] == hit["score"]
            assert hit["explain"]["fused"] is not None
        shallow = client.post(
            "/search", json={"query": "vitamin D", "k": 5, "rerank": {"enabled": True, "depth": 3}, "explain": True}
        ).json()
        assert shallow["spec"]["rerank"]["depth"] == 3
        assert [h["explain"]["rerank"]["score"] is None for h in shallow["hits"]] == [False] * 3 + [True] * 2
        bad = client.post("/search", json={"query": "vitamin D", "rerank": {"enabled": True, "depth": 201}})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "rerank", "depth"]
        blended = client.post(
            "/search", json={"query": "vitamin D", "k": 5, "rerank": {"enabled": True, "weight": 0.5}, "explain": True}
        ).json()
        assert blended["spec"]["rerank"]["weight"] == 0.5
        for hit in blended["hits"]:
            assert hit["explain"]["rerank"]["weight"] == 0.5 and hit["explain"]["final"] == hit["score"]
        for weight in (1.5, -0.1, "NaN"):
            bad = client.post("/search", json={"query": "vitamin D", "rerank": {"enabled": True, "weight": weight}})
            assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "rerank", "weight"], bad.text


def test_interpolate_blends_z_scores():
    logits, first = np.array([3.0, 1.0, 2.0]), np.array([0.9, 0.5, 0.1])
    np.testing.assert_array_equal(interpolate(logits, first, 1.0), logits)  # plain reranking keeps the logits
    # z(logits) = [1, -1, 0] * sqrt(3/2); z(first) = [1, 0, -1] * sqrt(3/2)
    z = np.sqrt(1.5)
    np.testing.assert_allclose(interpolate(logits, first, 0.5), [z, -z / 2, -z / 2], rtol=1e-6)
    np.testing.assert_allclose(interpolate(logits, first, 0.0), [z, 0, -z], rtol=1e-6)
    np.testing.assert_allclose(interpolate(logits, first, 0.25), [z, -0.25 * z, -0.75 * z], rtol=1e-6)
    with pytest.raises(SpecError, match="weight: must be between 0 and 1"):
        interpolate(logits, first, 1.2)


def test_rerank_weight_blends_the_first_stage_back_in(index, pipeline):
    query = "vitamin D deficiency and bone density"
    first = pipeline.search(query, k=20, spec={"mode": "hybrid", **NO_RERANK}).ranking
    lengths = np.array([len(index.doc_text(int(d))) / 100.0 for d in first.doc_idx])

    def z(x):
        return (x - x.mean()) / x.std()

    expected = 0.3 * z(lengths) + 0.7 * z(first.scores.astype(np.float64))  # brute force over the reranked top 20
    result = pipeline.search(query, k=20, spec={"mode": "hybrid", "rerank": {"weight": 0.3}})
    order = np.argsort(-expected, kind="stable")
    assert result.ranking.doc_idx.tolist() == first.doc_idx[order].tolist()
    np.testing.assert_allclose(result.ranking.scores, expected[order], rtol=1e-5, atol=1e-6)
    explained = result.explain(0)
    assert explained["rerank"] == {
        "score": pytest.approx(lengths[order[0]]),
        "weight": 0.3,
        "first_stage_rank": int(order[0]) + 1,
        "first_stage_score": pytest.approx(float(first.scores[order[0]])),
    }
    # weight 0: the first stage's order, whatever the cross-encoder says
    assert (
        pipeline.search(query, k=20, spec={"mode": "hybrid", "rerank": {"weight": 0.0}}).ranking.doc_idx.tolist() == first.doc_idx.tolist()
    )
    with pytest.raises(SpecError, match="rerank.weight: must be between 0 and 1"):
        pipeline.search(query, spec={"rerank": {"weight": 2.0}})


def test_tuned_weight_is_served_unless_overridden(tmp_path):
    from hybrid_retrieval.models.cross_encoder import rerank_weight, tuned_weight

    (tmp_path / "onnx").mkdir()
    assert tuned_weight(tmp_path) is None and rerank_weight(tmp_path) == 1.0  # not tuned: plain reranking
    (tmp_path / "training.json").write_text('{"interpolation": {"weight": 0.35}}')
    assert tuned_weight(tmp_path) == tuned_weight(tmp_path / "onnx") == 0.35
    assert rerank_weight(tmp_path) == 0.35 and rerank_weight(tmp_path, 0.8) == 0.8
    (tmp_path / "training.json").write_text('{"interpolation": {"weight": "high"}}')
    with pytest.raises(ConfigError, match="training.json of .*: interpolation weight must be a number between 0 and 1, got 'high'"):
        rerank_weight(tmp_path)


def test_dev_split_holds_out_whole_queries_and_always_leaves_one_to_train():
    from hybrid_retrieval.quality.splits import split_dev

    queries = {f"q{i}": "text" for i in range(10)}
    qrels = {**{f"q{i}": {"d": 1} for i in range(9)}, "q9": {"d": 0}, "unknown": {"d": 1}}  # q9: no relevant doc
    train, dev = split_dev(queries, qrels, 0.25, seed=1)
    assert len(dev) == 2 and len(train) == 7 and not set(train) & set(dev) and set(train) | set(dev) == {f"q{i}" for i in range(9)}
    assert split_dev(queries, qrels, 0.25, seed=1) == (train, dev)  # seeded
    assert len(split_dev(queries, qrels, 0.99, seed=1)[0]) == 1
    assert split_dev(queries, qrels, 0.0, seed=1) == (sorted(train + dev), [])
    assert split_dev({"q0": "t"}, {"q0": {"d": 1}}, 0.5, seed=1) == (["q0"], [])


def test_eval_refuses_a_reranker_on_the_split_it_was_trained_on(index, tmp_path):
    from hybrid_retrieval.evaluation.runner import parse_pipeline
    from hybrid_retrieval.evaluation.suite import EvalConfig, _Pipelines

    (tmp_path / "training.json").write_text('{"data": {"split": "test"}}')
    with pytest.raises(ConfigError, match="trained and tuned on the 'test' split"):
        _Pipelines(EvalConfig(split="test", reranker=str(tmp_path)), index).get(parse_pipeline("hybrid+rerank"))


def test_interpolation_tuning_scores_every_weight_on_the_dev_queries(index, scifact):
    from hybrid_retrieval.indexer.corpus import split_queries
    from hybrid_retrieval.quality.metrics import evaluate
    from hybrid_retrieval.training.reranker import WEIGHT_GRID, tune_interpolation

    queries, qrels = split_queries(scifact, "train")
    ids, in_slice = index.doc_ids, set(index.doc_ids)
    dev = sorted(q for q, rels in qrels.items() if set(rels) & in_slice)[:8]
    dev_queries, dev_qrels = {q: queries[q] for q in dev}, {q: qrels[q] for q in dev}
    tuned = tune_interpolation(index, LengthScorer(), dev_queries, dev_qrels, depth=20)

    plain = index.pipeline()
    first_stage = {
        q: {ids[int(i)]: float(s) for i, s in zip(r.doc_idx, r.scores)} for q in dev for r in [plain.search(dev_queries[q], k=20).ranking]
    }
    by_length = {q: {d: len(index.doc_text(ids.index(d))) / 100.0 for d in docs} for q, docs in first_stage.items()}
    ndcg = tuned["dev"]["ndcg@10"]
    assert ndcg["first_stage"] == pytest.approx(evaluate(first_stage, dev_qrels, ("ndcg@10",))["ndcg@10"])
    assert ndcg["reranker_only"] == pytest.approx(evaluate(by_length, dev_qrels, ("ndcg@10",))["ndcg@10"])
    grid = {float(w): v for w, v in tuned["dev"]["grid"].items()}
    assert set(grid) == set(WEIGHT_GRID) and tuned["weight"] in WEIGHT_GRID
    assert ndcg["interpolated"] == pytest.approx(max(grid.values()), abs=1e-4) == pytest.approx(grid[tuned["weight"]], abs=1e-4)
    assert tuned["weight"] == min(w for w, v in grid.items() if v == grid[tuned["weight"]])  # ties: the smaller weight
    # whether reranking gains is judged out of sample: at most the in-sample best, compared with the first stage
    assert ndcg["chosen_out_of_sample"] <= ndcg["interpolated"] + 1e-12
    assert tuned["gain"] == (ndcg["chosen_out_of_sample"] > ndcg["first_stage"])


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


def test_evaluation_reranks_the_head_and_keeps_the_tail(index):
    from hybrid_retrieval.evaluation.runner import run_queries

    class Counting(LengthScorer):
        pairs = 0

        def score(self, query, texts, batch_size=32):
            Counting.pairs += len(texts)
            return super().score(query, texts)

    pipeline = index.pipeline({"rerank": {"depth": 10}}, cross_encoder=CachingCrossEncoder(Counting()))
    queries = {"q1": "vitamin D deficiency", "q2": "smoking"}
    spec = {"mode": "bm25", "rerank": {"enabled": True}}
    run, rankings = run_queries(pipeline, index.doc_ids, queries, spec, k=30)
    for qid, ranking in zip(queries, rankings):
        first = pipeline.search(queries[qid], k=30, spec={"mode": "bm25"}).ranking
        assert sorted(ranking.doc_idx[:10].tolist()) == sorted(first.doc_idx[:10].tolist())
        assert ranking.doc_idx[10:].tolist() == first.doc_idx[10:].tolist()
        assert (np.diff(ranking.scores) <= 0).all() and len(run[qid]) == len(first)
    assert Counting.pairs == 10 + min(10, len(rankings[1]))
    run_queries(pipeline, index.doc_ids, queries, spec, k=30)
    assert Counting.pairs == 10 + min(10, len(rankings[1]))  # every pair came from the cache


@pytest.mark.server
def test_service_batches_only_when_asked_on_cpu(scifact_slice_index):
    for setting, batched in (("auto", False), ("on", True), ("off", False)):
        app = create_app(
            Settings(index=scifact_slice_index, device="cpu", batch_queries=setting, rerank_depth=10), cross_encoder=LengthScorer()
        )
        with TestClient(app) as client:
            queries = app.state.collections.default().serving.pipeline.embedder
            assert isinstance(queries.embedder, BatchingEmbedder) == batched  # inside the query cache
            body = client.post("/search", json={"query": "vitamin D", "k": 3}).json()
            assert body["spec"]["rerank"] == {"enabled": True, "depth": 10, "weight": 1.0} and len(body["hits"]) == 3


def test_a_reranker_without_a_held_out_gain_is_off_by_default():
    assert Settings().spec_overrides(reranking=True, tuned_weight=0.2, gained=False)["rerank"] == {
        "enabled": False,
        "depth": 50,
        "weight": 0.2,
    }
    assert Settings().spec_overrides(reranking=True, tuned_weight=0.4, gained=True)["rerank"]["enabled"] is True
    assert Settings().spec_overrides(reranking=True)["rerank"]["enabled"] is True  # not ours: no record, the setting decides
    assert Settings(rerank_weight=0.3).spec_overrides(reranking=True, tuned_weight=0.0, gained=False)["rerank"] == {
        "enabled": True,
        "depth": 50,
        "weight": 0.3,
    }
    assert Settings(rerank_by_default=False).spec_overrides(reranking=True, tuned_weight=0.4, gained=True)["rerank"]["enabled"] is False


def test_weight_evidence_reads_the_training_record(tmp_path):
    from hybrid_retrieval.models.cross_encoder import weight_evidence

    assert weight_evidence(tmp_path) is None
    (tmp_path / "training.json").write_text(
        json.dumps(
            {
                "data": {"split": "train"},
                "interpolation": {
                    "weight": 0.5,
                    "gain": True,
                    "dev": {
                        "queries": 162,
                        "ndcg@10": {"first_stage": 0.75, "reranker_only": 0.67, "interpolated": 0.78, "chosen_out_of_sample": 0.77},
                    },
                },
            }
        )
    )
    assert weight_evidence(tmp_path) == {
        "metric": "ndcg@10",
        "queries": 162,
        "split": "held out of train",
        "decision": "rerank by default at weight 0.5",
        "values": {
            "first stage": 0.75,
            "cross-encoder alone": 0.67,
            "blend w=0.5, in-sample": 0.78,
            "blend, weight chosen out of sample": 0.77,
        },
    }
    (tmp_path / "training.json").write_text(
        json.dumps(
            {
                "data": {"split": "train"},
                "interpolation": {
                    "weight": 0.3,
                    "dev": {"queries": 9, "ndcg@10": {"first_stage": 0.75, "reranker_only": 0.6, "interpolated": 0.76}},
                },
            }
        )
    )  # an older record
    assert weight_evidence(tmp_path)["decision"] == "rerank by default at weight 0.3"


def test_distillation_loss_is_the_kl_divergence_from_the_teachers_group_softmax():
    import torch

    from hybrid_retrieval.training.reranker import distillation_loss

    student = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]])
    teacher = torch.tensor([[1.0, 1.0, -2.0], [3.0, 0.0, 0.0]])

    def softmax(x):
        e = np.exp(x - x.max())
        return e / e.sum()

    expected = np.mean([sum(t * np.log(t / s)) for t, s in zip(map(softmax, teacher.numpy()), map(softmax, student.numpy()))])
    assert float(distillation_loss(student, teacher)) == pytest.approx(expected, rel=1e-5)
    assert float(distillation_loss(teacher, teacher)) == pytest.approx(0.0, abs=1e-7)


def test_teacher_scores_follow_each_groups_order_positive_first():
    from hybrid_retrieval.training.reranker import Group, teacher_scores
    from tests.conftest import LengthScorer

    texts = {0: "a", 1: "bbb", 2: "cc"}
    scores = teacher_scores(LengthScorer(), [Group("q", 1, (0, 2)), Group("q", 0, (2, 1))], {"q": "query"}, texts.get, 3)
    assert np.allclose(scores.numpy(), [[0.03, 0.01, 0.02], [0.01, 0.02, 0.03]])
