"""Fetch a BEIR dataset from its official location when it is not already on disk."""

from __future__ import annotations

import logging
import shutil
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from hybrid_retrieval.common.errors import ConfigError

logger = logging.getLogger(__name__)

BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"


def ensure_dataset(name: str, root: Path | str) -> Path:
    """Return `root/name`, downloading and unpacking it first if it has no corpus.jsonl."""
    target = Path(root) / name
    if (target / "corpus.jsonl").is_file():
        return target
    url = BEIR_URL.format(name=name)
    logger.info("%s not found under %s: downloading %s", name, root, url)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        archive = Path(tmp) / f"{name}.zip"
        try:
            with urllib.request.urlopen(url, timeout=60) as response, archive.open("wb") as fh:
                shutil.copyfileobj(response, fh)
        except OSError as exc:
            raise ConfigError(
                f"{target} is missing and downloading {url} failed ({exc}); set BEIR_DATA to a folder that holds {name}/corpus.jsonl"
            ) from None
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(tmp)
        (Path(tmp) / name).rename(target)
    return target
