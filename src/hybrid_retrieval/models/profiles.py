"""Encoder profiles: which model of a named embedding model embeds an index's documents and queries.

- `full`: the model itself, its transformer exported to ONNX (models.onnx_export);
- `small`: a shallower transformer distilled from it on the corpus's own text (models.student), exported the same
  way (int8 too); it needs the corpus, so it is made by a build or a reembed, or given as a folder `hybrid distil`
  wrote;
- `fast`: a static model distilled from it by model2vec, served as an ONNX graph that averages word-piece rows
  (models.static).

Each is made offline from the model's own files and cached; the export's config names the profile and how its model
was made, and a build copies that into the manifest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.common.progress import progress_bar
from hybrid_retrieval.models.embedder import OnnxEmbedder
from hybrid_retrieval.models.onnx_export import CONFIG_FILE, TRAINING_RECORD, cached_export, default_cache_dir, export_dir_for, export_onnx
from hybrid_retrieval.models.providers import on_gpu
from hybrid_retrieval.models.registry import ResolvedModel, resolve_model
from hybrid_retrieval.models.static import ALIGNED, align_static, alignment_texts, distill_static, export_static, write_static_export
from hybrid_retrieval.models.student import StudentRecipe, distil_student, is_student, texts_digest, training_texts

PROFILES = ("full", "small", "fast")
PRECISION_PROFILES = ("full", "small")  # the transformer profiles, which have int8 weights and a torch model

Documents = Callable[[], Iterable[tuple[str, str]]]  # the corpus's (title, text) pairs, read when called


def export_profile(
    model: ResolvedModel,
    profile: str = "full",
    cache_dir: Path | None = None,
    documents: Documents | None = None,
    device: str = "auto",
    progress: bool = False,
) -> Path:
    """The export folder that embeds with `profile` of `model`. A student (models.student) is of the small profile
    only; the small profile of any other model distils one on `documents` (on `device`), cached by the model, the
    recipe and the sampled texts."""
    if profile not in PROFILES:
        raise ConfigError(f"unknown encoder profile {profile!r}; valid: {', '.join(PROFILES)}")
    if profile == "fast":  # a collection made before it has documents gets the distilled table as it is
        return export_static(model, cache_dir) if documents is None else _aligned_static(model, documents, cache_dir, device, progress)
    if is_student(model):
        if profile == "full":
            raise ConfigError(f"{model.name} is a student distilled for the small profile: give it with profile small")
        return export_onnx(model, cache_dir)
    if profile == "full":
        return export_onnx(model, cache_dir)
    if documents is None:
        raise ConfigError(
            "the small profile is a student distilled on a corpus's own text: build an index with it (hybrid index "
            "--profile small, hybrid reembed --profile small), or make one with `hybrid distil` and give its folder as the model"
        )
    recipe = StudentRecipe()
    texts = training_texts(documents(), recipe)
    folder = export_dir_for(model, cache_dir or default_cache_dir(), f"student{recipe.key()}-{texts_digest(texts)}")
    if not (folder / TRAINING_RECORD).is_file():  # a concurrent build's student, published first, is kept
        distil_student(model, texts, folder, recipe, device, progress, keep_existing=True)
    return export_onnx(resolve_model(str(folder)), cache_dir)


def _aligned_static(model: ResolvedModel, documents: Documents, cache_dir: Path | None, device: str, progress: bool) -> Path:
    """The fast profile of a corpus: the static model aligned to `model` on a sample of its documents (ALIGNED), cached
    by the model, the recipe and the sampled texts."""
    recipe = ALIGNED
    texts = alignment_texts(documents(), recipe)
    if not texts:  # nothing to align on: the build refuses an empty corpus itself
        return export_static(model, cache_dir)
    folder = export_dir_for(model, cache_dir or default_cache_dir(), f"static{recipe.key()}-{texts_digest(texts)}")

    def make(out: Path) -> None:
        teacher_folder = export_onnx(model, cache_dir)
        teacher = OnnxEmbedder(teacher_folder, device=device)
        if not on_gpu(teacher):  # int8 embeds twice as fast on a CPU, at a cosine of 0.99 to fp32
            teacher = OnnxEmbedder(teacher_folder, device="cpu", precision="int8")
        targets = []
        with progress_bar(len(texts), "fast profile: the model embeds the sampled documents", "docs", progress) as bar:
            for start in range(0, len(texts), 256):
                targets.append(teacher.encode(texts[start : start + 256]))
                bar.update(len(targets[-1]))
        static = distill_static(model, recipe)
        alignment = align_static(static, texts, np.concatenate(targets), recipe)
        write_static_export(static, model, recipe, out, {**alignment, "model_precision": teacher.precision})

    return cached_export(folder, CONFIG_FILE, make)
