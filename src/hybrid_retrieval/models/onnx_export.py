"""Export transformer models to self-contained ONNX folders served by ONNX Runtime without torch.

Two kinds share one recipe (export, graph optimisation, int8 quantisation, atomic publish):
- embedders (sentence-transformers): pooling and L2 normalisation are inside the graph, so
  ONNX Runtime returns the final sentence embedding;
- cross-encoders (sequence classification, one logit per query/document pair).

Each folder holds `model.onnx` (fp32, attention/LayerNorm/GELU fused by ONNX Runtime's transformer
optimizer), `model.int8.onnx` (dynamic per-channel int8 weights, for CPU), `tokenizer.json` and a
JSON config. Exports are cached, keyed by model name, weights checksum and export format.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.common.publish import publish_dir
from hybrid_retrieval.models.registry import ResolvedModel

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"
PRECISIONS = {"fp32": ONNX_FILE, "int8": INT8_FILE}
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "embedder.json"
CROSS_ENCODER_CONFIG = "cross_encoder.json"
POOLING_MODES = ("mean", "cls")
OPSET = 17
EXPORT_FORMAT = 2  # bump when the folder layout changes, so cached exports are redone
ONNX_SUBDIR = "onnx"  # where `hybrid train-reranker` puts the export beside the torch weights
TRAINING_RECORD = "training.json"  # written by `hybrid train-reranker`, `train-embedder`, `adapt` and `distil`: recipe, held-out results
STUDENT_KIND = "student"  # the training.json kind of a student distilled for the small profile (models.student)


def default_cache_dir() -> Path:
    root = os.environ.get("HYBRID_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hybrid-retrieval"
    return Path(root) / "onnx"


def export_dir_for(model: ResolvedModel, cache_dir: Path, kind: str = "embedder") -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model.name).strip("_")[-60:]
    return cache_dir / f"{kind}-{slug}-{model.checksum[:16]}-v{EXPORT_FORMAT}"


SERVED_PRECISIONS = ("auto", *PRECISIONS)


def resolve_precision(requested: str, folder: Path, gpu: bool) -> str:
    """The weights that embed queries or score reranked pairs. auto: int8 on CPU, where it halves the time of a query's
    embedding (2.3x for a reranker's pairs) and moved scifact test nDCG@10 by 0.003 or less (docs/BENCHMARKS.md,
    "Query precision and cache", "Rerankers"), fp32 on a GPU and for an export made before int8 models; an explicit
    precision the export lacks is an error."""
    if requested not in SERVED_PRECISIONS:
        raise ConfigError(f"unknown precision {requested!r}; valid: {', '.join(SERVED_PRECISIONS)}")
    if requested == "auto":
        return "int8" if not gpu and (Path(folder) / PRECISIONS["int8"]).is_file() else "fp32"
    model_file(folder, requested)
    return requested


def model_file(folder: Path, precision: str) -> Path:
    """The ONNX graph of `precision` in an export folder, with an error naming the valid choices."""
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    path = Path(folder) / PRECISIONS[precision]
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: this export predates {precision} models; export it again")
    return path


def _pooling_mode(st_model) -> str:
    # Matched by class name: the Pooling module moved between sentence-transformers releases.
    pooling = next((m for m in st_model if type(m).__name__ == "Pooling"), None)
    if pooling is None:
        mode = "mean"
    elif hasattr(pooling, "get_pooling_mode_str"):  # sentence-transformers < 6
        mode = pooling.get_pooling_mode_str()
    else:
        mode = pooling.pooling_mode
    if mode not in POOLING_MODES:
        raise ConfigError(f"pooling mode {mode!r} is not supported for ONNX export; supported: {', '.join(POOLING_MODES)}")
    return mode


def _input_names(tokenizer) -> list[str]:
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError("the model has no fast tokenizer (tokenizer.json); ONNX serving needs one")
    return [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in tokenizer.model_input_names]


def _with_head(model, head):
    """`model` called with the tokenizer's inputs, its outputs turned into one tensor by `head(outputs, attention_mask)`."""
    import torch

    class Exported(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                kwargs["token_type_ids"] = token_type_ids
            return head(self.model(**kwargs), attention_mask)

    return Exported()


def _export_graph(module, tokenizer, sample, out: Path, output_name: str, input_names: list[str]) -> None:
    import torch

    encoded = tokenizer(*sample, return_tensors="pt", padding=True, truncation=True)
    dynamic_axes = {n: {0: "batch", 1: "sequence"} for n in input_names}
    dynamic_axes[output_name] = {0: "batch"}
    with torch.no_grad():
        torch.onnx.export(
            module.eval(),
            tuple(encoded[n] for n in input_names),
            str(out / ONNX_FILE),
            input_names=input_names,
            output_names=[output_name],
            dynamic_axes=dynamic_axes,
            opset_version=OPSET,
            dynamo=False,
        )
    tokenizer.backend_tokenizer.save(str(out / TOKENIZER_FILE))


def _optimize_and_quantize(out: Path, hf_config) -> None:
    """Fuse the transformer subgraphs (portable: no hardware-specific rewrites), then write int8 weights."""
    with _quiet("onnx_model", "fusion_base", "fusion_utils", "onnx_model_bert"):  # they log every fusion at INFO
        _fuse_and_quantize(out, hf_config)


@contextlib.contextmanager
def _quiet(*names: str) -> Iterator[None]:
    """Raise these loggers to WARNING for the block, then put their levels back; never the root logger, which the
    service's own lines go through."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [named.level for named in loggers]
    for named in loggers:
        named.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for named, level in zip(loggers, levels):
            named.setLevel(level)


def _fuse_and_quantize(out: Path, hf_config) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    heads = getattr(hf_config, "num_attention_heads", 0)
    hidden = getattr(hf_config, "hidden_size", 0)
    if getattr(hf_config, "model_type", "") in ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra"):
        optimized = optimize_model(str(out / ONNX_FILE), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0)
        optimized.save_model_to_file(str(out / ONNX_FILE))
    else:
        logger.info("no transformer fusions for model type %r; exporting the plain graph", getattr(hf_config, "model_type", "?"))
    # fused contrib ops (BiasGelu, SkipLayerNormalization) defeat shape inference: their outputs are float
    quantize_dynamic(
        str(out / ONNX_FILE),
        str(out / INT8_FILE),
        per_channel=True,
        weight_type=QuantType.QInt8,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """The sentence embedding of a transformer's last hidden states (torch): the CLS token's or the mean of the
    attended tokens', L2-normalised, as sentence-transformers pools (the export's graph and the student's training)."""
    import torch

    if pooling == "cls":
        pooled = hidden[:, 0]
    else:
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)


