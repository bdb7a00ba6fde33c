"""`hybrid optimize` on a tiny synthetic corpus: the split, each step's keep rule, the budget, resume, the one-swap
publish (and its refusal), the report, and the index's own reranker served by a real server process."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from tests.conftest import write_jsonl
from tests.test_embedder_training import synthetic_corpus

pytestmark = pytest.mark.training  # the optimizer trains a reranker


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """180 synthetic documents, one judged query each (queries.jsonl, qrels/train.tsv), and their index, set to rank by
    its BM25 leg alone: on these queries a tuned fusion beats that by far."""
    from dataclasses import replace

    from hybrid_retrieval.indexer.build import BuildOptions, build_index
    from hybrid_retrieval.indexer.manifest import update_manifest
    from hybrid_retrieval.search.fusion import ConvexCombination

    root = tmp_path_factory.mktemp("optimize")
    corpus, queries, qrels = synthetic_corpus(docs_per_topic=30)
    write_jsonl(root / "corpus.jsonl", corpus)
    write_jsonl(root / "queries.jsonl", [{"_id": q, "text": t} for q, t in queries.items()])
    (root / "qrels").mkdir()
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{r}" for q, rels in qrels.items() for d, r in rels.items()]
    for split in ("train", "test"):
        (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    build_index(root / "corpus.jsonl", root / "index", BuildOptions(progress=False))

    def bm25_only(manifest):
        manifest.defaults = replace(manifest.defaults, fusion=ConvexCombination(alpha=0.0))

    update_manifest(root / "index", bm25_only)
    return root


def fresh_copy(judged, tmp_path):
    target = tmp_path / "index"
    shutil.copytree(judged / "index", target)
    return target


def run(index, judged, **options):
    from hybrid_retrieval.training.optimize import OptimizeOptions, Optimizer

    optimizer = Optimizer(index, judged / "queries.jsonl", judged / "qrels" / "train.tsv", OptimizeOptions(**options), progress=False)
    return optimizer.run()


def test_the_held_out_share_follows_the_number_of_judged_queries():
    from hybrid_retrieval.training.optimize import OptimizeError, held_out_size

    assert held_out_size(809) == 162  # a fifth
    assert held_out_size(100) == 50  # at least 50
    assert held_out_size(60) == 30  # or half of a small set
    assert held_out_size(5000) == 300  # at most 300
    assert held_out_size(3) == 1
    assert held_out_size(10, fraction=0.5) == 5
    assert held_out_size(10, fraction=0.99) == 9  # one is always left to fit on
    with pytest.raises(OptimizeError, match="at least 2"):
        held_out_size(1)


def test_options_and_test_qrels_are_refused(judged, tmp_path):
    from hybrid_retrieval.common.errors import ConfigError
    from hybrid_retrieval.training.optimize import OptimizeOptions, Optimizer

    with pytest.raises(ConfigError, match="valid: fusion, hubness, encoder, reranker"):
        OptimizeOptions(steps=("fusion", "chunking"))
    with pytest.raises(ConfigError, match="--budget"):
        OptimizeOptions(budget_minutes=0)
    with pytest.raises(ConfigError, match="test queries must never"):
        Optimizer(judged / "index", judged / "queries.jsonl", judged / "qrels" / "test.tsv", OptimizeOptions())


def test_fusion_and_hubness_are_judged_on_held_out_queries_and_published_in_one_swap(judged, tmp_path):
    from hybrid_retrieval.indexer.manifest import read_manifest
    from hybrid_retrieval.indexer.store import open_index
    from hybrid_retrieval.quality.metrics import per_query_scores

    index = fresh_copy(judged, tmp_path)
    report = run(index, judged, steps=("fusion", "hubness"))
    split = json.loads((index / "optimize" / "report.json").read_text())["split"]
    assert (split["fit_queries"], split["held_out_queries"]) == (130, 50)

    steps = {s["name"]: s for s in report["steps"]}
    for step in steps.values():  # the rule, as recorded: kept exactly when it won at p < 0.05
        if step["after"] is not None:
            assert (step["decision"] == "kept") == (step["after"] > step["before"] and step["p_value"] < 0.05)
    # on these queries BM25 alone loses to a tuned fusion by far: the step is kept and served
    assert steps["fusion"]["decision"] == "kept", steps["fusion"]
    manifest = read_manifest(index)
    assert manifest.defaults.fusion.method == "cc"
    assert manifest.fusion_tuning.qrels.endswith("fit.tsv") and manifest.fusion_tuning.queries == 130
    assert manifest.evidence["optimize"]["held_out"]["final"] == report["held_out"]["final"]
    assert report["published"] == f"published to {index.resolve()}"
    assert sorted(p.name for p in (index / "optimize").iterdir()) == ["report.json", "report.md", "report.png"]
    assert "| fusion | kept |" in (index / "optimize" / "report.md").read_text()

    # the reported held-out score is what the published index serves on those queries
    queries = {json.loads(line)["_id"]: json.loads(line)["text"] for line in (judged / "queries.jsonl").read_text().splitlines()}
    held_out = report["split"]["held_out_ids"]
    opened = open_index(index, verify="size")
    pipeline = opened.pipeline()
    run_ = {}
    for q in held_out:
        ranking = pipeline.search(queries[q], k=100).ranking
        run_[q] = {opened.doc_ids[int(i)]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores)}
    opened.close()
    scores = per_query_scores(run_, {q: {q.removeprefix("q-"): 1} for q in held_out}, ("ndcg@10",))["ndcg@10"]
    assert sum(scores.values()) / len(scores) == pytest.approx(report["held_out"]["final"], abs=1e-4)


def test_a_run_that_keeps_nothing_changes_nothing(judged, tmp_path):
    index = fresh_copy(judged, tmp_path)
    run(index, judged, steps=("fusion",))  # tuned and published
    before = {p.name: p.read_bytes() for p in index.iterdir() if p.is_file()}
    report = run(index, judged, steps=("fusion",))  # tuning again on the same fit part cannot win again
    assert report["steps"][0]["decision"] == "not kept"
    assert report["published"].startswith("nothing changed")
    assert {p.name: p.read_bytes() for p in index.iterdir() if p.is_file()} == before


def test_an_interrupted_run_resumes_after_its_last_finished_step(judged, tmp_path):
    from hybrid_retrieval.training.optimize import OptimizeOptions, Optimizer

    index = fresh_copy(judged, tmp_path)
    options = OptimizeOptions(steps=("fusion", "hubness"))

    def interrupt(step):
        if step.name == "fusion":
            raise KeyboardInterrupt

    first = Optimizer(index, judged / "queries.jsonl", judged / "qrels" / "train.tsv", options, progress=False)
    with pytest.raises(KeyboardInterrupt):
        first.run(on_step=interrupt)
    state = json.loads((index / "optimize" / "state.json").read_text())
    assert [s["name"] for s in state["steps"]] == ["fusion"]
    assert not (index / "optimize" / "report.json").exists()  # nothing published yet

    seen = []
    second = Optimizer(index, judged / "queries.jsonl", judged / "qrels" / "train.tsv", options, progress=False)
    report = second.run(on_step=lambda step: seen.append(step.name))
    assert seen == ["hubness"]  # the fusion was not redone
    assert report["steps"][0] == state["steps"][0]
    uninterrupted = run(fresh_copy(judged, tmp_path / "other"), judged, steps=("fusion", "hubness"))
    assert report["held_out"] == uninterrupted["held_out"]


def test_writes_during_the_run_refuse_the_publish(judged, tmp_path):
    from hybrid_retrieval.indexer.live.log import LIVE_DIR, WAL_FILE
    from hybrid_retrieval.training.optimize import OptimizeError, OptimizeOptions, Optimizer

    index = fresh_copy(judged, tmp_path)
    manifest = (index / "manifest.json").read_bytes()

    def write(step):  # a document arrives in the log while the run goes on
        (index / LIVE_DIR).mkdir(exist_ok=True)
        with (index / LIVE_DIR / WAL_FILE).open("ab") as log:
            log.write(b"x")

    optimizer = Optimizer(
        index, judged / "queries.jsonl", judged / "qrels" / "train.tsv", OptimizeOptions(steps=("fusion",)), progress=False
    )
    with pytest.raises(OptimizeError, match="changed while optimizing"):
        optimizer.run(on_step=write)
    assert (index / "manifest.json").read_bytes() == manifest


def test_a_budget_too_small_for_an_epoch_skips_training_and_says_why(judged, tmp_path):
    index = fresh_copy(judged, tmp_path)
    report = run(index, judged, steps=("encoder", "reranker"), budget_minutes=0.05)
    for step in report["steps"]:
        assert step["decision"] == "skipped"
        assert "does not fit the budget" in step["why"]
        assert step["plan"]["epochs"] == 0
    assert report["published"].startswith("nothing changed")


def test_too_few_judged_queries_skip_training(judged, tmp_path):
    index = fresh_copy(judged, tmp_path)
    report = run(index, judged, steps=("encoder",), held_out_fraction=0.5)  # 90 left to fit on
    assert report["steps"][0]["decision"] == "skipped"
    assert "90 judged queries to fit on, fewer than 100" in report["steps"][0]["why"]


def test_fifty_judged_queries_scale_the_recipe_down_and_say_the_evidence_is_thin(judged, tmp_path):
    from hybrid_retrieval.training.optimize import OptimizeOptions, Optimizer

    lines = (judged / "qrels" / "train.tsv").read_text().splitlines()
    few = tmp_path / "few.tsv"
    few.write_text("\n".join(lines[:1] + lines[1:151:3]) + "\n")  # 50 judged queries, across the topics
    index = fresh_copy(judged, tmp_path)
    report = Optimizer(index, judged / "queries.jsonl", few, OptimizeOptions(steps=("fusion", "encoder", "reranker")), progress=False).run()
    assert (report["split"]["judged_queries"], report["split"]["held_out_queries"], report["split"]["fit_queries"]) == (50, 25, 25)
    assert [s["decision"] for s in report["steps"][1:]] == ["skipped", "skipped"]
    assert "25 held-out queries" in report["evidence_note"] and "too thin" in report["evidence_note"]
    assert "too thin" in (index / "optimize" / "report.md").read_text()


@pytest.mark.slow
def test_every_step_on_the_synthetic_corpus_then_the_service_reranks_with_the_index_reranker(judged, tmp_path):
    """The whole recipe (encoder and reranker trained), the published index served by a real process: it embeds queries
    with the fine-tuned encoder and, when the reranker was kept, reranks with it by default."""
    from hybrid_retrieval.evaluation.server import running_server
    from hybrid_retrieval.indexer.manifest import read_manifest
    from hybrid_retrieval.indexer.store import RERANKER_DIR

    index = fresh_copy(judged, tmp_path)
    report = run(index, judged, budget_minutes=20)
    steps = {s["name"]: s for s in report["steps"]}
    assert set(steps) == {"fusion", "hubness", "encoder", "reranker"}
    assert steps["encoder"]["decision"] == "kept", steps["encoder"]  # topic words the base model never saw together
    manifest = read_manifest(index)
    model = index.resolve() / "optimize" / "models" / "encoder"
    assert manifest.embedder.model == str(model) and (model / "training.json").is_file()
    assert (steps["reranker"]["decision"] == "kept") == (index / RERANKER_DIR).is_dir()

    with running_server(index) as (url, _):
        client = httpx.Client(base_url=url, timeout=30)
        hit = client.post("/search", json={"query": "lava and magma volcano", "k": 3}).json()
        assert hit["hits"][0]["id"].startswith("volcano")
        assert (hit.get("reranker") is not None) == (steps["reranker"]["decision"] == "kept")
        info = client.get("/collections/index").json()
        assert info["evidence"]["optimize"]["held_out"]["final"] == report["held_out"]["final"]


def test_compaction_and_reembedding_carry_the_index_reranker(tmp_path):
    from hybrid_retrieval.indexer.store import RERANKER_DIR, carry_reranker, sha256_file

    old, new = tmp_path / "old", tmp_path / "new"
    (old / RERANKER_DIR / "onnx").mkdir(parents=True)
    (old / RERANKER_DIR / "onnx" / "model.onnx").write_bytes(b"weights")
    (old / RERANKER_DIR / "training.json").write_text("{}")
    new.mkdir()
    files: dict = {"docs.jsonl": {"bytes": 1, "sha256": "x"}}
    carry_reranker(old, new, files)
    copied = new / RERANKER_DIR / "onnx" / "model.onnx"
    assert copied.stat().st_ino == (old / RERANKER_DIR / "onnx" / "model.onnx").stat().st_ino  # hard-linked, not copied
    assert files[f"{RERANKER_DIR}/onnx/model.onnx"] == {"bytes": 7, "sha256": sha256_file(copied)}
    assert f"{RERANKER_DIR}/training.json" in files and "docs.jsonl" in files
    carry_reranker(new, tmp_path / "none", files)  # an index without one: nothing to carry


@pytest.mark.slow
def test_the_service_reranks_with_the_index_reranker_unless_it_names_one(judged, tmp_path):
    from hybrid_retrieval.evaluation.server import running_server
    from hybrid_retrieval.indexer.store import RERANKER_DIR, open_index
    from hybrid_retrieval.quality.splits import training_split
    from hybrid_retrieval.training.optimize import install_reranker
    from hybrid_retrieval.training.reembed import reembed_index
    from hybrid_retrieval.training.reranker import TrainOptions, train_reranker

    index = fresh_copy(judged, tmp_path)
    queries, qrels = training_split(judged / "queries.jsonl", judged / "qrels" / "train.tsv")
    opened = open_index(index, verify="size")
    train_reranker(opened, queries, qrels, tmp_path / "reranker", TrainOptions(epochs=1, device="cpu"), progress=False)
    opened.close()
    install_reranker(tmp_path / "reranker", index)
    open_index(index, verify="full").close()  # inventoried: the checksums hold

    with running_server(index) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        body = client.post("/search", json={"query": "lava and magma volcano", "k": 3}).json()
        assert body["reranker"] == f"index/{RERANKER_DIR}" and body["spec"]["rerank"]["enabled"]
        assert "rerank" in client.get("/ready").json()["evidence"]
    with running_server(index, {"HYBRID_RERANK_BY_DEFAULT": "false"}) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        assert client.post("/search", json={"query": "lava", "k": 3}).json()["reranker"] is None

    reembed_index(index, progress=False)  # re-embedding keeps it, inventoried
    assert (index / RERANKER_DIR / "onnx").is_dir()
    open_index(index, verify="full").close()


def test_the_target_is_an_index_folder_or_a_collection_of_the_data_directory(judged, tmp_path):
    from hybrid_retrieval.common.errors import NotFound
    from hybrid_retrieval.engine.offline import index_folder

    assert index_folder(str(judged / "index"), None) == judged / "index"
    data = tmp_path / "data"
    shutil.copytree(judged / "index", data / "collections" / "notes")
    assert index_folder("notes", data) == data / "collections" / "notes"
    with pytest.raises(NotFound, match="neither an index folder nor a collection"):
        index_folder("missing", data)
