"""Encoder adaptation: the contrastive loss, `hybrid train-embedder` on a tiny synthetic corpus, and `hybrid reembed`."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from tests.conftest import write_jsonl

pytestmark = pytest.mark.training  # fine-tunes the encoder

TOPICS = {
    "volcano": "lava magma eruption crater ash basalt caldera vent",
    "orchard": "apple pear blossom harvest cider graft pruning fruit",
    "glacier": "ice moraine crevasse meltwater fjord snowpack calving",
    "violin": "bow string rosin fingerboard sonata concerto luthier",
    "bakery": "dough yeast crust oven flour sourdough knead pastry",
    "satellite": "orbit antenna telemetry launch payload transponder",
}


def synthetic_corpus(docs_per_topic: int = 5, seed: int = 0):
    """Documents drawn from a few topic vocabularies, and queries that name one document's words: nothing scifact-like."""
    rng = random.Random(seed)
    corpus, queries, qrels = [], {}, {}
    for topic, words in TOPICS.items():
        vocabulary = words.split()
        for i in range(docs_per_topic):
            picked = rng.sample(vocabulary, 5)
            doc_id = f"{topic}-{i}"
            text = f"The {topic} record mentions {', '.join(picked[:3])}. It also notes {picked[3]} and {picked[4]} at the {topic} site."
            corpus.append({"_id": doc_id, "title": f"{topic} note {i}", "text": text})
            queries[f"q-{doc_id}"] = f"{picked[0]} and {picked[1]} {topic}"
            qrels[f"q-{doc_id}"] = {doc_id: 1}
    return corpus, queries, qrels


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A BEIR-layout folder (corpus, queries, train qrels) and its index."""
    from hybrid_retrieval.indexer.build import BuildOptions, build_index

    root = tmp_path_factory.mktemp("synthetic")
    corpus, queries, qrels = synthetic_corpus()
    write_jsonl(root / "corpus.jsonl", corpus)
    write_jsonl(root / "queries.jsonl", [{"_id": q, "text": t} for q, t in queries.items()])
    (root / "qrels").mkdir()
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{r}" for q, rels in qrels.items() for d, r in rels.items()]
    (root / "qrels" / "train.tsv").write_text("\n".join(lines) + "\n")
    (root / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
    build_index(root / "corpus.jsonl", root / "index", BuildOptions(progress=False))
    return root


@pytest.fixture(scope="module")
def trained(synthetic):
    from hybrid_retrieval.indexer.store import open_index
    from hybrid_retrieval.training.embedder import EmbedderOptions, train_embedder

    _, queries, qrels = synthetic_corpus()
    options = EmbedderOptions(epochs=2, batch_size=4, mine_depth=5, eval_depth=10, dev_fraction=0.2, learning_rate=1e-4, device="cpu")
    index = open_index(synthetic / "index", verify="size")
    record = train_embedder(index, queries, qrels, synthetic / "model", options, progress=False)
    index.close()
    return synthetic / "model", record


def test_contrastive_loss_is_cross_entropy_over_the_batch_with_masked_columns():
    import torch

    from hybrid_retrieval.training.embedder import contrastive_loss

    q = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.6, 0.8]]), dim=-1)
    d = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), dim=-1)
    mask = torch.tensor([[False, False, True], [False, False, False]])  # column 2 is relevant to query 0 too
    s = 20.0 * (q @ d.T).numpy()
    row0 = -(s[0, 0] - math.log(math.exp(s[0, 0]) + math.exp(s[0, 1])))
    row1 = -(s[1, 1] - math.log(np.exp(s[1]).sum()))
    assert float(contrastive_loss(q, d, mask, 20.0)) == pytest.approx((row0 + row1) / 2, rel=1e-5)


def test_relevant_mask_hides_other_relevant_columns_but_never_the_own_positive():
    from hybrid_retrieval.training.embedder import Example, relevant_mask

    batch = [Example("a", 0, (5,)), Example("b", 1, (0,))]
    columns = [0, 1, 5, 0]
    mask = relevant_mask(batch, columns, {"a": frozenset({0, 1}), "b": frozenset({1})})
    assert mask.tolist() == [[False, True, False, True], [False, False, False, False]]


def test_options_are_validated():
    from hybrid_retrieval.common.errors import ConfigError
    from hybrid_retrieval.training.embedder import EmbedderOptions

    for bad in ({"batch_size": 1}, {"dev_fraction": 0.0}, {"hard_negatives": 5, "mine_depth": 5}, {"device": "tpu"}):
        with pytest.raises(ConfigError):
            EmbedderOptions(**bad)


def test_train_embedder_selects_on_held_out_queries_and_records_the_recipe(trained):
    from sentence_transformers import SentenceTransformer

    folder, _ = trained
    saved = json.loads((folder / "training.json").read_text())
    assert saved["kind"] == "embedder" and saved["data"]["recipe"] == "supervised"
    held_out = saved["held_out"]
    assert held_out["per_epoch"][0]["epoch"] == 0 and len(held_out["per_epoch"]) >= 2
    best = max(held_out["per_epoch"], key=lambda row: row["ndcg@10"])
    assert held_out["after"] == best["ndcg@10"] >= held_out["before"]  # the base model is a candidate too
    assert saved["data"]["held_out_queries"] == 6 and len(saved["data"]["held_out_ids"]) == 6  # 20% of 30, recorded
    assert len(saved["loss"]["curve"]) == sum(1 for row in held_out["per_epoch"][1:]) * (24 // 4)  # 24 examples, batch 4
    assert SentenceTransformer(str(folder), device="cpu").encode(["lava"]).shape == (1, 384)


def test_reembed_swaps_the_dense_half_and_serves_what_torch_computes(synthetic, trained, tmp_path):
    import shutil

    from sentence_transformers import SentenceTransformer

    from hybrid_retrieval.indexer.manifest import read_manifest
    from hybrid_retrieval.indexer.store import open_index
    from hybrid_retrieval.training.reembed import reembed_index

    folder, record = trained
    index_dir = tmp_path / "index"
    shutil.copytree(synthetic / "index", index_dir)
    before = read_manifest(index_dir)
    report = reembed_index(index_dir, str(folder), device="cpu", progress=False)
    after = read_manifest(index_dir)
    assert after.embedder.model == str(folder) and after.embedder.model_checksum != before.embedder.model_checksum
    assert after.embedder.training["recipe"] == "supervised"
    assert after.embedder.training["held_out"]["after"] == record["held_out"]["after"]
    assert report["from"]["model_checksum"] == before.embedder.model_checksum
    for unchanged in ("docs.jsonl", "bm25/data.csc.index.npy"):
        assert after.files[unchanged]["sha256"] == before.files[unchanged]["sha256"]

    index = open_index(index_dir, query_precision="fp32")
    texts = [index.doc_text(i) for i in range(index.num_docs)]
    reference = SentenceTransformer(str(folder), device="cpu").encode(texts, normalize_embeddings=True)
    assert np.min(np.sum(reference * index.embeddings, axis=1)) >= 0.999  # served documents = torch's vectors
    queries = ["lava crater", "sourdough oven"]
    served = index.query_embedder.encode(queries)
    torch_queries = SentenceTransformer(str(folder), device="cpu").encode(queries, normalize_embeddings=True)
    assert np.min(np.sum(served * torch_queries, axis=1)) >= 0.999
    hits = index.pipeline().search("lava crater", k=3, spec={"mode": "dense"}).ranking
    assert np.allclose(hits.scores, np.sort(index.embeddings @ served[0])[::-1][:3], atol=1e-5)
    index.close()


def test_reembed_keeps_written_documents_and_retunes_a_tuned_fusion(synthetic, trained, tmp_path):
    import shutil

    from hybrid_retrieval.indexer.live.collection import Collection
    from hybrid_retrieval.indexer.manifest import read_manifest
    from hybrid_retrieval.indexer.store import open_index
    from hybrid_retrieval.quality.splits import training_split
    from hybrid_retrieval.training.fusion import tune_fusion_on_index
    from hybrid_retrieval.training.reembed import reembed_index

    folder, _ = trained
    root = tmp_path / "beir"
    shutil.copytree(synthetic, root, ignore=lambda folder, names: ["model"] if folder == str(synthetic) else [])
    index_dir = root / "index"
    queries, qrels = training_split(root / "queries.jsonl", root / "qrels" / "train.tsv")
    tune_fusion_on_index(index_dir, queries, qrels, root / "qrels" / "train.tsv", progress=False)
    collection = Collection(open_index(index_dir, verify="size"))
    collection.upsert([{"id": "new-1", "title": "lava tube", "text": "A cave of basalt left by flowing lava."}])
    collection.delete(["volcano-0"])
    seq = collection.seq
    collection.close()

    report = reembed_index(index_dir, str(folder), device="cpu", progress=False)
    manifest = read_manifest(index_dir)
    assert manifest.applied_sequence == seq and not (index_dir / "live" / "wal.log").exists()
    assert report["fusion"]["decision"] in ("tuned", "kept untuned")
    # the model trained on this split: only the 6 queries it held out choose the fusion for it
    assert report["fusion"]["queries"] == 6 and read_manifest(index_dir).fusion_tuning.queries == 6
    assert manifest.fusion_tuning.tuned_at >= read_manifest(synthetic / "index").created_at
    index = open_index(index_dir)
    assert "new-1" in index.doc_positions and "volcano-0" not in index.doc_positions
    assert index.num_docs == 30
    index.close()


def test_reembed_asks_for_the_queries_of_a_tuned_fusion_it_cannot_find(synthetic, trained, tmp_path):
    import shutil

    from hybrid_retrieval.common.errors import ConfigError
    from hybrid_retrieval.indexer.manifest import read_manifest, update_manifest
    from hybrid_retrieval.training.reembed import reembed_index

    index_dir = tmp_path / "index"
    shutil.copytree(synthetic / "index", index_dir)

    def fake_tuning(manifest):
        from hybrid_retrieval.indexer.manifest import FusionTuning

        manifest.fusion_tuning = FusionTuning("ndcg@10", 0.5, 3, str(tmp_path / "gone" / "qrels" / "train.tsv"), 100, {}, 60.0)

    update_manifest(index_dir, fake_tuning)
    with pytest.raises(ConfigError, match="--keep-fusion"):
        reembed_index(index_dir, str(trained[0]), device="cpu", progress=False)
    assert read_manifest(index_dir).embedder.model == read_manifest(synthetic / "index").embedder.model  # checked before any work


@pytest.mark.slow
def test_cli_refuses_test_qrels_and_reembeds_with_a_report(synthetic, trained, tmp_path):
    import shutil

    from tests.test_cli import hybrid

    refused = hybrid(
        "train-embedder",
        synthetic / "index",
        "--queries",
        synthetic / "queries.jsonl",
        "--qrels",
        synthetic / "qrels" / "test.tsv",
        "--out",
        tmp_path / "model",
    )
    assert refused.returncode == 2 and "test queries must never" in refused.stderr and not (tmp_path / "model").exists()
    refused = hybrid(
        "train-embedder",
        synthetic / "index",
        "--queries",
        synthetic / "queries.jsonl",
        "--qrels",
        synthetic / "qrels" / "train.tsv",
        "--out",
        tmp_path / "model",
        "--batch-size",
        64,
        "--quiet",
    )
    assert refused.returncode == 2 and "fewer than one batch of 64" in refused.stderr and not (tmp_path / "model").exists()

    shutil.copytree(synthetic / "index", tmp_path / "index")
    result = hybrid("reembed", tmp_path / "index", "--model", trained[0], "--device", "cpu", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "re-embedded 30 documents" in result.stdout and '"recipe": "supervised"' in result.stdout


def test_sentences_keep_query_sized_sentences_only():
    from hybrid_retrieval.training.pseudo import sentences

    text = "Short one. This sentence has exactly six words. Another valid sentence of five words! 3 words here."
    assert sentences(text) == ["This sentence has exactly six words.", "Another valid sentence of five words!"]


def test_pseudo_queries_are_kept_only_where_the_hybrid_finds_their_document(synthetic):
    from hybrid_retrieval.common.errors import ConfigError
    from hybrid_retrieval.indexer.store import open_index
    from hybrid_retrieval.training.pseudo import generate

    index = open_index(synthetic / "index", verify="size")
    pseudo = generate(index, "both", max_queries=100, filter_depth=3, seed=1, progress=False)
    assert set(pseudo.stats["kept"]) == {"title", "ict"} and pseudo.stats["documents_seen"] == 30
    assert sum(pseudo.stats["kept"].values()) == len(pseudo.queries) <= sum(pseudo.stats["generated"].values())
    pipeline = index.pipeline()
    for qid, text in pseudo.queries.items():
        (doc_id,) = pseudo.qrels[qid]
        assert qid.endswith(doc_id) and index.doc_positions[doc_id] in pipeline.search(text, k=3).ranking.doc_idx.tolist()
        doc = index.docs.get(index.doc_positions[doc_id])
        passage = pseudo.passages[qid]  # the document without the query: titles for their body, a sentence for the rest
        assert text not in passage and (passage == doc["text"] if "-title-" in qid else passage.startswith(doc["title"] + " "))
    assert generate(index, "both", max_queries=100, filter_depth=3, seed=1, progress=False).queries == pseudo.queries  # seeded
    assert len(generate(index, "ict", max_queries=4, filter_depth=3, progress=False).queries) == 4
    with pytest.raises(ConfigError, match="valid: title, ict, both"):
        generate(index, "bogus", 10, 3)
    index.close()


def test_adapt_trains_on_pseudo_queries_and_records_them(synthetic, tmp_path):
    from hybrid_retrieval.indexer.store import open_index
    from hybrid_retrieval.training.embedder import EmbedderOptions, adapt_embedder

    index = open_index(synthetic / "index", verify="size")
    options = EmbedderOptions(epochs=1, batch_size=4, mine_depth=5, eval_depth=10, device="cpu")
    record = adapt_embedder(index, tmp_path / "adapted", options, recipe="ict", max_queries=20, filter_depth=5, progress=False)
    index.close()
    assert record["data"]["recipe"] == "pseudo:ict" and record["data"]["pseudo"]["kept"]["ict"] == 20
    assert record["data"]["held_out_queries"] == 4 and record["data"]["examples_per_epoch"] == 16
    assert json.loads((tmp_path / "adapted" / "training.json").read_text())["held_out"] == record["held_out"]


def test_tune_on_pseudo_queries_records_how_to_make_them_again(synthetic, tmp_path):
    import shutil

    from hybrid_retrieval.indexer.manifest import read_manifest
    from hybrid_retrieval.training.pseudo import parse_source
    from tests.test_cli import hybrid

    index_dir = tmp_path / "index"
    shutil.copytree(synthetic / "index", index_dir)
    both = hybrid(
        "tune", index_dir, "--pseudo", "title", "--queries", synthetic / "queries.jsonl", "--qrels", synthetic / "qrels" / "train.tsv"
    )
    assert both.returncode == 2 and "either --queries and --qrels" in both.stderr
    result = hybrid("tune", index_dir, "--pseudo", "both", "--max-queries", 12, "--filter-depth", 3, "--quiet")
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(index_dir)
    assert manifest.fusion_tuning.qrels == "pseudo:both:12:3" and manifest.fusion_tuning.queries == 12
    assert parse_source(manifest.fusion_tuning.qrels) == ("both", 12, 3) and parse_source("qrels/train.tsv") is None
    assert manifest.evidence["fusion"]["split"] == "pseudo:both:12:3"


def test_eval_compares_each_pipeline_with_the_baseline_index(synthetic, trained, tmp_path):
    import shutil

    from hybrid_retrieval.evaluation.suite import EvalConfig, evaluate_dataset
    from hybrid_retrieval.training.reembed import reembed_index

    index_dir = tmp_path / "index"
    shutil.copytree(synthetic / "index", index_dir)
    reembed_index(index_dir, str(trained[0]), device="cpu", progress=False)
    config = EvalConfig(pipelines=("bm25", "dense", "hybrid"), tune=False, progress=False, baseline_index=synthetic / "index")
    report = evaluate_dataset(synthetic, index_dir, config)
    base = evaluate_dataset(synthetic, synthetic / "index", EvalConfig(pipelines=("bm25", "dense"), tune=False, progress=False))
    rows = report["baseline_index"]["pipelines"]
    assert rows["bm25"]["ndcg@10_delta"] == 0 and rows["bm25"]["ties"] == 30 and rows["bm25"]["p_value"] == 1.0  # BM25 is untouched
    assert rows["dense"]["baseline"]["ndcg@10"] == base["pipelines"]["dense"]["ndcg@10"]
    assert rows["dense"]["ndcg@10_delta"] == pytest.approx(
        report["pipelines"]["dense"]["ndcg@10"] - base["pipelines"]["dense"]["ndcg@10"], abs=2e-4
    )
    assert rows["dense"]["wins"] + rows["dense"]["ties"] + rows["dense"]["losses"] == 30

    from bench.adapt_bench import comparison_rows, training_row

    dense = rows["dense"]
    assert {
        "model": "supervised",
        "pipeline": "dense",
        "base": dense["baseline"]["ndcg@10"],
        "adapted": round(dense["baseline"]["ndcg@10"] + dense["ndcg@10_delta"], 4),
        "change": dense["ndcg@10_delta"],
        "p": dense["p_value"],
        "wins/ties/losses": f"{dense['wins']}/{dense['ties']}/{dense['losses']}",
    } in comparison_rows("supervised", report)
    recipe = training_row("supervised", trained[1])
    assert (recipe["recipe"], recipe["examples per epoch"], recipe["held-out queries"]) == ("supervised", 24, 6)


def test_reembed_refits_a_hubness_correction_on_its_bank(synthetic, trained, tmp_path):
    import shutil

    from hybrid_retrieval.indexer.manifest import read_manifest
    from hybrid_retrieval.search.spec import HubnessSpec
    from hybrid_retrieval.training.hubness import fit_hubness_from_bank
    from hybrid_retrieval.training.reembed import reembed_index

    index_dir = tmp_path / "index"
    shutil.copytree(synthetic / "index", index_dir)
    fit_hubness_from_bank(index_dir, "pseudo", HubnessSpec("dbnorm"), set_default=True, force=True, gallery_size=10, pseudo_size=12)
    before = read_manifest(index_dir)
    report = reembed_index(index_dir, str(trained[0]), device="cpu", progress=False)
    after = read_manifest(index_dir)
    assert report["hubness"] == {"bank": before.hubness.bank["kind"], "default": "dbnorm"}
    assert after.defaults.hubness == HubnessSpec("dbnorm") and after.evidence["hubness"]["decision"] == "forced"
    assert after.hubness.bank == before.hubness.bank and after.hubness.gallery["size"] == 10
    assert after.hubness.params.beta != before.hubness.params.beta  # rescaled to the new model's score spread
    assert all(name.startswith(after.hubness.folder) or not name.startswith("hubness") for name in after.files)
    assert (index_dir / after.hubness.folder).is_dir()


def test_reembed_publishes_nothing_when_writes_arrive_meanwhile(synthetic, trained, tmp_path, monkeypatch):
    import shutil

    from hybrid_retrieval.common.errors import HybridError
    from hybrid_retrieval.indexer import reembed as module
    from hybrid_retrieval.indexer.manifest import read_manifest

    index_dir = tmp_path / "index"
    shutil.copytree(synthetic / "index", index_dir)
    sizes = iter([0, 128])  # the log grew between the start and the publish
    monkeypatch.setattr(module, "_size", lambda path: next(sizes))
    with pytest.raises(HybridError, match="written while re-embedding; nothing changed"):
        module.reembed(index_dir, str(trained[0]), device="cpu", progress=False)
    assert read_manifest(index_dir).embedder.model_checksum == read_manifest(synthetic / "index").embedder.model_checksum
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]  # no temporary folder left behind


def test_reembed_publishes_nothing_while_a_service_holds_the_log(synthetic, trained, tmp_path):
    """The log is locked from the last check for writes through the swap: a process writing to the index (a running
    service) holds it, so re-embedding refuses rather than swap a folder from under its writes."""
    import shutil

    from hybrid_retrieval.common.errors import HybridError
    from hybrid_retrieval.indexer import reembed as module
    from hybrid_retrieval.indexer.live.log import LIVE_DIR, WAL_FILE
    from hybrid_retrieval.indexer.manifest import read_manifest
    from hybrid_retrieval.indexer.wal import WriteAheadLog

    index_dir = tmp_path / "index"
    shutil.copytree(synthetic / "index", index_dir)
    service = WriteAheadLog(index_dir / LIVE_DIR / WAL_FILE, lock=True)
    try:
        with pytest.raises(HybridError, match="held by another process.*stop the service"):
            module.reembed(index_dir, str(trained[0]), device="cpu", progress=False)
    finally:
        service.close()
    assert read_manifest(index_dir).embedder.model_checksum == read_manifest(synthetic / "index").embedder.model_checksum


def test_examples_carry_the_cut_passage_of_a_pseudo_query():
    from hybrid_retrieval.training.embedder import sample_examples
    from hybrid_retrieval.training.reranker import MinedQuery

    mined = [MinedQuery("p1", (3,), (5, 6)), MinedQuery("q2", (4,), (7,))]
    examples = sample_examples(mined, {"p1": "a title", "q2": "real"}, 1, random.Random(0), {"p1": "body only"})
    assert [(e.query, e.positive, e.positive_text) for e in examples] == [("a title", 3, "body only"), ("real", 4, None)]
    assert examples[0].negatives[0] in (5, 6) and examples[1].negatives == (7,)
