from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hybrid_retrieval.engine import serving

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The fast tier (`scripts/test.sh --fast`) starts no service, runs the package in no other process and trains no
# model: a default test that starts the service (as a process, or in this one) carries the `server` mark, one that
# runs Python in another process (a `hybrid` command, a build to kill, a second writer: each loads its own model) the
# `process` mark, one that trains or exports a model the `training` mark. The guards below hold every test to the
# first two (tests the fast tier never runs may do anything), so the tier stays fast.
_running: list[pytest.Item] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _running[:] = [item]  # before its fixtures: a module's server fixture starts in its first test's setup


NEVER_FAST = ("server", "process", "training", "slow", "crash", "docker", "gpu")  # marks the fast tier deselects


def _refuse_unmarked(what: str, mark: str) -> None:
    item = _running[0] if _running else None
    if item is not None and not any(item.get_closest_marker(m) for m in NEVER_FAST):
        raise RuntimeError(f"{item.nodeid} starts {what}: mark it `{mark}` (pytest.mark.{mark}) so the fast tier leaves it out")


class _MarkedPopen(subprocess.Popen):
    """subprocess.Popen, refusing to start the service (or a command that serves) from a test not marked `server`,
    and Python or a `hybrid` command from one not marked `process`."""

    def __init__(self, args, *rest, **kwargs):
        words = [str(a) for a in (args if isinstance(args, (list, tuple)) else [args])]
        shown = " ".join(words)[:120]
        if any("hybrid_retrieval.app" in w or w.endswith("run.sh") or w == "serve" for w in words):
            _refuse_unmarked(f"a service process ({shown})", "server")
        elif words and (words[0] == sys.executable or Path(words[0]).name in ("hybrid", "python", "python3")):
            _refuse_unmarked(f"a Python process ({shown})", "process")
        super().__init__(args, *rest, **kwargs)


subprocess.Popen = _MarkedPopen  # type: ignore[misc]
_open_service = serving.Resources.__init__


def _marked_resources(self, *args, **kwargs):
    _refuse_unmarked("the service in process (create_app)", "server")
    _open_service(self, *args, **kwargs)


serving.Resources.__init__ = _marked_resources  # type: ignore[method-assign]

REPO = Path(__file__).resolve().parents[1]
BEIR_DATA = Path(os.environ.get("BEIR_DATA", REPO.parent / "shared" / "data" / "beir"))
SCIFACT = BEIR_DATA / "scifact"
SLICE_DOCS = 500
SHARDED_SLICE = 200  # documents of the sharded fixtures

TINY_CORPUS = [
    {"_id": "d1", "title": "Cats", "text": "The cat sat on the mat. Cats like warm mats."},
    {"_id": "d2", "title": "Dogs", "text": "Dogs chase cats and bark at the mailman."},
    {"_id": "d3", "title": "", "text": "Quantum computing uses qubits for computation."},
    {"_id": "d4", "title": "Stock markets", "text": "Markets fell as investors sold stocks."},
    {"_id": "d5", "title": "Running", "text": "Running every day improves cardiovascular health.", "lang": "en"},
    {"_id": "d6", "title": "Pets", "text": "A pet cat or a pet dog needs daily care."},
]


class LengthScorer:
    """A stand-in cross-encoder that scores a pair by the document's length: rerankings anyone can recompute."""

    max_length = 512

    def score(self, query, texts, batch_size=32):
        return self.score_pairs([(query, t) for t in texts])

    def score_pairs(self, pairs, batch_size=32):
        import numpy as np

        return np.array([len(t) / 100.0 for _, t in pairs], dtype=np.float32)


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="session")
def scifact() -> Path:
    if not (SCIFACT / "corpus.jsonl").is_file():
        pytest.skip(f"scifact not found under {BEIR_DATA} (set BEIR_DATA)")
    return SCIFACT


@pytest.fixture(scope="session")
def tiny_index(tmp_path_factory) -> Path:
    from hybrid_retrieval.indexer.build import BuildOptions, build_index

    root = tmp_path_factory.mktemp("tiny")
    corpus = write_jsonl(root / "corpus.jsonl", TINY_CORPUS)
    build_index(corpus, root / "index", BuildOptions(progress=False))
    return root / "index"


