"""Static embedders: a table of one vector per word piece, distilled from a sentence-transformers model with model2vec
(each piece run through the model alone, PCA, Zipf/SIF weights), and served as an ONNX graph that averages the
pieces' rows and normalises: no transformer layers, so a text is embedded in microseconds, by ONNX Runtime, without
torch.

The export folder has the layout of a transformer's (models.onnx_export: `model.onnx`, `tokenizer.json`,
`embedder.json`), so everything that embeds with an export (builds, writes, queries, the chunker) takes it as is.
Its tokenizer adds no special tokens and truncates at MAX_PIECES, as model2vec's `encode` does; the unknown piece is
left out of the average, as model2vec leaves it out.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.models.onnx_export import (
    CONFIG_FILE,
    ONNX_FILE,
    OPSET,
    TOKENIZER_FILE,
    cached_export,
    default_cache_dir,
    export_dir_for,
)
from hybrid_retrieval.models.registry import ResolvedModel
from hybrid_retrieval.models.student import sample_documents

STATIC_POOLING = "static-mean"
MAX_PIECES = 512  # model2vec's default truncation


@dataclass(frozen=True)
class StaticRecipe:
    """How the table is made: distilled by model2vec (its parameters), then, with `align_documents`, aligned to the
    model on that many of the corpus's documents (align_static)."""

    pca_dims: int | None = 256  # model2vec's default; 384 (none) scored the same on scifact (docs/experiments.md)
    sif_coefficient: float = 1e-4
    align_documents: int = 0  # 0: the distilled table as it is (a collection made before it has documents)
    align_held_out: int = 200  # sampled documents kept out of the fit: the cosine to the model on them is recorded
    align_epochs: int = 5
    align_ridge: float = 0.1
    align_learning_rate: float = 3e-3
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:8]


# The fast profile of a build or a reembed, which have the corpus: the table mapped into the model's space, where the
# distilled rows (each piece embedded alone) are not (docs/experiments.md, "The fast profile aligned to the model").
ALIGNED = StaticRecipe(pca_dims=None, align_documents=2_000)


def static_graph(table: np.ndarray, unknown_id: int | None) -> bytes:
    """The ONNX graph (serialised) that embeds token ids with `table`: the mean of the rows of the attended pieces
    (the unknown piece excluded), L2-normalised; a text with no piece gets the zero vector."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["rows"], axis=0),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
    ]
    mask = "mask_f"
    if unknown_id is not None:  # model2vec drops the unknown piece before it averages
        nodes += [
            helper.make_node("Equal", ["input_ids", "unknown_id"], ["is_unknown"]),
            helper.make_node("Not", ["is_unknown"], ["is_known"]),
            helper.make_node("Cast", ["is_known"], ["known_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [mask, "known_f"], ["mask_known"]),
        ]
        mask = "mask_known"
    nodes += [
        helper.make_node("Unsqueeze", [mask, "last_axis"], ["mask_3d"]),
        helper.make_node("Mul", ["rows", "mask_3d"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "sequence_axis"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask_3d", "sequence_axis"], ["count"], keepdims=0),
        helper.make_node("Max", ["count", "one"], ["count_1"]),
        helper.make_node("Div", ["summed", "count_1"], ["mean"]),
        helper.make_node("LpNormalization", ["mean"], ["normalised"], axis=1, p=2),
        # LpNormalization divides by the norm as it is: 0/0 for an empty text, which the zero vector replaces
        helper.make_node("IsNaN", ["normalised"], ["nan"]),
        helper.make_node("Where", ["nan", "zero", "normalised"], ["embedding"]),
    ]
    initializers = [
        numpy_helper.from_array(np.ascontiguousarray(table, dtype=np.float32), "table"),
        numpy_helper.from_array(np.array([-1], np.int64), "last_axis"),
        numpy_helper.from_array(np.array([1], np.int64), "sequence_axis"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
    ]
    if unknown_id is not None:
        initializers.append(numpy_helper.from_array(np.array(unknown_id, np.int64), "unknown_id"))
    graph = helper.make_graph(
        nodes,
        "static_embedder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", table.shape[1]])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="hybrid-retrieval")
    onnx.checker.check_model(model)
    return model.SerializeToString()


def distill_static(base: ResolvedModel, recipe: StaticRecipe = StaticRecipe()):
    """model2vec's StaticModel distilled from `base` (needs torch and the profiles extra)."""
    try:
        from model2vec.distill import distill
    except ImportError as exc:
        raise ConfigError(
            f"the fast profile distils a static model, which needs model2vec and torch ({exc.name} is missing): "
            "pip install 'hybrid-retrieval[profiles]'"
        ) from None
    return distill(model_name=str(base.path), pca_dims=recipe.pca_dims, sif_coefficient=recipe.sif_coefficient)


def alignment_texts(documents: Iterable[tuple[str, str]], recipe: StaticRecipe) -> list[str]:
    """The documents (title and text) the table is aligned on: a uniform sample of the corpus, the held-out ones first."""
    sample = sample_documents(documents, recipe.align_documents + recipe.align_held_out, random.Random(recipe.seed))
    return [t for t in dict.fromkeys(f"{title} {text}".strip() for title, text in sample) if t]


