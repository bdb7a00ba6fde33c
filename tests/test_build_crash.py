"""A build killed at any point leaves the previous index intact (or, once swapped in, the new one whole)."""

import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from hybrid_retrieval.indexer.manifest import read_manifest
from hybrid_retrieval.indexer.store import open_index
from tests.conftest import REPO, TINY_CORPUS, write_jsonl

# Where the child process kills itself (SIGKILL: no cleanup code runs), in build order.
KILL_POINTS = {
    "bm25": "hybrid_retrieval.indexer.build.BM25Index.from_postings",  # documents stored, nothing else
    "faiss": "hybrid_retrieval.indexer.build.trained_index",  # embeddings written
    "manifest": "hybrid_retrieval.indexer.build.write_manifest",  # every file but the manifest
    "fsync": "hybrid_retrieval.common.publish._fsync_tree",  # complete, not yet flushed
    "swap": "hybrid_retrieval.common.publish._exchange",  # flushed, about to replace the old index
    "cleanup": "hybrid_retrieval.common.publish.shutil.rmtree",  # swapped in; the old index not yet removed
}
CHILD = textwrap.dedent("""
    import os, signal, sys
    from unittest import mock
    from hybrid_retrieval.indexer.build import BuildOptions, build_index

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    with mock.patch(sys.argv[1], die):
        build_index(sys.argv[2], sys.argv[3], BuildOptions(progress=False))
""")


@pytest.mark.process
@pytest.mark.parametrize("point", KILL_POINTS)
def test_killed_build_keeps_the_previous_index(tiny_index, tmp_path, point):
    out = tmp_path / "index"
    shutil.copytree(tiny_index, out)
    old = read_manifest(out)
    corpus = write_jsonl(tmp_path / "new.jsonl", TINY_CORPUS[:3])
    child = subprocess.run(
        [sys.executable, "-c", CHILD, KILL_POINTS[point], str(corpus), str(out)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    index = open_index(out, verify="full")  # every file present with its checksum
    expected = 3 if point == "cleanup" else 6
    assert index.num_docs == expected and [index.docs.get(i)["id"] for i in range(expected)] == [d["_id"] for d in TINY_CORPUS[:expected]]
    if point != "cleanup":
        assert read_manifest(out).to_dict() == old.to_dict()
    index.close()
