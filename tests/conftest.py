from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
BEIR_DATA = Path(os.environ.get("BEIR_DATA", REPO.parent / "shared" / "data" / "beir"))
SCIFACT = BEIR_DATA / "scifact"
SLICE_DOCS = 500

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
    from indexer.build import BuildOptions, build_index

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
    from indexer.build import BuildOptions, build_index

    out = tmp_path_factory.mktemp("scifact-index") / "index"
    build_index(scifact_slice, out, BuildOptions(progress=False))
    return out
