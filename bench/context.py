"""What the benchmark cases run on: the dataset, and the indexes and models they measure, each made once per work
folder with the product's own commands (`hybrid index`, `tune`, `hubness fit`, `train-reranker`, ...) and reused
while present.

`quick` shrinks every case to a smoke run (a few queries, short load phases); records say which one ran.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from functools import cached_property
from pathlib import Path
from typing import Any

from bench.machine import faiss_gpus, onnx_providers
from hybrid_retrieval.indexer.corpus import split_queries
from hybrid_retrieval.indexer.manifest import read_manifest
from hybrid_retrieval.indexer.store import OpenIndex, open_index

# the label-free pseudo-query recipes the adaptation case trains encoders on (`hybrid adapt --recipe`)
ADAPT_RECIPES = ("title", "ict")


class Context:
    def __init__(self, data: Path, work: Path, quick: bool = False, baseline: str | None = None, progress: bool = True) -> None:
        self.data = Path(data)  # a BEIR dataset folder (scifact)
        self.work = Path(work)
        self.quick = quick
        self.baseline_ref = baseline
        self.progress = progress
        self.work.mkdir(parents=True, exist_ok=True)

    def describe(self) -> dict[str, Any]:
        return {"dataset": self.data.name, "quick": self.quick, "baseline": self.baseline_ref}

    # --- what a case may need -------------------------------------------------------------------------------------
    def has(self, need: str) -> bool:
        if need == "gpu":
            return faiss_gpus() > 0 or "CUDAExecutionProvider" in onnx_providers()
        if need == "ray":
            return importlib.util.find_spec("ray") is not None
        if need == "baseline":
            return self.baseline_ref is not None
        if need == "peers":
            from bench.peers_bench import peers_python

            return peers_python(self.work).is_file()
        raise ValueError(f"unknown need {need!r}: gpu, ray, baseline or peers")

    def why_not(self, need: str) -> str:
        return {
            "gpu": "no GPU visible to FAISS or ONNX Runtime",
            "ray": "Ray is not installed (the ray extra)",
            "baseline": "no --baseline REF given",
            "peers": "no peers' environment: run `bash bench/peers/setup.sh` (or set HYBRID_PEERS_PYTHON)",
        }[need]

    def size(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    # --- the product's commands -----------------------------------------------------------------------------------
    def hybrid(self, *args: Any, env: dict[str, str] | None = None) -> str:
        """Run a `hybrid` command; its stdout."""
        command = [sys.executable, "-m", "hybrid_retrieval.cli", *map(str, args)]
        if self.progress:
            print("[bench] $ hybrid " + " ".join(map(str, args)), file=sys.stderr)
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
        if done.returncode:
            raise RuntimeError(f"hybrid {args[0]} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        return done.stdout

    @functools.cache  # noqa: B019 - one Context per run, read by every case
    def queries(self, split: str = "test") -> list[str]:
        queries, _ = split_queries(self.data, split)
        return list(queries.values())

    @property
    def train(self) -> list[str]:
        return ["--queries", str(self.data / "queries.jsonl"), "--qrels", str(self.data / "qrels" / "train.tsv")]

    # --- artefacts, each made once --------------------------------------------------------------------------------
    def _index(self, name: str, *flags: Any) -> Path:
        folder = self.work / "indexes" / name
        if not (folder / "manifest.json").is_file():
            self.hybrid("index", self.data, "--out", folder, "--quiet", *flags)
        return folder

    @cached_property
    def untuned_index(self) -> Path:
        """The dataset indexed with every default, nothing tuned or fitted."""
        return self._index(self.data.name + "-untuned")

    @cached_property
    def fast_index(self) -> Path:
        """The dataset indexed with the fast profile (the static model distilled from the default one, aligned on it)."""
        return self._index(self.data.name + "-fast", "--profile", "fast")

    @cached_property
    def index(self) -> Path:
        """The served configuration: the fusion tuned on the train split, hubness corrections fitted on train queries
        (QB-Norm's beta by cross-fitting, DBNorm keeping it)."""
        folder = self._index(self.data.name)
        if read_manifest(folder).fusion_tuning is None:
            self.hybrid("tune", folder, *self.train, "--quiet")
        if read_manifest(folder).hubness is None:
            bank = ["--bank", self.data / "queries.jsonl", "--split-qrels", self.data / "qrels" / "train.tsv"]
            self.hybrid("hubness", "fit", folder, *bank, "--method", "qbnorm", "--tune")
            beta = read_manifest(folder).hubness.params.beta
            self.hybrid("hubness", "fit", folder, *bank, "--method", "dbnorm", "--beta", beta, "--tune")
        return folder

    @cached_property
    def opened(self) -> OpenIndex:
        """`index`, opened once for the in-process cases."""
        return open_index(self.index, verify="size")

    @cached_property
    def peaks(self) -> dict[str, Any]:
        """The machine's GEMM peaks, measured once per run (`bench.compute_floor`)."""
        from bench.compute_floor import machine_peaks

        return machine_peaks()

    @cached_property
    def int8_index(self) -> Path:
        """The dataset with documents embedded by the int8 model."""
        return self._index(self.data.name + "-int8", "--precision", "int8")

    def _model(self, name: str, command: str, *flags: Any) -> Path:
        folder = self.work / "models" / name
        if not (folder / "training.json").is_file():
            self.hybrid(command, *flags, "--out", folder, "--quiet")
        return folder

    @cached_property
    def reranker(self) -> Path:
        """A cross-encoder fine-tuned on the train split with hard negatives from the hybrid retriever."""
        return self._model("reranker", "train-reranker", self.index, *self.train)

    def made_reranker(self) -> Path | None:
        """`reranker` if it was made before (`python -m bench prepare`), without training it now."""
        folder = self.work / "models" / "reranker"
        return folder if (folder / "training.json").is_file() else None

    def small_reranker(self, from_base: bool) -> Path:
        """A 3-layer reranker distilled from `reranker`, cut from the teacher's layers or started from the base model."""
        flags = ["--base-model", "all-MiniLM-L6-v2"] if from_base else []
        return self._model(
            "reranker-l3" + ("-base" if from_base else ""),
            "train-reranker",
            self.index,
            "--layers",
            3,
            "--teacher",
            self.reranker,
            *flags,
            *self.train,
        )

    @cached_property
    def embedder(self) -> Path:
        """The encoder fine-tuned on the train split."""
        return self._model("embedder", "train-embedder", self.index, *self.train)

    def adapted(self, recipe: str) -> Path:
        """The encoder adapted on label-free pseudo-queries (`title` or `ict`) mined with the untuned index."""
        return self._model(
            f"adapt-{recipe}", "adapt", self.untuned_index, "--recipe", recipe, "--max-queries", 1000, "--epochs", 2, "--eval-depth", 20
        )

    @cached_property
    def student(self) -> Path:
        """A 3-layer student of the model, distilled on the dataset's own text (`hybrid distil`, the small profile's
        default recipe; on a GPU where there is one: about an hour of a 2-core CPU for scifact)."""
        return self._model("student", "distil", self.data)

    def prepare(self) -> None:
        """Make every artefact the cases use, so a run afterwards measures and does nothing else."""
        _ = self.index, self.untuned_index, self.int8_index, self.reranker, self.embedder, self.student
        for from_base in (False, True):
            self.small_reranker(from_base)
        for recipe in ADAPT_RECIPES:
            self.adapted(recipe)

    def tuned_copy(self, index: Path, dataset: Path | None = None) -> Path:
        """A copy of `index` beside it, tuned on the dataset's train split (fusion; a chunked index's passage scoring
        too), as served; made once."""
        dataset = dataset or self.data
        folder = index.with_name(index.name + "-tuned")
        if not (folder / "manifest.json").is_file():
            shutil.copytree(index, folder)
            self.hybrid("tune", folder, "--queries", dataset / "queries.jsonl", "--qrels", dataset / "qrels" / "train.tsv", "--quiet")
        return folder

    def copy_of(self, source: Path, name: str) -> Path:
        """A fresh copy of an index folder to change (re-embed, re-tune) without touching the source."""
        target = self.work / "indexes" / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)
        return target

    @cached_property
    def baseline(self) -> Path:
        """A detached worktree of the --baseline ref."""
        assert self.baseline_ref is not None
        folder = self.work / f"baseline-{self.baseline_ref}"
        if not folder.is_dir():
            subprocess.run(["git", "worktree", "add", "--detach", str(folder), self.baseline_ref], check=True, capture_output=True)
        return folder
