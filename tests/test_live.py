"""Live writes: after any sequence of upserts and deletes, every mode ranks exactly like a fresh build of the
same documents; the write-ahead log survives a reopen and a torn tail."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hybrid_retrieval.common.errors import HybridError, SpecError
from hybrid_retrieval.common.publish import publish_dir
from hybrid_retrieval.indexer import build_process, wal
from hybrid_retrieval.indexer.build import BuildOptions, build_index
from hybrid_retrieval.indexer.hubness import fit_hubness
from hybrid_retrieval.indexer.live.collection import Collection
from hybrid_retrieval.indexer.live.fence import Closed
from hybrid_retrieval.indexer.live.log import LIVE_DIR, WAL_FILE
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.indexer.wal import WriteAheadLog
from hybrid_retrieval.search.analyzer import Analyzer
from hybrid_retrieval.search.hubness import HubnessParams
from tests.conftest import write_jsonl

WORDS = (
    "cat dog mat bark market stock investor qubit quantum health running heart care pet mailman warm computation sold fell daily chase"
).split()
BASE = [
    {
        "_id": f"b{i}",
        "title": WORDS[i].title(),
        "text": " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + i)),
        "metadata": {"year": 2000 + i, "journal": ["Nature", "Cell"][i % 2]},
    }
    for i in range(8)
]
QUERIES = ["cat on a mat", "quantum stock market", "daily health of pets", "dog"]
SPECS = {
    "bm25": {"mode": "bm25"},
    "dense": {"mode": "dense"},
    "rrf": {},
    "cc": {"fusion": {"method": "cc", "norm": "minmax"}},
    "cc-dbsf": {"fusion": {"method": "cc", "norm": "dbsf", "alpha": 0.5}},
    "cc+filter": {"fusion": {"method": "cc", "norm": "zscore", "alpha": 0.3}, "filter": {"year": {"gte": 2003}}},
}
# The base carries a fitted correction (both banks kept): written documents get biases from the same banks.
BANK = ["cat", "stock market news", "heart health care", "quantum computation", "pet dog running", "daily investor"]
HUBNESS_PARAMS = HubnessParams(beta=20.0, beta1=0.5, beta2=3.0, k=2)
HUBNESS_SPECS = {
    "qbnorm": {"mode": "dense", "hubness": {"method": "qbnorm"}},
    "dbnorm-dis": {"mode": "dense", "hubness": {"method": "dbnorm", "dynamic": True}},
    "cc-tmm+qbnorm-dis": {"fusion": {"method": "cc", "norm": "tmm", "alpha": 0.6}, "hubness": {"method": "qbnorm", "dynamic": True}},
    "rrf+dbnorm": {"hubness": {"method": "dbnorm"}},
    "dbnorm-dis+filter": {"mode": "dense", "hubness": {"method": "dbnorm", "dynamic": True}, "filter": {"year": {"lt": 2004}}},
}

texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join)
upsert = st.tuples(
    st.just("upsert"), st.sampled_from([d["_id"] for d in BASE] + [f"n{i}" for i in range(6)]), texts, st.integers(1995, 2010)
)
delete = st.tuples(st.just("delete"), st.sampled_from([d["_id"] for d in BASE] + [f"n{i}" for i in range(6)]))
operations = st.lists(st.one_of(upsert, delete), min_size=1, max_size=8)


@pytest.fixture(scope="module")
def base_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("live-base")
    build_index(write_jsonl(root / "corpus.jsonl", BASE), root / "index", BuildOptions(progress=False))
    index = open_index(root / "index")
    fit_hubness(index, BANK, {"kind": "query log", "size": len(BANK)}, HUBNESS_PARAMS, gallery_size=4)
    index.close()
    return root / "index"


def ranked(pipeline, query: str, spec: dict, ids) -> dict[str, float]:
    result = pipeline.search(query, k=50, spec=spec)
    return {ids(int(i)): float(s) for i, s in zip(result.ranking.doc_idx, result.ranking.scores)}


def has_ties(scores: dict[str, float]) -> bool:
    return len(set(np.round(list(scores.values()), 5))) < len(scores)


def assert_rankings_match(live: dict[str, float], fresh: dict[str, float]) -> None:
    assert set(live) == set(fresh)
    for doc_id, score in fresh.items():
        assert live[doc_id] == pytest.approx(score, abs=1e-4), doc_id
    order_live = sorted(live, key=lambda d: (-round(live[d], 4), d))
    order_fresh = sorted(fresh, key=lambda d: (-round(fresh[d], 4), d))
    assert order_live == order_fresh


# Every example builds an index (about 2 s): the default suite runs these sequences (a base document replaced, new
# ones written, base and written documents deleted, one id deleted then written again) ...
@pytest.mark.parametrize(
    "ops",
    [
        [("upsert", "b1", "quantum cat market", 2004), ("upsert", "n0", "pet dog running", 1999), ("delete", "b3")],
        [("upsert", "n1", "stock investor", 2008), ("delete", "n1"), ("delete", "b0"), ("upsert", "b0", "heart care daily", 2002)],
    ],
)
def test_rankings_after_these_writes_equal_a_fresh_build(base_index, tmp_path, ops):
    check_against_fresh_build(base_index, tmp_path, ops)


# ... and the slow suite 25 generated ones. No shrinking: the failing example is printed as generated.
@pytest.mark.slow
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(operations)
def test_rankings_after_writes_equal_a_fresh_build(base_index, ops):
    with tempfile.TemporaryDirectory() as tmp:  # each example's two indexes are removed at once (they hold the model)
        check_against_fresh_build(base_index, Path(tmp), ops)


def check_against_fresh_build(base_index, root, ops):
    shutil.copytree(base_index, root / "index")
    base = open_index(root / "index")
    collection = Collection(base)
    documents = {d["_id"]: d for d in BASE}
    for op in ops:
        if op[0] == "upsert":
            _, doc_id, text, year = op
            doc = {"id": doc_id, "title": "", "text": text, "metadata": {"year": year, "journal": "Cell"}}
            collection.upsert([doc])
            documents[doc_id] = {"_id": doc_id, "title": "", "text": text, "metadata": doc["metadata"]}
        else:
            collection.delete([op[1]])
            documents.pop(op[1], None)
    if not documents:
        return
    snapshot = collection.refresh()
    build_index(write_jsonl(root / "fresh.jsonl", list(documents.values())), root / "fresh", BuildOptions(progress=False))
    banks = base.hubness.banks
    fit_hubness(
        open_index(root / "fresh", embedder=base.embedder),
        BANK,
        {"kind": "query log", "size": len(BANK)},
        HUBNESS_PARAMS,
        bank=banks.query,
        gallery=(banks.gallery, banks.gallery_ids),
    )  # a fresh fit, same banks
    fresh = open_index(root / "fresh", embedder=base.embedder)  # the same model: one ONNX session for both
    assert snapshot.documents == len(documents)
    # Identical texts make identical vectors: which of them is a bank member's top-k (so activated) is a tie.
    specs = SPECS if has_duplicates(documents) else {**SPECS, **HUBNESS_SPECS}
    compare(snapshot, fresh, specs)
    compacted = collection.compact()
    compare(compacted, fresh, specs)  # and after merging everything into a new base (with the correction)
    stored = {doc["id"]: doc for doc in map(compacted.index.docs.get, range(compacted.index.num_docs))}
    assert stored == {i: {"id": i, "title": d["title"], "text": d["text"], "metadata": d["metadata"]} for i, d in documents.items()}
    collection.close()


def has_duplicates(documents: dict) -> bool:
    texts = [(d["title"], d["text"]) for d in documents.values()]
    return len(set(texts)) < len(texts)


def compare(snapshot, fresh, specs: dict) -> None:
    live_pipeline, fresh_pipeline = snapshot.pipeline(), fresh.pipeline()
    for query in QUERIES:
        legs_tie = any(has_ties(ranked(fresh_pipeline, query, {"mode": mode}, lambda i: fresh.doc_ids[i])) for mode in ("bm25", "dense"))
        for name, spec in specs.items():
            if name.startswith("rrf") and legs_tie:
                continue  # RRF gives tied documents different ranks, in the order ties are broken in, which differs
            live = ranked(live_pipeline, query, spec, lambda i: snapshot.document(i)["id"])
            expected = ranked(fresh_pipeline, query, spec, lambda i: fresh.doc_ids[i])
            assert_rankings_match(live, expected)


def test_the_log_is_replayed_on_open_and_a_torn_tail_is_cut(base_index, tmp_path):
    shutil.copytree(base_index, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index"))
    first = collection.upsert([{"id": "n1", "text": "quantum cat", "metadata": {"year": 2020}}])
    second = collection.delete(["b0"])
    assert (first, second) == (1, 2)
    collection.close()
    wal = tmp_path / "index" / LIVE_DIR / WAL_FILE
    with wal.open("ab") as fh:
        fh.write(b"\x40\x00\x00\x00garbage")  # a torn record: a crash in the middle of an append
    reopened = Collection(open_index(tmp_path / "index"))
    assert reopened.seq == 2 and reopened.get("n1")["text"] == "quantum cat" and reopened.get("b0") is None
    assert reopened.view.documents == len(BASE)  # 8 - b0 + n1
    third = reopened.upsert([{"id": "n2", "text": "dog"}])
    assert third == 3
    reopened.close()
    assert Collection(open_index(tmp_path / "index")).get("n2")["text"] == "dog"


@pytest.mark.parametrize(
    "documents, field",
    [
        ([{"id": "x", "title": "no text"}], "documents[0].text"),
        ([{"id": "x" * 513, "text": "long id"}], "documents[0].id"),
        ([{"id": "a", "text": "one"}, {"id": "a", "text": "two"}], "documents[1].id"),
        ([{"id": "a", "text": "t", "metadata": {"year": "recent"}}], "documents[0].metadata.year"),
        ([{"id": "a", "text": "t", "metadata": {"tags": [1, 2]}}], "documents[0].metadata.tags"),
        ([{"id": "a", "text": "t", "year": "recent"}], "documents[0].metadata.year"),  # a top-level field is metadata
        ([{"id": "a", "_id": "b", "text": "t"}], "documents[0]._id"),
    ],
)
def test_a_bad_document_rejects_the_whole_batch(base_index, tmp_path, documents, field):
    shutil.copytree(base_index, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index"), max_batch_docs=3)
    with pytest.raises(SpecError) as error:
        collection.upsert([{"id": "ok", "text": "fine"}, *documents])  # a good document first: it must not be applied
    assert error.value.field == re.sub(r"\[(\d+)\]", lambda m: f"[{int(m.group(1)) + 1}]", field, count=1)
    assert collection.seq == 0 and collection.get("ok") is None and collection.get("a") is None
    with pytest.raises(SpecError, match="at most 3 documents"):
        collection.upsert([{"id": str(i), "text": "t"} for i in range(4)])


def test_compaction_keeps_rankings_and_writes_logged_meanwhile(base_index, tmp_path):
    shutil.copytree(base_index, tmp_path / "index")
    base = open_index(tmp_path / "index")
    collection = Collection(base)
    collection.upsert(
        [
            {"id": "n1", "text": "quantum cat market", "metadata": {"year": 2021, "journal": "Cell"}},
            {"id": "b2", "text": "replaced body about dogs", "metadata": {"year": 1999}},
        ]
    )
    collection.delete(["b0", "b5"])
    before = collection.refresh().pipeline()
    ranked_before = {q: ranked(before, q, {}, lambda i: collection.view.document(i)["id"]) for q in QUERIES}
    after = collection.compact()
    assert not after.changed and after.index.num_docs == len(BASE) - 1 and after.index.manifest.applied_sequence == 2
    for query in QUERIES:
        assert_rankings_match(ranked(after.pipeline(), query, {}, lambda i: after.document(i)["id"]), ranked_before[query])
    collection.upsert([{"id": "n2", "text": "pet health"}])  # after the compaction: in the log, on top of the new base
    collection.close()
    reopened = Collection(open_index(tmp_path / "index", embedder=base.embedder))
    assert reopened.seq == 3 and reopened.get("n2")["text"] == "pet health" and reopened.get("b0") is None
    assert reopened.view.documents == len(BASE) and len(reopened.view.live) == 1
    assert [r["seq"] for r in WriteAheadLog.replay(tmp_path / "index" / LIVE_DIR / WAL_FILE)] == [3]
    reopened.close()


def test_a_compaction_removes_what_killed_ones_left_before_the_next_may_start(base_index, tmp_path, monkeypatch):
    """Leftovers are removed under the compaction lock: a compaction waiting for it makes its scratch folder before
    locking it, so a sweep running after the lock is released could take that folder for a killed one's."""
    from hybrid_retrieval.indexer.live import compactor

    shutil.copytree(base_index, tmp_path / "index")
    killed = tmp_path / ".index.compact-killed"  # what a killed compaction leaves: a sibling nobody holds
    killed.mkdir()
    collection = Collection(open_index(tmp_path / "index"))
    held = []
    sweep = compactor.remove_leftovers
    monkeypatch.setattr(compactor, "remove_leftovers", lambda path: held.append(collection.compactor.lock.locked()) or sweep(path))
    collection.upsert([{"id": "n1", "text": "quantum cat market"}])
    collection.compact()
    assert held == [True] and not killed.exists()
    collection.close()


