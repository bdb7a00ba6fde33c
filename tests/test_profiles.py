"""Encoder profiles: the static graph against a NumPy reference and against model2vec's own encoder, a fast-profile
index that records how its model was made and ranks by its vectors, re-embedding between profiles, and the settings
that refuse what a profile cannot do."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TINY_CORPUS, write_jsonl

pytest.importorskip("model2vec", reason="the profiles extra (model2vec) is not installed")

TEXTS = [
    "Vitamin D deficiency and bone density in older adults.",
    "The cat sat on the mat.",
    "",  # no piece: the zero vector
    "☃☃☃ qqqxxzz",  # pieces the vocabulary may not know
    "ｑｕｏｋｋａ 人工智能 naïve café",
    " ".join(["mitochondrial biogenesis"] * 400),  # past the 512 pieces model2vec keeps
]


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    """The bundled model's static model (model2vec) and its export folder in a fresh export cache."""
    from hybrid_retrieval.models.onnx_export import export_dir_for
    from hybrid_retrieval.models.registry import resolve_model
    from hybrid_retrieval.models.static import StaticRecipe, distill_static, write_static_export

    cache = tmp_path_factory.mktemp("cache") / "onnx"  # laid out as $HYBRID_CACHE/onnx
    base, recipe = resolve_model(), StaticRecipe()
    static = distill_static(base, recipe)
    folder = export_dir_for(base, cache, f"static{recipe.key()}")
    folder.mkdir(parents=True)
    write_static_export(static, base, recipe, folder)
    return static, folder, cache


def reference_mean(table: np.ndarray, ids: np.ndarray, mask: np.ndarray, unknown: int) -> np.ndarray:
    rows = []
    for row_ids, row_mask in zip(ids, mask, strict=True):
        kept = [i for i, m in zip(row_ids, row_mask, strict=True) if m and i != unknown]
        mean = table[kept].mean(0) if kept else np.zeros(table.shape[1])
        norm = np.linalg.norm(mean)
        rows.append(mean / norm if norm else mean)
    return np.array(rows, dtype=np.float32)