class _TransformerModule(Protocol):
    """What an export reads of a sentence-transformers model's first module: its Transformer (a class whose import
    path moved between sentence-transformers releases)."""

    auto_model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase


def _export_embedder(model: ResolvedModel, out: Path) -> None:
    from sentence_transformers import SentenceTransformer

    st_model = SentenceTransformer(str(model.path), device="cpu")
    transformer = cast(_TransformerModule, st_model[0])
    tokenizer = transformer.tokenizer
    input_names = _input_names(tokenizer)
    pooling = _pooling_mode(st_model)

    _export_graph(
        _with_head(transformer.auto_model, lambda outputs, attention_mask: pool(outputs[0], attention_mask, pooling)),
        tokenizer,
        (["an example sentence", "another one"],),
        out,
        "embedding",
        input_names,
    )
    _optimize_and_quantize(out, transformer.auto_model.config)
    config = {
        "model": model.name,
        "model_checksum": model.checksum,
        "dimension": st_dimension(st_model),
        "max_seq_length": st_model.max_seq_length,
        "pooling": pooling,
        "normalize": True,
        "inputs": input_names,
        "pad_token": tokenizer.pad_token,
        "pad_token_id": tokenizer.pad_token_id,
        "training": embedder_recipe(model.path),
        **student_profile(model.path),
    }
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))