def _compacted_files(base_index: Path, folder: Path) -> dict:
    """The checksums of the files of a compaction of these writes on a copy of `base_index` at `folder`."""
    shutil.copytree(base_index, folder)
    collection = Collection(open_index(folder))
    collection.upsert([{"id": "n1", "text": "quantum cat market", "metadata": {"year": 2021, "journal": "Cell"}}])
    collection.upsert([{"id": "b2", "text": "replaced body about dogs", "metadata": {"year": 1999}}, {"id": "n3", "text": "pets"}])
    collection.delete(["b0", "b5"])
    files = collection.compact().index.manifest.files
    collection.close()
    return {re.sub(r"^hubness-[^/]+/", "hubness/", name): entry["sha256"] for name, entry in files.items()}  # a time in the name


@pytest.mark.process
def test_a_compaction_built_in_a_child_process_writes_the_same_base(base_index, tmp_path, monkeypatch):
    """A large collection's compaction builds in a niced child process (indexer.build_process): byte for byte the base
    an in-process build writes, hubness correction and all."""
    in_process = _compacted_files(base_index, tmp_path / "here")
    children = []
    popen = build_process.subprocess.Popen
    monkeypatch.setattr(build_process, "CHILD_ABOVE", 0)
    monkeypatch.setattr(build_process.subprocess, "Popen", lambda *a, **k: children.append(popen(*a, **k)) or children[-1])
    in_child = _compacted_files(base_index, tmp_path / "child")
    assert len(children) == 1 and children[0].returncode == 0
    assert in_child == in_process and "hubness/bank_query.npy" in in_child