@pytest.fixture(scope="session")
def scifact_slice(scifact, tmp_path_factory) -> Path:
    """The first 500 scifact documents, as a JSONL corpus."""
    root = tmp_path_factory.mktemp("scifact-slice")
    with (scifact / "corpus.jsonl").open() as fh:
        (root / "corpus.jsonl").write_text("".join(itertools.islice(fh, SLICE_DOCS)))
    return root / "corpus.jsonl"


@pytest.fixture(scope="session")
def scifact_slice_index(scifact_slice, tmp_path_factory) -> Path:
    from hybrid_retrieval.indexer.build import BuildOptions, build_index

    out = tmp_path_factory.mktemp("scifact-index") / "index"
    build_index(scifact_slice, out, BuildOptions(precision="int8", progress=False))  # int8: twice as fast to embed
    return out


# boosts and sorts over with_metadata's fields, which sharded answers must give as the whole index's
STEERED_SPECS = [
    {"mode": "hybrid", "boosts": [{"field": "year", "modifier": "log1p", "weight": 0.3}, {"filter": {"tags": "b"}, "weight": 0.2}]},
    {"mode": "bm25", "sort": ["year:desc", "_score"]},
    {
        "mode": "hybrid",
        "boosts": [{"decay": "gauss", "field": "year", "origin": 2010, "scale": 5, "weight": 1}],
        "boost_mode": "product",
        "sort": ["tags", "_score"],
    },
]


def with_metadata(i: int, doc: dict) -> dict:
    return {**doc, "metadata": {"year": 1990 + i % 30, "tags": ["a", "b", "c"][: 1 + i % 3] if i % 4 else ["z"], "flag": i % 2 == 0}}


@pytest.fixture(scope="session")
def metadata_index(scifact, tmp_path_factory):
    """A scifact slice with metadata (and no hubness correction: split, its shards take writes)."""
    from hybrid_retrieval.indexer.build import BuildOptions, build_index

    root = tmp_path_factory.mktemp("metadata")
    with (scifact / "corpus.jsonl").open() as fh:
        docs = [with_metadata(i, json.loads(line)) for i, line in enumerate(itertools.islice(fh, SHARDED_SLICE))]
    build_index(write_jsonl(root / "corpus.jsonl", docs), root / "index", BuildOptions(precision="int8", progress=False))
    return root / "index"


@pytest.fixture(scope="session")
def whole_index(metadata_index, scifact, tmp_path_factory):
    """The scifact slice with metadata and a fitted hubness correction."""
    from hybrid_retrieval.indexer.hubness import fit_hubness
    from hybrid_retrieval.indexer.store import open_index
    from hybrid_retrieval.search.hubness import HubnessParams

    out = tmp_path_factory.mktemp("shards") / "index"
    shutil.copytree(metadata_index, out)
    fit_hubness(open_index(out), sample_queries(scifact, 40, 0), {"source": "test"}, HubnessParams(), gallery_size=40)
    return out


@pytest.fixture(scope="session")
def sharded_index(whole_index, tmp_path_factory):
    from hybrid_retrieval.indexer.shards.split import split_index

    out = tmp_path_factory.mktemp("sharded") / "index"
    split_index(whole_index, out, 3)
    return out


def sample_queries(scifact, count: int, skip: int) -> list[str]:
    with (scifact / "queries.jsonl").open() as fh:
        return [json.loads(line)["text"] for line in itertools.islice(fh, skip, skip + count)]


def wait_until_ready(client, server, timeout_s: float, pause_s: float = 0.2) -> None:
    """Poll GET /ready through `client` until it answers 200; fail with the server process's stderr if it exits first,
    or after `timeout_s`."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if client.get("/ready").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if server.poll() is not None:
            err = server.stderr.read() if server.stderr else ""
            pytest.fail(f"the service exited ({server.returncode}): {(err.decode() if isinstance(err, bytes) else err)[-3000:]}")
        assert time.monotonic() < deadline, "the service did not become ready"
        time.sleep(pause_s)


def centroids(index) -> np.ndarray:
    """An IVF index's cluster centroids, as a flat array."""
    import faiss

    return faiss.vector_to_array(faiss.downcast_index(faiss.extract_index_ivf(index).quantizer).codes).view(np.float32)
