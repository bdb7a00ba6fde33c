import json
import shutil

import numpy as np
import pytest

from hybrid_retrieval.common.errors import HybridError
from hybrid_retrieval.indexer import store
from hybrid_retrieval.indexer.build import BuildOptions, build_index
from hybrid_retrieval.indexer.corpus import CorpusError, read_corpus
from hybrid_retrieval.indexer.manifest import FORMAT_VERSION, Manifest
from hybrid_retrieval.indexer.store import IndexOpenError, open_index
from hybrid_retrieval.search.spec import HubnessSpec, SearchSpec
from tests.conftest import TINY_CORPUS, write_jsonl


def test_manifest_describes_the_build(tiny_index):
    manifest = json.loads((tiny_index / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["defaults"] == SearchSpec().to_dict() and manifest["fusion_tuning"] is None and manifest["hubness"] is None
    assert Manifest.from_dict(manifest).to_dict() == manifest
    assert manifest["counts"]["documents"] == len(TINY_CORPUS)
    assert manifest["embedder"]["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert manifest["embedder"]["dimension"] == 384 and len(manifest["embedder"]["model_checksum"]) == 64
    assert manifest["analyzer"]["stemmer"] == "porter"
    assert manifest["bm25"] == {"engine": "bm25s", "method": "lucene", "k1": 1.5, "b": 0.75, "delta": 0.5}
    assert manifest["faiss"]["factory"] == "Flat"
    assert {"docs.jsonl", "dense.faiss", "model/model.onnx"} <= set(manifest["files"])
    assert "embeddings.npy" not in manifest["files"]  # the flat index holds the vectors: no second copy
    for rel, entry in manifest["files"].items():
        assert entry["sha256"] == store.sha256_file(tiny_index / rel)


def test_open_index_reads_documents_and_vectors(tiny_index):
    index = open_index(tiny_index, verify="full")
    assert index.num_docs == len(TINY_CORPUS)
    assert index.docs.get(4) == {"id": "d5", "title": "Running", "text": TINY_CORPUS[4]["text"], "metadata": {"lang": "en"}}
    vectors = store.stored_vectors(tiny_index)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # Stored vectors are what the index's own embedder produces for the same text.
    again = index.embedder.encode(["Cats The cat sat on the mat. Cats like warm mats."])
    np.testing.assert_allclose(again[0], vectors[0], atol=1e-5)


@pytest.fixture
def index_copy(tiny_index, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(tiny_index, target)
    return target


def test_stored_lines_are_copied_as_a_corpus_of_the_same_documents(tiny_index, tmp_path):
    index = open_index(tiny_index)
    chosen = np.array([0, 2, 3, index.num_docs - 1])
    with (tmp_path / "corpus.jsonl").open("wb") as fh:
        index.docs.copy_lines(chosen, fh)
        index.docs.copy_lines(chosen[:0], fh)
    copied = [{"id": d.doc_id, "title": d.title, "text": d.text, "metadata": d.metadata} for d in read_corpus(tmp_path / "corpus.jsonl")]
    assert copied == [index.docs.get(int(i)) for i in chosen]


@pytest.mark.parametrize("rows", [3, store.ID_ROWS])
def test_ids_are_read_in_bulk_as_decoding_each_document_gives_them(tmp_path, monkeypatch, rows):
    monkeypatch.setattr(store, "ID_ROWS", rows)
    window = store.ID_WINDOW
    ids = ["d1", "", 'q"uote', "back\\slash", 'x", "title": "y', "café 中文 🙂", "new\nline", "é" * (window // 2), "é" * (window // 2 + 1)]
    ids += ["a" * (window - 1), "a" * window, "a" * (window + 1), "last"]
    writer = store.DocStoreWriter(tmp_path)
    for i, doc_id in enumerate(ids):
        writer.add(doc_id, "title", "text " * i, {"n": i})
    writer.close()
    assert store.DocStore(tmp_path).ids() == ids
    # a line of another layout (the id not first) is decoded whole
    lines = (tmp_path / store.DOCS).read_bytes().splitlines(keepends=True)
    lines[1] = json.dumps({"title": "t", "id": "moved", "text": "", "metadata": {}}).encode() + b"\n"
    (tmp_path / store.DOCS).write_bytes(b"".join(lines))
    np.save(tmp_path / store.DOC_OFFSETS, np.cumsum([0] + [len(line) for line in lines]))
    assert store.DocStore(tmp_path).ids() == [ids[0], "moved", *ids[2:]]
    assert store.DocStore(tmp_path).ids() == [json.loads(line)["id"] for line in lines]


@pytest.mark.parametrize("colliding", [False, True])
def test_positions_by_id_find_every_stored_id_and_nothing_else(tmp_path, monkeypatch, colliding):
    if colliding:  # every id of one length shares a hash: the stored documents tell them apart
        monkeypatch.setattr(store, "hash", len, raising=False)
    ids = ["b", "a", "ab", "ba", "中", "x" * 70, "", "zz"]
    writer = store.DocStoreWriter(tmp_path)
    for doc_id in ids:
        writer.add(doc_id, "", "", {})
    writer.close()
    positions = store.IdPositions(store.DocStore(tmp_path))
    assert dict(positions) == {doc_id: i for i, doc_id in enumerate(ids)} and len(positions) == len(ids)
    assert [positions.get(doc_id) for doc_id in ids] == list(range(len(ids)))
    for absent in ("c", "abc", "xx", 3, None):
        assert absent not in positions and positions.get(absent, -1) == -1
    with pytest.raises(KeyError):
        positions["c"]


def test_corrupted_file_fails_checksum(index_copy):
    data = bytearray((index_copy / "dense.faiss").read_bytes())
    data[-1] ^= 0xFF
    (index_copy / "dense.faiss").write_bytes(bytes(data))
    with pytest.raises(IndexOpenError, match="dense.faiss does not match its checksum"):
        open_index(index_copy)


def test_truncated_file_is_detected_even_without_checksums(index_copy):
    with (index_copy / "docs.jsonl").open("r+b") as fh:
        fh.truncate(10)
    with pytest.raises(IndexOpenError, match="truncated or replaced"):
        open_index(index_copy, verify="size")


def test_missing_file_and_missing_manifest(index_copy, tmp_path):
    (index_copy / "dense.faiss").unlink()
    with pytest.raises(IndexOpenError, match="index file missing"):
        open_index(index_copy)
    with pytest.raises(IndexOpenError, match="not an index"):
        open_index(tmp_path / "nowhere")


def test_future_format_version_is_refused(index_copy):
    manifest = json.loads((index_copy / "manifest.json").read_text())
    manifest["format_version"] = 99
    (index_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexOpenError, match="format version 99 is not supported"):
        open_index(index_copy)


def test_version_1_manifest_is_read_by_migration(index_copy):
    """Format 1 kept the fusion default and depth under `fusion` and the hubness default under `hubness`."""
    v2 = json.loads((index_copy / "manifest.json").read_text())
    v1 = {k: v for k, v in v2.items() if k not in ("defaults", "fusion_tuning", "hubness")}
    tuning = {
        "metric": "ndcg@10",
        "value": 0.7,
        "queries": 3,
        "qrels": "train.tsv",
        "depth": 40,
        "best_per_norm": {"minmax": 0.5},
        "best_rrf_k": 60.0,
    }
    v1.update(
        format_version=1,
        fusion={"depth": 40, "default": {"method": "cc", "alpha": 0.3, "norm": "zscore"}, "tuning": tuning},
        hubness={
            "default": {"method": "dbnorm", "dynamic": True},
            "params": {"beta": 20.0, "beta1": 0.5, "beta2": 3.0, "k": 1},
            "bank": {},
            "gallery": {},
            "activation": {},
            "fit_seconds": 1.0,
        },
    )
    manifest = Manifest.from_dict(v1)
    assert manifest.defaults == SearchSpec.from_dict(
        {"depth": 40, "fusion": {"method": "cc", "alpha": 0.3, "norm": "zscore"}, "hubness": {"method": "dbnorm", "dynamic": True}}
    )
    assert manifest.fusion_tuning.value == 0.7 and manifest.hubness.folder == "hubness"
    assert manifest.defaults.hubness == HubnessSpec("dbnorm", True)
    assert manifest.to_dict()["format_version"] == FORMAT_VERSION


def test_malformed_manifest_is_refused_with_its_path(index_copy):
    manifest = json.loads((index_copy / "manifest.json").read_text())
    manifest["defaults"]["fusion"]["rrf_k"] = 60  # a field cc does not have
    (index_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexOpenError, match=r"manifest.json: malformed manifest .*fusion.rrf_k: not a field of cc fusion"):
        open_index(index_copy)


def test_failed_build_leaves_existing_index_untouched_and_no_temp_dirs(index_copy, tmp_path):
    before = (index_copy / "manifest.json").read_text()
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"_id": "x", "text": "fine"}, {"_id": "x", "text": "dup"}])
    with pytest.raises(CorpusError, match="bad.jsonl:2: duplicate id"):
        build_index(bad, index_copy, BuildOptions(progress=False))
    assert (index_copy / "manifest.json").read_text() == before
    assert sorted(p.name for p in index_copy.parent.iterdir()) == sorted(["copy", "bad.jsonl"])


def test_rebuild_replaces_index_in_place(index_copy, tmp_path):
    corpus = write_jsonl(tmp_path / "small.jsonl", TINY_CORPUS[:2])
    build_index(corpus, index_copy, BuildOptions(progress=False))
    assert open_index(index_copy).num_docs == 2
    assert not [p for p in index_copy.parent.iterdir() if p.name.startswith(".")]


def test_refuses_to_replace_a_folder_that_is_not_an_index(tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "thesis.txt").write_text("years of work")
    corpus = write_jsonl(tmp_path / "c.jsonl", TINY_CORPUS[:2])
    with pytest.raises(HybridError, match="is not an index: refusing to replace it"):
        build_index(corpus, tmp_path / "precious", BuildOptions(progress=False))
    assert (tmp_path / "precious" / "thesis.txt").read_text() == "years of work"


def test_an_sq8_index_keeps_codes_and_serves_the_flat_rankings(tiny_index, tmp_path):
    # the same documents built with 8-bit codes: dense.faiss a quarter of flat's vector bytes, and every dense and
    # hybrid search rescored from the stored vectors to the flat index's ranking
    from hybrid_retrieval.search.dense import FaissParams

    corpus = write_jsonl(tmp_path / "corpus.jsonl", TINY_CORPUS)
    build_index(corpus, tmp_path / "sq8", BuildOptions(faiss=FaissParams(kind="sq8"), progress=False))
    flat, sq8 = open_index(tiny_index), open_index(tmp_path / "sq8")
    assert sq8.manifest.faiss.factory == "SQ8"
    n, dimension = flat.embeddings.shape
    # a byte a dimension a document, plus the quantizer's range (two float32 a dimension) and a header
    assert (tmp_path / "sq8" / store.FAISS_FILE).stat().st_size <= n * dimension + 2 * 4 * dimension + 256
    for query in ["cat", "stock markets", "healthy pets and exercise"]:
        for mode in ("dense", "hybrid"):
            a = flat.pipeline().search(query, 5, {"mode": mode}).ranking
            b = sq8.pipeline().search(query, 5, {"mode": mode}).ranking
            assert a.doc_idx.tolist() == b.doc_idx.tolist()
            np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5)


@pytest.mark.parametrize(("kind", "second_copy"), [("flat", False), ("hnsw", False), ("sq8", True), ("ivf", True)])
def test_the_vectors_are_stored_once_at_full_precision(tmp_path, kind, second_copy):
    """A flat or hnsw index holds the vectors whole: the folder keeps no embeddings.npy beside it. Every other kind
    keeps them there (compressed codes, or vectors in cluster order), and the index reads the same vectors either way."""
    from hybrid_retrieval.indexer.build import build_into
    from hybrid_retrieval.indexer.representation import VectorSource
    from hybrid_retrieval.models.embedder import no_model_spec
    from hybrid_retrieval.search.dense import FaissParams

    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"_id": f"d{i}", "text": f"word{i} common"} for i in range(200)])
    vectors = np.random.default_rng(0).standard_normal((200, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    options = BuildOptions(backend="none", faiss=FaissParams(kind=kind, nlist=2), progress=False)
    (tmp_path / "index").mkdir()
    manifest = build_into(tmp_path / "index", corpus, options, None, no_model_spec(8), vectors=VectorSource(documents=vectors))
    assert ("embeddings.npy" in manifest.files) == second_copy == (tmp_path / "index" / "embeddings.npy").exists()
    np.testing.assert_array_equal(store.stored_vectors(tmp_path / "index"), vectors)
    np.testing.assert_array_equal(open_index(tmp_path / "index").embeddings, vectors)