@pytest.mark.process
def test_a_child_build_is_killed_when_its_checkpoint_stops_it(base_index, tmp_path, monkeypatch):
    """A collection closed while its compaction builds in a child process: the parent's next poll stops the build and
    kills the child, and the folder gets nothing more."""
    children = []
    popen = build_process.subprocess.Popen
    monkeypatch.setattr(build_process.subprocess, "Popen", lambda *a, **k: children.append(popen(*a, **k)) or children[-1])
    (tmp_path / "work").mkdir()
    (tmp_path / "new").mkdir()
    np.save(tmp_path / "vectors.npy", np.zeros((1, 4), np.float32))

    def closed() -> None:
        raise Closed("collection 'x' was dropped")

    with pytest.raises(Closed, match="dropped"):
        build_process.build_given(
            tmp_path / "new", base_index / "docs.jsonl", BuildOptions(), None, {}, tmp_path / "vectors.npy",
            work=tmp_path / "work", documents=build_process.CHILD_ABOVE, checkpoint=closed,
        )  # fmt: skip
    assert children[0].returncode == -signal.SIGKILL and list((tmp_path / "new").iterdir()) == []


@pytest.mark.process
def test_a_failed_child_build_says_why(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "new").mkdir()
    np.save(tmp_path / "vectors.npy", np.zeros((1, 4), np.float32))
    with pytest.raises(HybridError, match=r"the build process failed \(exit code 1\): .*missing\.jsonl"):
        build_process.build_given(
            tmp_path / "new", tmp_path / "missing.jsonl", BuildOptions(), None, {}, tmp_path / "vectors.npy",
            work=tmp_path / "work", documents=build_process.CHILD_ABOVE,
        )  # fmt: skip


