"""One place that picks ONNX Runtime execution providers."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from hybrid_retrieval.common.devices import check_device
from hybrid_retrieval.common.errors import ConfigError

logger = logging.getLogger(__name__)

BACKENDS = ("onnx", "torch")  # how embedders and cross-encoders run: ONNX Runtime (served) or torch


def onnx_providers(device: str = "auto") -> list[str]:
    """CUDA when asked for (or auto) and available, CPU always as the fallback.

    Warns when CUDA was explicitly requested but this onnxruntime build cannot use it.
    """
    check_device(device)
    import onnxruntime as ort

    available = ort.get_available_providers()
    if device != "cpu" and "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if device == "gpu":
        logger.warning("GPU (CUDA) requested but onnxruntime offers only %s: using CPU", available)
    return ["CPUExecutionProvider"]


def training_device(device: str = "auto") -> str:
    """The torch device to train on: CUDA when asked for (or auto) and torch sees it, else the CPU (with a warning
    when a GPU was asked for)."""
    check_device(device)
    import torch

    if device != "cpu" and torch.cuda.is_available():
        return "cuda"
    if device == "gpu":
        logger.warning("GPU requested but torch sees no CUDA device: training on CPU")
    return "cpu"


def on_gpu(model) -> bool:
    """Whether an embedder or cross-encoder runs on CUDA."""
    return "CUDAExecutionProvider" in getattr(model, "providers", ())


def onnx_session(model_path, device: str = "auto", threads: int | None = None):
    """An ONNX Runtime session with full graph optimisation on the providers `device` resolves to."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(model_path), options, providers=onnx_providers(device))


@dataclass(frozen=True)
class SessionRuns:
    """How one ONNX session's batches run: on CPU `workers` side by side (ONNX Runtime sessions run concurrently),
    each on `threads` intra-op threads; on a GPU (`gpu`) one at a time. `map` runs a function over the batches."""

    workers: int
    threads: int | None
    gpu: bool = False
    map: Callable = map


def session_runs(device: str, workers: int | None, threads: int | None, name: str) -> SessionRuns:
    """`workers` None: one per core on CPU. `threads` None: 1 beside other workers, all cores alone. Small products
    (one short sequence, one 128-token pair) split badly across cores, so side by side is the faster use of them."""
    for what, value in (("threads", threads), ("workers", workers)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} {what} must be at least 1 (or unset for the default), got {value}")
    gpu = "CUDAExecutionProvider" in onnx_providers(device)
    count = 1 if gpu else (workers or len(os.sched_getaffinity(0)))
    if count == 1:
        return SessionRuns(1, threads, gpu)
    return SessionRuns(count, threads or 1, gpu, ThreadPoolExecutor(count, thread_name_prefix=name).map)


def load_tokenizer(path, max_length: int, pad_id: int, pad_token: str):
    """A fast tokenizer that truncates like Hugging Face's `truncation=True` (longest first) and pads each batch."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length=max_length, strategy="longest_first")
    tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
    return tokenizer


def encoding_feeds(encodings, inputs: list[str]) -> dict:
    """ONNX inputs for a batch of `tokenizers` encodings."""
    import numpy as np

    columns = {
        "input_ids": lambda e: e.ids,
        "attention_mask": lambda e: e.attention_mask,
        "token_type_ids": lambda e: e.type_ids,
    }
    return {name: np.array([columns[name](e) for e in encodings], dtype=np.int64) for name in inputs}


def torch_device(device: str) -> str | None:
    """The torch device string for `device` (None: let sentence-transformers pick, CUDA when present)."""
    return {"auto": None, "cpu": "cpu", "gpu": "cuda"}[check_device(device)]