def test_the_static_graph_averages_the_attended_known_pieces_and_normalises():
    import onnxruntime

    from hybrid_retrieval.models.static import static_graph

    rng = np.random.default_rng(0)
    table = rng.normal(size=(50, 8)).astype(np.float32)
    ids = rng.integers(0, 50, size=(6, 9))
    ids[1, :] = 3  # only the unknown piece: the zero vector
    mask = (rng.random((6, 9)) > 0.3).astype(np.int64)
    mask[2] = 0  # nothing attended (all padding): the zero vector
    mask[0] = 1
    session = onnxruntime.InferenceSession(static_graph(table, unknown_id=3), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
    np.testing.assert_allclose(got, reference_mean(table, ids, mask, unknown=3), atol=1e-6)
    assert not got[1].any() and not got[2].any()


class Table:
    """What align_static reads and writes of model2vec's StaticModel: the table, and each text's piece ids."""

    def __init__(self, embedding: np.ndarray, pieces: dict[str, list[int]]):
        self.embedding, self.pieces = embedding, pieces

    def tokenize(self, texts):
        return [self.pieces[t] for t in texts]


@pytest.mark.training  # fits the table with torch
def test_alignment_maps_the_whole_table_into_the_models_space():
    """Targets made by a linear map of the table: the closed-form stage recovers it, for every row, including the
    rows of pieces no fitted text has (the held-out texts are made of them)."""
    from hybrid_retrieval.models.static import StaticRecipe, align_static

    rng = np.random.default_rng(0)
    table, mapping = rng.normal(size=(40, 6)), rng.normal(size=(6, 9))
    pieces = {f"t{i}": list(rng.choice(30, size=int(rng.integers(2, 6)))) for i in range(60)}  # pieces 0-29
    pieces |= {f"h{i}": [30 + i, 31 + i] for i in range(8)}  # pieces 30-38: in held-out texts only
    texts = [f"h{i}" for i in range(8)] + [f"t{i}" for i in range(60)]
    targets = np.stack([table[pieces[t]].mean(0) @ mapping for t in texts])
    static = Table(table.copy(), pieces)
    recipe = StaticRecipe(align_held_out=8, align_epochs=0, align_ridge=1e-9)
    report = align_static(static, texts, targets, recipe)
    np.testing.assert_allclose(static.embedding, table @ mapping, atol=1e-4)
    assert report["held_out_texts"] == 8 and report["held_out_cosine_linear"] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.training  # fits the table with torch
def test_alignment_by_gradient_raises_the_cosine_on_texts_it_fits():
    """A target no linear map reaches (one coordinate flipped for half the texts): the epochs move the rows towards it."""
    from hybrid_retrieval.models.static import StaticRecipe, align_static

    rng = np.random.default_rng(1)
    table = rng.normal(size=(30, 4))
    pieces = {f"t{i}": [i % 30, (i * 7 + 3) % 30] for i in range(40)}
    texts = list(pieces)
    targets = np.stack([table[pieces[t]].mean(0) * (1 if i % 2 else -1) for i, t in enumerate(texts)])

    def fitted_cosine(epochs: int) -> float:
        static = Table(table.copy(), pieces)
        align_static(static, texts, targets, StaticRecipe(align_held_out=0, align_epochs=epochs, align_learning_rate=0.05))
        got = np.stack([static.embedding[pieces[t]].mean(0) for t in texts])
        return float(np.mean((got * targets).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(targets, axis=1)))

    assert fitted_cosine(epochs=30) > fitted_cosine(epochs=0) + 0.2


@pytest.mark.slow  # distils the bundled model first (about 10 s)
def test_the_export_embeds_like_model2vec(distilled):
    from hybrid_retrieval.models.embedder import OnnxEmbedder

    static, folder, _ = distilled
    ours = OnnxEmbedder(folder).encode(TEXTS, batch_size=4)
    theirs = np.asarray(static.encode(TEXTS), dtype=np.float64)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if not b.any():
            assert not a.any(), TEXTS[i]
            continue
        assert a @ b / np.linalg.norm(b) >= 0.999, TEXTS[i]
    assert ours.shape == (len(TEXTS), static.dim) and ours.dtype == np.float32


def table_of(export: Path) -> np.ndarray:
    """The static graph's table, read from the export's ONNX file."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(export / "model.onnx")).graph
    return numpy_helper.to_array(next(t for t in graph.initializer if t.name == "table"))


def model2vec_mean(static, table: np.ndarray, text: str) -> np.ndarray:
    """model2vec's embedding of `text` (its pieces, unknown ones dropped, averaged, normalised) over `table`."""
    ids = static.tokenize([text])[0][:512]
    mean = table[ids].astype(np.float64).mean(0)
    return mean / np.linalg.norm(mean)


@pytest.mark.slow  # distils the bundled model and aligns it on the corpus first (about 20 s)
def test_a_fast_index_records_its_profile_and_ranks_by_its_vectors(distilled, tmp_path):
    from hybrid_retrieval.indexer.build import BuildOptions, build_index
    from hybrid_retrieval.indexer.store import open_index
    from hybrid_retrieval.models.registry import resolve_model

    static, _, cache = distilled
    corpus = write_jsonl(tmp_path / "corpus.jsonl", TINY_CORPUS)
    manifest = build_index(corpus, tmp_path / "index", BuildOptions(profile="fast", onnx_cache=cache, progress=False))
    embedder = manifest.embedder
    assert (embedder.profile, embedder.dimension, embedder.pooling) == ("fast", 384, "static-mean")  # the model's space
    assert embedder.recipe["base_model_checksum"] == resolve_model().checksum
    assert embedder.recipe["method"] == "model2vec distillation, aligned to the model on the corpus"
    assert embedder.recipe["vocabulary"] == len(static.embedding) and embedder.recipe["align_documents"] == 2000
    assert embedder.recipe["alignment"]["held_out_texts"] == 1  # a fifth of a tiny corpus

    texts = [f"{d['title']} {d['text']}" if d["title"] else d["text"] for d in TINY_CORPUS]  # corpus.indexed_text
    table = table_of(tmp_path / "index" / "model")
    query = "a pet that barks"
    vectors = np.stack([model2vec_mean(static, table, text) for text in [*texts, query]])
    scores = vectors[:-1] @ vectors[-1]
    expected = [TINY_CORPUS[i]["_id"] for i in np.argsort(-scores)]
    index = open_index(tmp_path / "index", verify="full")
    try:
        assert index.query_precision == "fp32"  # no int8 weights to choose
        ranking = index.pipeline().search(query, len(TINY_CORPUS), {"mode": "dense"}).ranking
        assert [index.docs.get(int(i))["id"] for i in ranking.doc_idx] == expected
    finally:
        index.close()


@pytest.mark.slow  # distils the bundled model first (about 10 s)
def test_reembed_moves_an_index_between_profiles_and_back(distilled, tiny_index, tmp_path):
    from hybrid_retrieval.indexer.manifest import read_manifest
    from hybrid_retrieval.indexer.reembed import reembed
    from hybrid_retrieval.indexer.store import stored_vectors

    _, _, cache = distilled
    index = tmp_path / "index"
    shutil.copytree(tiny_index, index)
    before = np.array(stored_vectors(index))
    fast = reembed(index, profile="fast", onnx_cache=cache, progress=False)
    assert (fast.embedder.profile, fast.embedder.dimension) == ("fast", 384)  # aligned on the index's documents
    assert fast.build["reembedded_from"]["profile"] == "full"
    back = reembed(index, profile="full", progress=False)
    assert (back.embedder.profile, back.embedder.dimension, read_manifest(index).embedder.recipe) == ("full", 384, None)
    np.testing.assert_allclose(stored_vectors(index), before, atol=1e-6)


@pytest.mark.slow  # distils the bundled model first (about 10 s)
def test_a_fast_collection_over_http_embeds_documents_and_queries_with_its_static_model(distilled, tmp_path):
    import httpx

    from hybrid_retrieval.evaluation.server import running_server

    static, _, cache = distilled
    env = {"HYBRID_DATA": str(tmp_path / "data"), "HYBRID_CACHE": str(cache.parent), "HYBRID_WRITE_KEYS": "w", "HYBRID_VERIFY": "size"}
    with running_server(None, env) as (url, _), httpx.Client(base_url=url, headers={"X-API-Key": "w"}, timeout=60) as client:
        created = client.post("/collections", json={"name": "drafts", "settings": {"embedder": {"profile": "fast"}}})
        assert created.status_code == 201, created.text
        assert created.json()["settings"]["embedder"]["profile"] == "fast"
        refused = client.post("/collections", json={"name": "x", "settings": {"embedder": {"profile": "fast", "precision": "int8"}}})
        assert refused.status_code == 422 and "settings.embedder.precision" in refused.text
        documents = [{"id": d["_id"], "title": d["title"], "text": d["text"]} for d in TINY_CORPUS]
        assert client.put("/collections/drafts/documents?wait=true", json={"documents": documents}).status_code == 200
        query = "a pet that barks"
        hits = client.post("/collections/drafts/search", json={"query": query, "mode": "dense", "k": 3}).json()["hits"]
    texts = [f"{d['title']} {d['text']}" if d["title"] else d["text"] for d in TINY_CORPUS]
    scores = np.asarray(static.encode(texts), dtype=np.float64) @ np.asarray(static.encode([query]), dtype=np.float64)[0]
    assert [h["id"] for h in hits] == [TINY_CORPUS[i]["_id"] for i in np.argsort(-scores)[:3]]
    np.testing.assert_allclose([h["score"] for h in hits], np.sort(scores)[::-1][:3], atol=2e-3)


@pytest.mark.parametrize(
    ("embedder", "field"),
    [
        ({"profile": "turbo"}, "settings.embedder.profile"),
        ({"profile": "fast", "precision": "int8"}, "settings.embedder.precision"),
    ],
)
def test_collection_settings_refuse_what_a_profile_cannot_do(embedder, field):
    from hybrid_retrieval.common.errors import SpecError
    from hybrid_retrieval.indexer.datadir.settings import CollectionSettings

    with pytest.raises(SpecError) as refused:
        CollectionSettings.parse({"embedder": embedder})
    assert refused.value.field == field
    assert CollectionSettings.parse({"embedder": {"profile": "fast"}}).build_options().profile == "fast"


def test_build_options_refuse_an_unknown_profile_and_int8_static_weights():
    from hybrid_retrieval.common.errors import ConfigError
    from hybrid_retrieval.indexer.build import BuildOptions

    with pytest.raises(ConfigError, match="unknown encoder profile 'turbo'; valid: full, small, fast"):
        BuildOptions(profile="turbo")
    with pytest.raises(ConfigError, match="fast profile embeds at fp32 only"):
        BuildOptions(profile="fast", precision="int8")
    with pytest.raises(ConfigError, match="small profile embeds with its ONNX graph"):
        BuildOptions(profile="small", backend="torch")
    assert BuildOptions(profile="small", precision="int8").precision == "int8"  # a student has int8 weights


@pytest.mark.slow  # distils the bundled model and aligns it on the corpus first (about 20 s)
def test_a_fast_index_is_served_without_torch_as_it_ranks_in_process(distilled, tmp_path):
    from hybrid_retrieval.indexer.build import BuildOptions, build_index
    from hybrid_retrieval.indexer.store import open_index
    from tests.test_torchless import served_without_torch

    _, _, cache = distilled
    corpus = write_jsonl(tmp_path / "corpus.jsonl", TINY_CORPUS)
    build_index(corpus, tmp_path / "index", BuildOptions(profile="fast", onnx_cache=cache, progress=False))
    query = "a pet that barks"
    index = open_index(tmp_path / "index")
    try:
        ranking = index.pipeline().search(query, len(TINY_CORPUS), {"mode": "dense"}).ranking
        expected = [index.docs.get(int(i))["id"] for i in ranking.doc_idx]
    finally:
        index.close()
    with served_without_torch(tmp_path / "index", tmp_path) as client:
        response = client.post("/search", json={"query": query, "k": len(TINY_CORPUS), "mode": "dense"})
        assert response.status_code == 200, response.text
        assert [hit["id"] for hit in response.json()["hits"]] == expected


def test_a_collection_created_empty_never_takes_another_collections_aligned_table(tmp_path):
    """An aligned fast table was fitted on its own collection's corpus: a new fast collection takes the distilled one."""
    import json

    from hybrid_retrieval.indexer.datadir.layout import DataDir

    def model_folder(folder: Path, **recipe) -> Path:
        (folder / "model").mkdir(parents=True)
        config = {"model": "m", "profile": "fast", "recipe": {"method": "model2vec distillation", **recipe}}
        (folder / "model" / "embedder.json").write_text(json.dumps(config))
        return folder / "model"

    data = DataDir(tmp_path / "data")
    model_folder(data.path("papers"), alignment={"held_out_cosine": 0.82})
    (data.path("papers") / "manifest.json").write_text("{}")
    distilled = model_folder(tmp_path / "served")
    assert data._model_folder("m", "fast", [distilled]) == distilled
    model_folder(data.path("notes"))
    (data.path("notes") / "manifest.json").write_text("{}")
    assert data._model_folder("m", "fast", [distilled]) == data.path("notes") / "model"