def _compact_in_background(collection: Collection) -> tuple[threading.Thread, list]:
    """A started thread compacting `collection`, and the list that receives its manifest or its HybridError."""
    outcome: list = []

    def compact():
        try:
            outcome.append(collection.compact())
        except HybridError as exc:
            outcome.append(exc)

    compaction = threading.Thread(target=compact)
    compaction.start()
    return compaction, outcome


def test_a_compaction_overtaken_by_close_publishes_nothing(base_index, tmp_path):
    """A drop or a restore closes the collection while its compaction builds: the compaction ends without swapping
    its folder in (the folder is about to be removed or replaced), and close returns only once it has ended."""
    shutil.copytree(base_index, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index"))
    collection.upsert([{"id": "n1", "text": "quantum cat market"}])
    manifest = (tmp_path / "index" / "manifest.json").read_bytes()
    building, go_on = threading.Event(), threading.Event()
    collection.on_compact = lambda *_: (building.set(), go_on.wait(30))
    compaction, outcome = _compact_in_background(collection)
    assert building.wait(30)
    closing = threading.Thread(target=collection.close, args=("collection 'x' was dropped",))
    closing.start()
    closing.join(0.5)
    assert closing.is_alive()  # close waits for the compaction
    go_on.set()
    compaction.join(30)
    closing.join(30)
    assert not closing.is_alive() and isinstance(outcome[0], HybridError) and "dropped" in str(outcome[0])
    assert (tmp_path / "index" / "manifest.json").read_bytes() == manifest  # the old base stays, with its log
    assert [r["seq"] for r in WriteAheadLog.replay(tmp_path / "index" / LIVE_DIR / WAL_FILE)] == [1]
    with pytest.raises(HybridError, match="dropped"):
        collection.compact()


def test_a_compaction_stops_at_its_next_stage_once_its_collection_closes(base_index, tmp_path, monkeypatch):
    """A drop during a long compaction should not wait for a base nobody will take: the build stops after the stage
    it is in (here its BM25 index), before the dense index and the rest are built."""
    from hybrid_retrieval.indexer import build

    shutil.copytree(base_index, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index"))
    collection.upsert([{"id": "n1", "text": "quantum cat market"}])
    manifest = (tmp_path / "index" / "manifest.json").read_bytes()
    building, later_stages = threading.Event(), []
    real_bm25 = build.BM25Index.from_postings

    def bm25_until_closed(*args, **kwargs):
        building.set()
        deadline = time.monotonic() + 30
        while collection.writer.closed is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return real_bm25(*args, **kwargs)

    monkeypatch.setattr(build.BM25Index, "from_postings", bm25_until_closed)
    monkeypatch.setattr(build, "trained_index", lambda *a, **k: later_stages.append("faiss"))
    collection.on_compact = lambda *_: later_stages.append("on_compact")
    compaction, outcome = _compact_in_background(collection)
    assert building.wait(30)
    collection.close("collection 'x' was dropped")  # returns once the compaction has stopped
    compaction.join(30)
    assert isinstance(outcome[0], HybridError) and "dropped" in str(outcome[0]) and later_stages == []
    assert (tmp_path / "index" / "manifest.json").read_bytes() == manifest
    assert sorted(p.name for p in tmp_path.joinpath("index").parent.iterdir()) == ["index"]  # no build folder left


def test_writes_logged_during_a_compaction_are_not_analysed_again_on_the_new_base(base_index, tmp_path, monkeypatch):
    """The documents written while a compaction built were analysed when written: the new base takes their terms and
    records as they are, and ranks as a reopen (which analyses the log) does."""
    shutil.copytree(base_index, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index"))
    collection.upsert([{"id": "n1", "text": "quantum cat market"}])
    analysed: list[str] = []

    def write_while_building(*_) -> None:
        collection.upsert([{"id": "q", "text": "a quokka market"}, {"id": "n1", "text": "quantum dog market again"}])
        tokens = Analyzer.tokens
        monkeypatch.setattr(Analyzer, "tokens", lambda self, text: analysed.append(text) or tokens(self, text))
        # nor read back from the log: the writer kept the records it applied since the compaction froze the state
        monkeypatch.setattr(WriteAheadLog, "replay", lambda path: pytest.fail("the log was read back"))

    collection.on_compact = write_while_building
    compacted = collection.compact()
    assert analysed == [] and len(compacted.live) == 2 and compacted.index.num_docs == len(BASE) + 1
    monkeypatch.undo()
    collection.close()
    reopened = Collection(open_index(tmp_path / "index"))
    for query in [*QUERIES, "quokka market", "quantum dog"]:
        ids = lambda view: lambda i: view.document(i)["id"]
        assert ranked(compacted.pipeline(), query, {}, ids(compacted)) == ranked(reopened.view.pipeline(), query, {}, ids(reopened.view))
    reopened.close()


def test_writes_logged_during_a_compaction_apply_to_the_new_base_whatever_it_holds(base_index, tmp_path):
    """A field whose last value was deleted stays decided in the compacted base: a write checked against that type
    while the compaction built applies on top of it, and a reopen replays it."""
    shutil.copytree(base_index, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index"))
    collection.upsert([{"id": "p", "text": "a pangolin", "metadata": {"x": 1.5}}])
    collection.delete(["p", "b0"])
    writes = []
    collection.on_compact = lambda *_: (
        writes
        or writes.append(
            collection.upsert([{"id": "q", "text": "a quokka", "metadata": {"x": 1}}, {"id": "r", "text": "a rat", "metadata": {"x": 2.5}}])
        )
    )
    compacted = collection.compact()
    assert writes == [3] and compacted.index.manifest.metadata["x"].type == "float"
    assert collection.get("q")["metadata"] == {"x": 1} and collection.upsert([{"id": "s", "text": "a seal"}]) == 4
    collection.close()
    reopened = Collection(open_index(tmp_path / "index"))
    assert reopened.seq == 4 and [reopened.get(i) is not None for i in ("p", "b0", "q", "r", "s")] == [False, False, True, True, True]
    reopened.close()


def test_a_write_logged_but_not_applied_stops_writes_instead_of_reusing_its_number(base_index, tmp_path, monkeypatch):
    shutil.copytree(base_index, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index"))
    state = collection.writer.state
    apply = state.apply

    def fails_once(*args):
        monkeypatch.setattr(state, "apply", apply)
        raise MemoryError("no room to apply it")

    monkeypatch.setattr(state, "apply", fails_once)
    with pytest.raises(MemoryError):
        collection.upsert([{"id": "n1", "text": "quantum cat"}])
    with pytest.raises(HybridError, match="write 1 was logged but could not be applied"):
        collection.upsert([{"id": "n2", "text": "pet health"}])
    collection.close()
    reopened = Collection(open_index(tmp_path / "index"))  # the logged write applies on the next open
    assert reopened.seq == 1 and reopened.get("n1")["text"] == "quantum cat" and reopened.get("n2") is None
    reopened.close()


def publish_in_place(folder: Path, source: Path) -> None:
    """What a snapshot restore, a reembed or a rebuild in place does to a served folder: another one takes its path."""
    with publish_dir(folder) as staged:
        shutil.copytree(source, staged, dirs_exist_ok=True)


@pytest.fixture
def restored(base_index, tmp_path) -> Path:
    """A copy of the base with one write of its own in its log (r1, sequence 1)."""
    shutil.copytree(base_index, tmp_path / "restored")
    other = Collection(open_index(tmp_path / "restored"))
    other.upsert([{"id": "r1", "text": "restored cat"}])
    other.close()
    return tmp_path / "restored"


@pytest.mark.parametrize("written_before", [False, True], ids=["log-not-open-yet", "log-open"])
def test_writes_stop_once_another_process_publishes_a_folder_in_place(base_index, restored, tmp_path, written_before):
    """Whether or not the collection opened its log yet, a write after the swap would be numbered against the
    documents it loaded and land in the new folder's log (or in the gone folder's): refused until a reload instead,
    and the new folder stays as it was published."""
    shutil.copytree(base_index, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index"))
    if written_before:
        assert collection.upsert([{"id": "n1", "text": "quantum cat"}]) == 1
    publish_in_place(tmp_path / "index", restored)
    with pytest.raises(Closed, match="was replaced by another process .* reload the collection"):
        collection.upsert([{"id": "n2", "text": "pet health"}])
    with pytest.raises(Closed, match="was replaced"):
        collection.delete(["b1"])
    with pytest.raises(HybridError, match="was replaced"), collection.frozen():  # a snapshot would mix the two folders
        pass
    assert collection.get("n2") is None and collection.get("r1") is None
    collection.close()
    reopened = Collection(open_index(tmp_path / "index"))
    assert reopened.seq == 1 and reopened.get("r1") is not None and reopened.get("n1") is None and reopened.get("n2") is None
    reopened.close()


def test_a_write_logged_as_its_folder_is_replaced_is_not_acknowledged(base_index, restored, tmp_path):
    """The swap falls between the check and the append: the record went into the replaced folder's log, gone with it."""
    shutil.copytree(base_index, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index"))
    collection.upsert([{"id": "n1", "text": "quantum cat"}])
    append = collection.writer.wal.append

    def swapped_first(record):
        publish_in_place(tmp_path / "index", restored)
        append(record)

    collection.writer.wal.append = swapped_first
    with pytest.raises(Closed, match="was replaced"):
        collection.upsert([{"id": "n2", "text": "pet health"}])
    assert collection.get("n2") is None and collection.seq == 1
    collection.close()


@pytest.mark.parametrize("when", ["before", "while-it-builds"])
def test_a_compaction_never_publishes_over_a_folder_another_process_published(base_index, restored, tmp_path, monkeypatch, when):
    from hybrid_retrieval.indexer.live import compactor as live

    shutil.copytree(base_index, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index"))
    collection.upsert([{"id": "n1", "text": "quantum cat"}])
    if when == "before":
        publish_in_place(tmp_path / "index", restored)
    else:
        build = live.build_compacted

        def replaced_meanwhile(*args, **kwargs):
            publish_in_place(tmp_path / "index", restored)
            build(*args, **kwargs)

        monkeypatch.setattr(live, "build_compacted", replaced_meanwhile)
    with pytest.raises(Closed, match="was replaced"):
        collection.compact()
    with pytest.raises(HybridError, match="was replaced"):  # nor do settings changes go into its manifest
        collection.update_manifest(lambda manifest: manifest.overrides.update({"k": 3}))
    collection.close()
    reopened = Collection(open_index(tmp_path / "index"))
    assert reopened.get("r1") is not None and reopened.get("n1") is None and reopened.index.manifest.overrides == {}
    reopened.close()


def test_writes_go_on_after_a_compaction_that_could_not_open_its_own_new_base(base_index, tmp_path, monkeypatch):
    """The swap published the compacted base; opening it failed. The folder is the collection's own, and its log the
    one the collection holds (linked into it): writes go on, and a reopen holds them all."""
    from hybrid_retrieval.indexer.live import compactor as live

    shutil.copytree(base_index, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index"))
    collection.upsert([{"id": "n1", "text": "quantum cat"}])
    reopen = live.reopen

    def fails_once(index):
        monkeypatch.setattr(live, "reopen", reopen)
        raise MemoryError("no room for a second base")

    monkeypatch.setattr(live, "reopen", fails_once)
    with pytest.raises(MemoryError):
        collection.compact()
    assert collection.upsert([{"id": "n2", "text": "pet health"}]) == 2
    collection.close()
    reopened = Collection(open_index(tmp_path / "index"))
    assert reopened.seq == 2 and reopened.get("n1") is not None and reopened.get("n2")["text"] == "pet health"
    reopened.close()


def test_a_log_that_cannot_be_shortened_after_a_compaction_keeps_every_write(base_index, tmp_path, monkeypatch):
    """The disk fills as a compaction shortens the log: the new base serves, the next write opens the log as it is,
    and a reopen replays only what the base does not hold."""
    shutil.copytree(base_index, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index"))
    collection.upsert([{"id": "n1", "text": "quantum cat market"}])
    write_records = wal._write_records

    def full_disk_once(path, records):
        monkeypatch.setattr(wal, "_write_records", write_records)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(wal, "_write_records", full_disk_once)
    compacted = collection.compact()
    assert compacted.index.manifest.applied_sequence == 1 and "shortened" in collection.storage_problem()
    assert collection.upsert([{"id": "n2", "text": "pet health"}]) == 2 and collection.storage_problem() is None
    collection.close()
    reopened = Collection(open_index(tmp_path / "index"))
    assert reopened.seq == 2 and reopened.get("n1") is not None and reopened.get("n2")["text"] == "pet health"
    assert reopened.view.documents == len(BASE) + 2
    reopened.close()


def test_a_correction_fitted_without_banks_is_not_extended_and_compaction_drops_it(base_index, tmp_path):
    shutil.copytree(base_index, tmp_path / "index")
    base = open_index(tmp_path / "index")
    base.hubness.banks = None  # as loaded from a fit made before fits kept their banks
    collection = Collection(base)
    assert len(collection.view.pipeline().search("cat", spec={"mode": "dense", "hubness": {"method": "qbnorm"}}).ranking)
    collection.upsert([{"id": "n1", "text": "quantum cat"}])
    with pytest.raises(SpecError, match="refit it with `hybrid hubness fit`"):
        collection.refresh().pipeline().search("cat", spec={"mode": "dense", "hubness": {"method": "qbnorm"}})
    compacted = collection.compact()
    assert compacted.index.manifest.hubness is None and compacted.index.hubness is None
    assert not any(name.startswith("hubness-") for name in compacted.index.manifest.files)
    collection.close()


def test_compaction_carries_a_correction_with_banks(base_index, tmp_path):
    shutil.copytree(base_index, tmp_path / "index")
    collection = Collection(open_index(tmp_path / "index"))
    old, old_gallery = collection.index.manifest.hubness, collection.index.hubness.banks.gallery_ids
    collection.upsert([{"id": "n1", "text": "quantum cat"}])
    collection.delete(["b1"])
    new_index = collection.compact().index
    hubness = new_index.manifest.hubness
    assert hubness.folder != old.folder and hubness.params == old.params and hubness.bank == old.bank
    assert not (tmp_path / "index" / old.folder).exists()
    assert new_index.hubness.banks.gallery_ids == old_gallery
    assert len(new_index.hubness.correction.lse["qbnorm_query"]) == len(BASE)  # 8 - b1 + n1
    collection.close()


def test_writes_embed_on_fewer_cores_while_searches_run(base_index, tmp_path):
    shutil.copytree(base_index, tmp_path / "index")
    base = open_index(tmp_path / "index")
    searching = [False]
    collection = Collection(base, searching=lambda: searching[0])
    collection.upsert([{"id": "n1", "text": "quantum cat"}])
    assert collection.writer.embed.limited is None  # idle: the index's own session, all cores
    searching[0] = True
    collection.upsert([{"id": "n2", "text": "quantum cat"}])
    threads = collection.writer.embed.limited._session.get_session_options().intra_op_num_threads
    assert threads == max(1, len(os.sched_getaffinity(0)) // 2)
    vectors = collection.refresh().live.vectors
    np.testing.assert_allclose(vectors[1], vectors[0], atol=1e-5)  # the same model either way
    collection.close()


def test_documents_embedded_in_int8_stay_int8_through_writes_and_compaction(tmp_path):
    """`hybrid index --precision int8`: built and written documents get the int8 graph's vectors, queries share it."""
    from hybrid_retrieval.common.errors import ConfigError
    from hybrid_retrieval.indexer.corpus import indexed_text
    from hybrid_retrieval.indexer.store import MODEL_DIR
    from hybrid_retrieval.models.embedder import OnnxEmbedder
    from tests.conftest import TINY_CORPUS

    corpus = write_jsonl(tmp_path / "corpus.jsonl", TINY_CORPUS)
    build_index(corpus, tmp_path / "index", BuildOptions(progress=False, precision="int8"))
    index = open_index(tmp_path / "index", device="cpu")
    int8 = OnnxEmbedder(tmp_path / "index" / MODEL_DIR, device="cpu", precision="int8")
    texts = [indexed_text(d.get("title", ""), d["text"]) for d in TINY_CORPUS]
    assert index.manifest.embedder.document_precision == "int8"
    np.testing.assert_allclose(index.embeddings, int8.encode(texts), atol=1e-5)
    assert index.query_precision == "int8" and index.query_embedder is index.embedder  # auto on CPU: one session
    collection = Collection(index)
    collection.upsert([{"id": "n1", "text": "quantum cat"}])
    np.testing.assert_allclose(collection.refresh().live.vectors[0], int8.encode(["quantum cat"])[0], atol=1e-5)
    collection.compact()
    compacted = collection.view.index
    assert compacted.manifest.embedder.document_precision == "int8" and compacted.query_precision == "int8"
    np.testing.assert_allclose(compacted.embeddings[-1], int8.encode(["quantum cat"])[0], atol=1e-5)
    collection.close()
    with pytest.raises(ConfigError, match="int8 document embedding needs the onnx backend"):
        BuildOptions(backend="torch", precision="int8")
    with pytest.raises(ConfigError, match="valid: fp32, int8"):
        BuildOptions(precision="fp16")
