"""`hybrid reembed`: swap an index's dense half for another model (indexer.reembed), then redo what was fitted to
the old model's scores, the way it was done: a hubness correction is refitted on the same bank (betas rescaled to
the new scores, re-tuned when they were tuned, the default kept only if it still wins), and a tuned fusion is
re-tuned on the same labelled split. Each lands in the manifest as a fresh fit would."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.indexer.hubness import DEFAULT_PSEUDO_SIZE
from hybrid_retrieval.indexer.manifest import Manifest, read_manifest
from hybrid_retrieval.indexer.reembed import reembed
from hybrid_retrieval.models.onnx_export import training_record
from hybrid_retrieval.quality.splits import training_split
from hybrid_retrieval.search.spec import HubnessSpec
from hybrid_retrieval.training.fusion import pseudo_split, tune_fusion_on_index
from hybrid_retrieval.training.hubness import DefaultRefused, fit_hubness_from_bank
from hybrid_retrieval.training.pseudo import parse_source

logger = logging.getLogger(__name__)


def fusion_split(manifest: Manifest, queries: Path | None, model: str) -> Callable[[Path], tuple[dict, dict, Path | str]] | None:
    """How to make again the split the fusion was tuned on, for an index folder: (queries, qrels, split name); None when
    it was not tuned. Pseudo-queries are cut again from the index (training.pseudo); a labelled split is read from its
    recorded qrels and `queries`, or the BEIR layout's queries.jsonl beside qrels/. When `model` was trained on that
    split (`hybrid train-embedder`), only the queries it held out are kept: on the others its dense scores are
    in-sample, and a fusion tuned there would trust the dense leg more than new queries warrant."""
    if manifest.fusion_tuning is None:
        return None
    source = manifest.fusion_tuning.qrels
    pseudo = parse_source(source)
    if pseudo is not None:
        return lambda index_dir: pseudo_split(index_dir, *pseudo, progress=False)
    qrels = Path(source)
    queries = queries or qrels.parent.parent / "queries.jsonl"
    if not qrels.is_file() or not queries.is_file():
        raise ConfigError(
            f"the fusion was tuned on {qrels}; to re-tune it for the new model, both it and the queries must be "
            f"readable (looked for {queries}): pass --queries, or --keep-fusion to keep the old fusion"
        )
    record = training_record(model) or {}
    held_out = record.get("data", {}).get("held_out_ids") if record.get("data", {}).get("split") == qrels.stem else None

    def read(index_dir: Path) -> tuple[dict, dict, Path]:
        split_queries, split_qrels = training_split(queries, qrels)
        if held_out is not None:
            split_queries = {q: split_queries[q] for q in held_out if q in split_queries}
            split_qrels = {q: split_qrels[q] for q in split_queries}
            logger.info("re-tuning the fusion on the %d queries of %s that %s held out", len(split_queries), qrels, model)
        return split_queries, split_qrels, qrels

    return read


def refit_hubness(index_dir: Path, old: Manifest) -> dict:
    """Fit the old correction's method on its bank again, for the new model's scores; returns what happened."""
    fitted, default = old.hubness, old.defaults.hubness
    bank = fitted.bank
    source = "pseudo" if bank["kind"].startswith("pseudo") else bank["source"]
    candidate = default if default.method != "none" else HubnessSpec("qbnorm")
    kwargs = {
        "k": fitted.params.k,
        "split_qrels": bank.get("split"),
        "tune": fitted.tuning is not None,
        "gallery_size": fitted.gallery["size"],
        "pseudo_size": bank.get("size", DEFAULT_PSEUDO_SIZE),
    }
    forced = old.evidence.get("hubness", {}).get("decision") == "forced"  # a default set without a win stays one
    try:
        fit_hubness_from_bank(index_dir, source, candidate, set_default=default.method != "none", force=forced, **kwargs)
        return {"bank": bank["kind"], "default": default.method}
    except DefaultRefused as refused:  # the correction no longer helps this model: fitted, but not the default
        fit_hubness_from_bank(index_dir, source, candidate, **kwargs)
        return {"bank": bank["kind"], "default": "none", "was": default.method, "why": str(refused)}


def reembed_index(
    index_dir: Path | str,
    model: str | None = None,
    precision: str | None = None,
    device: str = "auto",
    queries: Path | None = None,
    keep_fusion: bool = False,
    progress: bool = True,
    profile: str | None = None,
) -> dict:
    """Re-embed, refit and re-tune; returns a report of each step."""
    index_dir = Path(index_dir)
    old = read_manifest(index_dir)
    model = model or old.embedder.model
    split = None if keep_fusion else fusion_split(old, queries, model)  # checked before minutes of embedding
    manifest = reembed(index_dir, model, precision, device, progress=progress, profile=profile)
    report = {
        "documents": manifest.documents,
        "model": model,
        "profile": manifest.embedder.profile,
        "from": manifest.build["reembedded_from"],
        "training": manifest.embedder.training,
    }
    if old.hubness is not None:
        report["hubness"] = refit_hubness(index_dir, old)
    if split is not None:
        _, evidence = tune_fusion_on_index(index_dir, *split(index_dir), old.fusion_tuning.metric, progress=progress)
        report["fusion"] = evidence
    elif old.fusion_tuning is not None:
        report["fusion"] = "kept as tuned for the previous model (--keep-fusion)"
    return report