def _export_cross_encoder(model: ResolvedModel, out: Path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model.path))
    classifier = AutoModelForSequenceClassification.from_pretrained(str(model.path))
    input_names = _input_names(tokenizer)
    max_length = trained_max_length(model.path) or _positions_max_length(tokenizer, classifier.config)

    _export_graph(
        _with_head(classifier, lambda outputs, _: outputs.logits),
        tokenizer,
        (["a query", "another query"], ["a passage", "a longer passage here"]),
        out,
        "logits",
        input_names,
    )
    _optimize_and_quantize(out, classifier.config)
    config = {
        "model": model.name,
        "model_checksum": model.checksum,
        "max_length": max_length,
        "num_labels": int(classifier.config.num_labels),
        "inputs": input_names,
        "pad_token": tokenizer.pad_token,
        "pad_token_id": tokenizer.pad_token_id,
    }
    (out / CROSS_ENCODER_CONFIG).write_text(json.dumps(config, indent=2))


def trained_max_length(path: Path | str) -> int | None:
    """The pair length a `hybrid train-reranker` folder was trained with (None for other models)."""
    record = training_record(path)
    return int(record["options"]["max_length"]) if record else None


def training_record(name_or_path: str | Path) -> dict | None:
    """The training.json of a `hybrid train-reranker` folder, or of the folder its onnx/ export sits in."""
    path = Path(name_or_path).expanduser()
    for folder in (path, path.parent) if path.name == ONNX_SUBDIR else (path,):
        record = folder / TRAINING_RECORD
        if record.is_file():
            return json.loads(record.read_text())
    return None


def embedder_recipe(path: Path | str) -> dict | None:
    """What an index's manifest keeps of a fine-tuned embedder's training.json (training.embedder): the recipe, the
    base model and the held-out result. None for any other model."""
    record = training_record(path)
    if not record or record.get("kind") != "embedder":
        return None
    held_out = record["held_out"]
    return {
        "recipe": record["data"]["recipe"],
        "base_model": record["base_model"],
        "held_out": {k: held_out[k] for k in ("metric", "before", "after", "best_epoch")},
    }


def student_profile(path: Path | str) -> dict:
    """The export config's profile and recipe for a student distilled by models.student (the small profile); empty
    for any other model, whose export is of the full profile."""
    record = training_record(path)
    if not record or record.get("kind") != STUDENT_KIND:
        return {}
    recipe = {
        "method": "layer-drop distillation on the corpus",
        "base_model": record["base_model"],
        "base_model_checksum": record["base_model_checksum"],
        **{k: record[k] for k in ("recipe", "texts", "held_out", "device", "seconds")},
    }
    return {"profile": "small", "recipe": recipe}


def _positions_max_length(tokenizer, hf_config) -> int:
    positions = int(getattr(hf_config, "max_position_embeddings", 512))
    declared = getattr(tokenizer, "model_max_length", positions) or positions
    return int(min(declared, positions))


def cached_export(target: Path, marker: str, export: Callable[[Path], None]) -> Path:
    """Export into a temporary sibling published atomically; a concurrent exporter's identical result,
    published first, is kept."""
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("exporting to ONNX at %s", target)
    with publish_dir(target, keep_existing=True) as tmp:
        export(tmp)
    return target


def st_dimension(st_model: SentenceTransformer) -> int:
    """Embedding size of a SentenceTransformer (the method was renamed in sentence-transformers 6)."""
    getter = getattr(st_model, "get_embedding_dimension", None) or st_model.get_sentence_embedding_dimension
    dimension = getter()
    assert dimension is not None  # None when none of its modules declares the size (int(None) failed here before)
    return int(dimension)


def export_onnx(model: ResolvedModel, cache_dir: Path | None = None) -> Path:
    """The folder holding the ONNX export of embedding model `model`, exporting it on first use."""
    target = export_dir_for(model, cache_dir or default_cache_dir(), "embedder")
    return cached_export(target, CONFIG_FILE, lambda out: _export_embedder(model, out))


def export_cross_encoder(model: ResolvedModel, target: Path | None = None, cache_dir: Path | None = None) -> Path:
    """The folder holding the ONNX export of cross-encoder `model` (at `target`, or in the cache)."""
    target = target or export_dir_for(model, cache_dir or default_cache_dir(), "cross-encoder")
    return cached_export(Path(target), CROSS_ENCODER_CONFIG, lambda out: _export_cross_encoder(model, out))