def align_static(static, texts: list[str], targets: np.ndarray, recipe: StaticRecipe) -> dict[str, float | None]:
    """Fit `static`'s table (in place) so that the mean of a text's rows reproduces `targets`, the model's vectors of
    `texts`: first a linear map of the whole table (ridge regression, closed form), which carries every row, sampled
    or not, into the model's space; then, for `align_epochs`, the rows the sample uses, by gradient descent on the
    cosine (torch). The first `align_held_out` texts are not fitted on: the mean cosine to the model on them, before
    and after, is returned."""
    import torch

    pieces = [np.asarray(ids[:MAX_PIECES], dtype=np.int64) for ids in static.tokenize(texts)]
    kept = [i for i, ids in enumerate(pieces) if len(ids)]
    held = min(recipe.align_held_out, len(kept) // 5)  # a tiny corpus keeps most of its documents to fit on
    held_out, fitted = kept[:held], kept[held:]
    if not fitted:
        raise ConfigError("the corpus has no text the static model's vocabulary covers: nothing to align it on")
    table = np.asarray(static.embedding, dtype=np.float64)
    means = np.stack([table[pieces[i]].mean(axis=0) for i in fitted])
    gram = means.T @ means + recipe.align_ridge * np.eye(table.shape[1])
    table = table @ np.linalg.solve(gram, means.T @ targets[fitted].astype(np.float64))
    rows = torch.nn.EmbeddingBag.from_pretrained(torch.tensor(table, dtype=torch.float32), freeze=False, mode="mean")
    wanted = torch.tensor(np.asarray(targets, dtype=np.float32))

    def embed(batch: list[int]):
        flat = torch.tensor(np.concatenate([pieces[i] for i in batch]))
        offsets = torch.tensor(np.cumsum([0] + [len(pieces[i]) for i in batch[:-1]]))
        return rows(flat, offsets)

    def cosine(batch: list[int]) -> float | None:
        if not batch:  # a corpus of a handful of documents keeps none out
            return None
        with torch.no_grad():
            return round(float(torch.nn.functional.cosine_similarity(embed(batch), wanted[batch]).mean()), 4)

    report: dict[str, float | None] = {"held_out_texts": len(held_out), "held_out_cosine_linear": cosine(held_out)}
    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    optimizer = torch.optim.Adam(rows.parameters(), lr=recipe.align_learning_rate)
    for _ in range(recipe.align_epochs):
        rng.shuffle(fitted)
        for start in range(0, len(fitted), 32):
            batch = fitted[start : start + 32]
            loss = (1 - torch.nn.functional.cosine_similarity(embed(batch), wanted[batch])).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    report["held_out_cosine"] = cosine(held_out)
    static.embedding = rows.weight.detach().numpy().astype(np.float32)
    return report


def write_static_export(static, base: ResolvedModel, recipe: StaticRecipe, out: Path, alignment: dict[str, object] | None = None) -> None:
    """Write the export folder of model2vec's StaticModel `static`, made from `base` by `recipe` (`alignment`: what
    align_static reported), into `out`."""
    if static.token_mapping is not None or static.weights is not None:  # the recipe never quantises the vocabulary
        raise ConfigError("model2vec returned a quantised vocabulary, which the static graph does not read")
    table = np.asarray(static.embedding, dtype=np.float32)
    (out / ONNX_FILE).write_bytes(static_graph(table, static.unk_token_id))
    tokenizer = static.tokenizer
    tokenizer.no_truncation()
    tokenizer.no_padding()
    tokenizer.save(str(out / TOKENIZER_FILE))
    pad_token = next((t for t in ("[PAD]", "<pad>", "<PAD>") if tokenizer.token_to_id(t) is not None), None)
    config = {
        "model": base.name,
        "model_checksum": hashlib.sha256(table.tobytes()).hexdigest(),
        "dimension": int(table.shape[1]),
        "max_seq_length": MAX_PIECES,
        "pooling": STATIC_POOLING,
        "normalize": True,
        "inputs": ["input_ids", "attention_mask"],
        "pad_token": pad_token or "",
        "pad_token_id": int(tokenizer.token_to_id(pad_token)) if pad_token else 0,
        "profile": "fast",
        "recipe": {
            "method": "model2vec distillation" + (", aligned to the model on the corpus" if alignment is not None else ""),
            "model2vec": version("model2vec"),
            "base_model": base.name,
            "base_model_checksum": base.checksum,
            "vocabulary": int(table.shape[0]),
            **asdict(recipe),
            **({"alignment": alignment} if alignment is not None else {}),
        },
    }
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))


def export_static(base: ResolvedModel, cache_dir: Path | None = None, recipe: StaticRecipe = StaticRecipe()) -> Path:
    """The export folder of the static model distilled from `base` by `recipe`, distilling it on first use (seconds to
    a minute on a small CPU for a MiniLM-sized vocabulary), cached like the transformer exports."""
    folder = export_dir_for(base, cache_dir or default_cache_dir(), f"static{recipe.key()}")
    return cached_export(folder, CONFIG_FILE, lambda out: write_static_export(distill_static(base, recipe), base, recipe, out))
