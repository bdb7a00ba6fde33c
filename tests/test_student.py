"""The small encoder profile: the training sample drawn from a corpus, a student distilled from the bundled model that
gets closer to its teacher, its ONNX export embedding like sentence-transformers, an index and a collection built with
it recording how it was made, and the profile refused where no corpus can make it."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from tests.conftest import TINY_CORPUS, write_jsonl

pytestmark = pytest.mark.training  # distils a student

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="distilling needs torch (the index extra)")

DOCUMENTS = [
    ("Vitamin D", "Vitamin D deficiency is common in older adults. It lowers bone density over many years. Short one."),
    ("Sleep", "Poor sleep raises the risk of heart disease in adults. Naps help."),
    ("", "Exercise improves insulin sensitivity in people with type 2 diabetes. Walking counts as exercise too."),
    ("Coffee", "Coffee drinkers live longer in several cohort studies."),
]
SAMPLE_TEXTS = ["a pet that barks", "bone density in older adults", "Quantum computing uses qubits.", " ".join(["cells"] * 300)]


def test_the_training_sample_is_the_documents_their_sentences_and_titles():
    from hybrid_retrieval.models.student import StudentRecipe, training_texts

    texts = training_texts(DOCUMENTS, StudentRecipe(documents=10, sentences=100))
    whole = [f"{t} {x}".strip() for t, x in DOCUMENTS]
    # sentences of 5 to 60 words only: "Short one.", "Naps help." and "Walking counts ..." (5 words) differ in length
    sentences = {
        "Vitamin D deficiency is common in older adults.",
        "It lowers bone density over many years.",
        "Poor sleep raises the risk of heart disease in adults.",
        "Exercise improves insulin sensitivity in people with type 2 diabetes.",
        "Walking counts as exercise too.",
        "Coffee drinkers live longer in several cohort studies.",
    }
    assert texts[:4] == whole
    assert set(texts[4:10]) == sentences
    assert texts[10:] == ["Vitamin D", "Sleep", "Coffee"]
    assert texts == training_texts(DOCUMENTS, StudentRecipe(documents=10, sentences=100))  # deterministic

    once = training_texts([("", "One single sentence about cells here."), ("Title", "Title")], StudentRecipe())
    assert once == ["One single sentence about cells here.", "Title Title", "Title"]  # each text once

    two = training_texts(DOCUMENTS, StudentRecipe(documents=2, sentences=1))
    sampled = [text for text in two if text in whole]
    assert len(sampled) == 2 and len(two) == 2 + 1 + sum(1 for t, x in DOCUMENTS if f"{t} {x}".strip() in sampled and t)


def test_a_student_recipe_refuses_layers_out_of_order():
    from hybrid_retrieval.common.errors import ConfigError
    from hybrid_retrieval.models.student import StudentRecipe

    with pytest.raises(ConfigError, match="increasing order"):
        StudentRecipe(layers=(3, 1))
    with pytest.raises(ConfigError, match="epochs must be >= 1"):
        StudentRecipe(epochs=0)
    with pytest.raises(ConfigError, match=r"learning rate \(--lr\) must be in \(0, 1\), got 2"):
        StudentRecipe(learning_rate=2.0)
    assert StudentRecipe().key() != StudentRecipe(epochs=5).key()


@pytest.fixture(scope="module")
def student(tmp_path_factory, scifact):
    """A 2-layer student of the bundled model, distilled for two epochs on 60 scifact documents (seconds)."""
    pytest.importorskip("torch", reason="distilling needs torch (the index extra)")
    from hybrid_retrieval.indexer.corpus import read_corpus
    from hybrid_retrieval.models.registry import resolve_model
    from hybrid_retrieval.models.student import StudentRecipe, distil_student, training_texts

    recipe = StudentRecipe(layers=(0, 2), epochs=2, documents=60, sentences=150, max_length=128, batch_size=16, held_out=30)
    documents = [(doc.title, doc.text) for doc, _ in zip(read_corpus(scifact / "corpus.jsonl"), range(60))]
    root = tmp_path_factory.mktemp("student")
    record = distil_student(resolve_model(), training_texts(documents, recipe), root / "model", recipe, "cpu", progress=False)
    return root / "model", record, root / "cache" / "onnx"  # the export cache the tests share (laid out as $HYBRID_CACHE/onnx)


def test_distillation_brings_the_student_closer_to_its_teacher_and_keeps_the_best_epoch(student):
    from sentence_transformers import SentenceTransformer

    from hybrid_retrieval.models.registry import resolve_model

    folder, record, _ = student
    curve = record["held_out"]["by_epoch"]
    assert len(curve) == 3 and record["held_out"]["best_epoch"] == int(np.argmax(curve))
    assert max(curve) > curve[0] + 0.05  # the cut model is far from the teacher; training moves it closer
    assert (record["kind"], record["base_model_checksum"], record["recipe"]["layers"]) == ("student", resolve_model().checksum, [0, 2])
    assert json.loads((folder / "training.json").read_text()) == record
    model = SentenceTransformer(str(folder), device="cpu")
    assert model[0].auto_model.config.num_hidden_layers == 2 and model.encode(["x"]).shape == (1, 384)


def test_the_students_export_embeds_like_sentence_transformers_and_names_the_small_profile(student):
    from sentence_transformers import SentenceTransformer

    from hybrid_retrieval.models.embedder import OnnxEmbedder
    from hybrid_retrieval.models.profiles import export_profile
    from hybrid_retrieval.models.registry import resolve_model

    folder, record, cache = student
    export = export_profile(resolve_model(str(folder)), "small", cache)
    config = json.loads((export / "embedder.json").read_text())
    assert config["profile"] == "small" and config["recipe"]["base_model_checksum"] == record["base_model_checksum"]
    assert config["recipe"]["held_out"] == record["held_out"] and (export / "model.int8.onnx").is_file()
    ours = OnnxEmbedder(export, precision="fp32").encode(SAMPLE_TEXTS)
    theirs = SentenceTransformer(str(folder), device="cpu").encode(SAMPLE_TEXTS, normalize_embeddings=True)
    assert np.min(np.sum(ours * theirs, axis=1)) >= 0.999


def test_an_index_built_with_a_student_records_the_small_profile_and_ranks_by_its_vectors(student, tmp_path):
    from sentence_transformers import SentenceTransformer

    from hybrid_retrieval.indexer.build import BuildOptions, build_index
    from hybrid_retrieval.indexer.store import open_index

    folder, record, cache = student
    corpus = write_jsonl(tmp_path / "corpus.jsonl", TINY_CORPUS)
    options = BuildOptions(model=str(folder), profile="small", precision="int8", onnx_cache=cache, progress=False)
    manifest = build_index(corpus, tmp_path / "index", options)
    assert (manifest.embedder.profile, manifest.embedder.document_precision) == ("small", "int8")
    assert manifest.embedder.recipe["recipe"]["layers"] == [0, 2] and manifest.embedder.recipe["texts"] == record["texts"]

    texts = [f"{d['title']} {d['text']}" if d["title"] else d["text"] for d in TINY_CORPUS]  # corpus.indexed_text
    model = SentenceTransformer(str(folder), device="cpu")
    query = "a pet that barks"
    scores = model.encode(texts, normalize_embeddings=True) @ model.encode([query], normalize_embeddings=True)[0]
    index = open_index(tmp_path / "index", verify="full")
    try:
        hits = index.pipeline().search(query, 3, {"mode": "dense"}).ranking
        assert [index.docs.get(int(i))["id"] for i in hits.doc_idx] == [TINY_CORPUS[i]["_id"] for i in np.argsort(-scores)[:3]]
    finally:
        index.close()


def test_the_small_profile_needs_a_corpus_or_a_student(tmp_path):
    from hybrid_retrieval.common.errors import ConfigError, SpecError
    from hybrid_retrieval.indexer.datadir.layout import DataDir
    from hybrid_retrieval.indexer.datadir.settings import CollectionSettings
    from hybrid_retrieval.models.profiles import export_profile
    from hybrid_retrieval.models.registry import resolve_model

    with pytest.raises(ConfigError, match="hybrid distil"):
        export_profile(resolve_model(), "small", tmp_path / "onnx")
    with pytest.raises(SpecError) as refused:
        DataDir(tmp_path / "data").create("notes", CollectionSettings.parse({"embedder": {"profile": "small"}}))
    assert refused.value.field == "settings.embedder.profile" and "hybrid distil" in str(refused.value)


def test_a_collection_takes_a_students_folder_as_its_small_model(student, tmp_path, monkeypatch):
    from hybrid_retrieval.indexer.datadir.layout import DataDir
    from hybrid_retrieval.indexer.datadir.settings import CollectionSettings

    folder, _, cache = student
    monkeypatch.setenv("HYBRID_CACHE", str(cache.parent))
    settings = CollectionSettings.parse({"embedder": {"model": str(folder), "profile": "small", "precision": "int8"}})
    manifest = DataDir(tmp_path / "data").create("notes", settings)
    assert (manifest.embedder.profile, manifest.embedder.recipe["recipe"]["layers"]) == ("small", [0, 2])


@pytest.mark.slow  # distils with the default recipe on a small corpus (about a minute)
def test_a_small_build_distils_on_its_corpus_once_and_reembed_moves_to_it(tmp_path):
    from hybrid_retrieval.indexer.build import BuildOptions, build_index
    from hybrid_retrieval.indexer.reembed import reembed
    from hybrid_retrieval.indexer.store import stored_vectors

    documents = [{**d, "_id": f"{d['_id']}-{i}", "text": f"{d['text']} Note {i}."} for i in range(20) for d in TINY_CORPUS]
    corpus = write_jsonl(tmp_path / "corpus.jsonl", documents)
    cache = tmp_path / "onnx"
    first = build_index(corpus, tmp_path / "a", BuildOptions(profile="small", onnx_cache=cache, device="cpu", progress=False))
    assert first.embedder.profile == "small" and first.embedder.model == "sentence-transformers/all-MiniLM-L6-v2"
    records = sorted(cache.glob("student*/training.json"))
    assert len(records) == 1 and first.embedder.recipe["recipe"]["epochs"] == 6
    made = records[0].stat().st_mtime_ns
    second = build_index(corpus, tmp_path / "b", BuildOptions(profile="small", onnx_cache=cache, device="cpu", progress=False))
    assert records[0].stat().st_mtime_ns == made and second.embedder.model_checksum == first.embedder.model_checksum

    build_index(corpus, tmp_path / "c", BuildOptions(onnx_cache=cache, progress=False))
    moved = reembed(tmp_path / "c", profile="small", onnx_cache=cache, device="cpu", progress=False)
    assert moved.embedder.profile == "small" and moved.build["reembedded_from"]["profile"] == "full"
    assert sorted(cache.glob("student*/training.json")) == records  # the same documents: the same student
    np.testing.assert_allclose(stored_vectors(tmp_path / "c"), stored_vectors(tmp_path / "a"), atol=1e-5)


@needs_torch
def test_a_corpus_too_small_or_an_out_folder_not_a_students_is_refused_before_any_work(tmp_path):
    from hybrid_retrieval.common.errors import ConfigError
    from hybrid_retrieval.models.registry import resolve_model
    from hybrid_retrieval.models.student import distil_student, training_texts

    texts = training_texts((d["title"], d["text"]) for d in TINY_CORPUS)
    with pytest.raises(ConfigError, match=f"at least 20 training texts, got {len(texts)}"):
        distil_student(resolve_model(), texts, tmp_path / "never", progress=False)
    assert not (tmp_path / "never").exists()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not a student's folder: refusing to replace it"):
        distil_student(resolve_model(), texts * 10, tmp_path / "notes", progress=False)
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


def test_a_students_folder_is_of_the_small_profile_only(student):
    from hybrid_retrieval.common.errors import ConfigError
    from hybrid_retrieval.models.profiles import export_profile
    from hybrid_retrieval.models.registry import resolve_model

    folder, _, cache = student
    with pytest.raises(ConfigError, match="is a student distilled for the small profile: give it with profile small"):
        export_profile(resolve_model(str(folder)), "full", cache)


@needs_torch
def test_hybrid_distil_writes_a_student_and_says_how_to_build_with_it(scifact, tmp_path, capsys):
    from hybrid_retrieval.cli import main

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(line for line, _ in zip((scifact / "corpus.jsonl").open(), range(30))))
    out = tmp_path / "student"
    flags = ["--layers", "0", "--epochs", "1", "--documents", "30", "--sentences", "40", "--max-length", "64", "--batch-size", "16"]
    main(["distil", str(corpus), "--out", str(out), *flags, "--device", "cpu", "--quiet"])
    record = json.loads((out / "training.json").read_text())
    assert record["recipe"]["layers"] == [0] and record["texts"]["training"] + record["texts"]["held_out"] > 30
    printed = capsys.readouterr().out
    assert f"(epoch {record['held_out']['best_epoch']}); model saved to {out}" in printed
    assert f"hybrid index CORPUS --model {out} --profile small" in printed
