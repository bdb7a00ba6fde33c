"""Export a sentence-transformers embedding model to a self-contained ONNX folder.

The graph includes pooling and L2 normalisation, so ONNX Runtime returns the final sentence
embedding and serving needs neither torch nor sentence-transformers. Exports are cached, keyed
by model name and weights checksum, and written to a temporary folder renamed into place.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from models.registry import ResolvedModel

logger = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "embedder.json"
POOLING_MODES = ("mean", "cls")
OPSET = 17


def default_cache_dir() -> Path:
    root = os.environ.get("HYBRID_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hybrid-retrieval"
    return Path(root) / "onnx"


def export_dir_for(model: ResolvedModel, cache_dir: Path) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model.name).strip("_")[-60:]
    return cache_dir / f"{slug}-{model.checksum[:16]}"


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
        raise ValueError(f"pooling mode {mode!r} is not supported for ONNX export; supported: {', '.join(POOLING_MODES)}")
    return mode


def _export(model: ResolvedModel, out: Path) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    from models.embedder import st_dimension

    st_model = SentenceTransformer(str(model.path), device="cpu")
    transformer = st_model[0]
    tokenizer = transformer.tokenizer
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"model {model.name!r} has no fast tokenizer (tokenizer.json); ONNX serving needs one")
    pooling = _pooling_mode(st_model)
    input_names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in tokenizer.model_input_names]

    class PooledEncoder(torch.nn.Module):
        def __init__(self, auto_model):
            super().__init__()
            self.auto_model = auto_model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                kwargs["token_type_ids"] = token_type_ids
            hidden = self.auto_model(**kwargs)[0]
            if pooling == "cls":
                pooled = hidden[:, 0]
            else:
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    encoder = PooledEncoder(transformer.auto_model).eval()
    sample = tokenizer(["an example sentence", "another one"], return_tensors="pt", padding=True)
    args = tuple(sample[n] for n in input_names)
    dynamic_axes = {n: {0: "batch", 1: "sequence"} for n in input_names}
    dynamic_axes["embedding"] = {0: "batch"}
    with torch.no_grad():
        torch.onnx.export(
            encoder, args, str(out / ONNX_FILE), input_names=input_names, output_names=["embedding"],
            dynamic_axes=dynamic_axes, opset_version=OPSET, dynamo=False,
        )
    tokenizer.backend_tokenizer.save(str(out / TOKENIZER_FILE))
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
    }
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))


def export_onnx(model: ResolvedModel, cache_dir: Path | None = None) -> Path:
    """Return the folder holding the ONNX export of `model`, exporting it on first use."""
    target = export_dir_for(model, cache_dir or default_cache_dir())
    if (target / CONFIG_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("exporting %s to ONNX (cached at %s)", model.name, target)
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=target.parent))
    try:
        _export(model, tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process published the same export first
            if not (target / CONFIG_FILE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
