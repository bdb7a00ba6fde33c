"""An index build in a child process at low priority: how a service builds while it serves (a compaction).

Built in the service's own process, a compaction held the interpreter lock through every Python step of the build
(each stored document read for its metadata, each line adopted), so searches and writes queued behind it, and its
garbage stayed in the service's heap. A child process has its own lock and heap, and runs niced, so the service's
threads come first on the cores. The job (build_into's arguments) and its result travel as files in the build's work
folder; the vectors and postings as arrays the child maps, a compaction's postings as what they merge from (the
merge, a pass over every posting, runs in the child too).

Builds of fewer than CHILD_ABOVE documents stay in the calling process: starting Python and importing the engine
costs about a second.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from hybrid_retrieval.common.errors import HybridError
from hybrid_retrieval.indexer.build import BuildOptions, build_into
from hybrid_retrieval.indexer.manifest import Manifest
from hybrid_retrieval.indexer.representation import PassageArrays, VectorSource
from hybrid_retrieval.search.postings import Postings, TermMerge

CHILD_ABOVE = 20_000
NICENESS = 10  # the child's priority below the service's (0 .. 19: lowest)
POLL_S = 0.1  # how often the parent runs `checkpoint` while the child builds
PASSAGE_PARTS = tuple(field.name for field in fields(PassageArrays))


@dataclass(frozen=True)
class _Job:
    folder: Path
    source: Path
    options: BuildOptions
    onnx_folder: Path | None
    embedder_spec: dict
    vectors: Path  # .npy of one vector per document
    passages: Path | None  # a folder of a chunked index's passages as PASSAGE_PARTS .npy files
    postings: Path | None  # a folder holding postings/ (Postings.save)
    vocabulary: dict[str, int] | None
    merge: Path | None  # a folder of a TermMerge (TermMerge.save)
    collection: bool
    stored_lines: bool
    trained: Path | None


def build_given(  # noqa: PLR0913
    folder: Path,
    source: Path,
    options: BuildOptions,
    onnx_folder: Path | None,
    embedder_spec: dict,
    vectors: Path,
    *,
    work: Path,
    documents: int,
    passages: PassageArrays | None = None,
    analysed: tuple[Postings, dict[str, int]] | TermMerge | None = None,
    collection: bool = False,
    stored_lines: bool = False,
    trained: Path | None = None,
    checkpoint: Callable[[], None] = lambda: None,
) -> Manifest:
    """build_into `folder` of the corpus `source` with the given document `vectors` (an .npy file) and `passages`,
    in a child process when `documents` reach CHILD_ABOVE (its scratch files in `work`). `checkpoint` runs between
    stages in process, and every POLL_S while a child builds; what it raises stops the child (killed) and the build.
    `analysed`: the documents' postings, or the merge that makes them (made where the build runs)."""
    if documents < CHILD_ABOVE:
        if isinstance(analysed, TermMerge):
            analysed = analysed.merged()
        given = VectorSource(documents=np.load(vectors, mmap_mode="r"), passages=passages)
        return build_into(
            folder,
            source,
            options,
            onnx_folder,
            embedder_spec,
            vectors=given,
            collection=collection,
            checkpoint=checkpoint,
            analysed=analysed,
            stored_lines=stored_lines,
            trained=trained,
        )
    postings, vocabulary, passage_folder, merge = None, None, None, None
    if passages is not None:  # arrays the size of the passages' vectors: files the child maps, not a pickle
        passage_folder = work / "passages"
        passage_folder.mkdir()
        for name in PASSAGE_PARTS:
            np.save(passage_folder / f"{name}.npy", getattr(passages, name))
    if isinstance(analysed, TermMerge):
        merge = work / "merge"
        analysed.save(merge)
    elif analysed is not None:
        postings = work / "terms"
        postings.mkdir()
        analysed[0].save(postings)
        vocabulary = analysed[1]
    job = _Job(
        folder,
        source,
        options,
        onnx_folder,
        embedder_spec,
        vectors,
        passage_folder,
        postings,
        vocabulary,
        merge,
        collection,
        stored_lines,
        trained,
    )
    return _build_in_child(job, work, checkpoint)


def _build_in_child(job: _Job, work: Path, checkpoint: Callable[[], None]) -> Manifest:
    """`job` built by a child process (its job, result and log files in `work`), `checkpoint` run every POLL_S."""
    job_file, result_file, log_file = work / "build-job.pickle", work / "build-result.pickle", work / "build.log"
    job_file.write_bytes(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
    with log_file.open("wb") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", __name__, str(job_file), str(result_file)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        while True:
            try:
                code = child.wait(POLL_S)
                break
            except subprocess.TimeoutExpired:
                checkpoint()
    finally:
        if child.poll() is None:  # checkpoint raised (or this thread was interrupted): the build is not wanted
            child.kill()
            child.wait()
    if code != 0 or not result_file.is_file():
        why = log_file.read_text(errors="replace").strip().splitlines()
        raise HybridError(f"the build process failed (exit code {code}): {why[-1] if why else 'no message'}")
    manifest: Manifest = pickle.loads(result_file.read_bytes())
    return manifest


def _run(job_file: Path, result_file: Path) -> None:
    """The child's side: the job's build, its manifest written to `result_file` once the build is complete."""
    os.nice(NICENESS)
    job: _Job = pickle.loads(job_file.read_bytes())
    analysed, passages = None, None
    if job.passages is not None:
        passages = PassageArrays(*(np.load(job.passages / f"{name}.npy", mmap_mode="r") for name in PASSAGE_PARTS))
    if job.postings is not None:
        assert job.vocabulary is not None  # saved with the postings
        analysed = (Postings.load(job.postings), job.vocabulary)
    elif job.merge is not None:
        analysed = TermMerge.load(job.merge).merged()
    manifest = build_into(
        job.folder,
        job.source,
        job.options,
        job.onnx_folder,
        job.embedder_spec,
        vectors=VectorSource(documents=np.load(job.vectors, mmap_mode="r"), passages=passages),
        collection=job.collection,
        analysed=analysed,
        stored_lines=job.stored_lines,
        trained=job.trained,
    )
    result_file.write_bytes(pickle.dumps(manifest, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    _run(Path(sys.argv[1]), Path(sys.argv[2]))
