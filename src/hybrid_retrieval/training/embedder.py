"""Fine-tune an index's dense encoder (sentence-transformers, torch) on (query, relevant document) examples:
judged queries (`hybrid train-embedder`) or pseudo-queries cut from the corpus (`hybrid adapt`, training.pseudo).

Recipe: contrastive loss over a batch of (query, positive, hard negatives): each query must score its positive
above every other document of the batch (the other queries' positives and negatives: in-batch negatives) and
its own `hard_negatives`, sampled afresh each epoch from our hybrid top-`mine_depth` minus every document the
query is known to match. A document that is relevant to a row's query but sits in another column (two queries
sharing a positive) is masked out of that row rather than pushed away. The score is `scale` x cosine, as in
sentence-transformers' MultipleNegativesRankingLoss.

Model selection: a held-out slice of the queries is scored before training and after every epoch, by dense
retrieval over a pool (each held-out query's hybrid top-`eval_depth` and its relevant documents: re-embedding
a whole corpus every epoch would cost more than the epoch); the best epoch is kept, training stops after
`patience` epochs without a gain, and the base model counts as epoch 0, so a recipe that hurts is reported as
such. The folder written is a sentence-transformers model plus `training.json`; `hybrid index --model` and
`hybrid reembed` export it to ONNX like any other model.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from hybrid_retrieval.common.devices import check_device
from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.common.memory import peak_memory_mib
from hybrid_retrieval.common.publish import publish_dir
from hybrid_retrieval.indexer.store import OpenIndex, index_model
from hybrid_retrieval.models.onnx_export import TRAINING_RECORD
from hybrid_retrieval.models.providers import training_device
from hybrid_retrieval.models.training_loop import Resampled, Schedule, TrainingRecord, fit
from hybrid_retrieval.quality.metrics import per_query_scores
from hybrid_retrieval.quality.splits import split_dev
from hybrid_retrieval.training.pseudo import generate
from hybrid_retrieval.training.reranker import MinedQuery, mine

logger = logging.getLogger(__name__)

METRIC = "ndcg@10"


@dataclass(frozen=True)
class EmbedderOptions:
    epochs: int = 3
    batch_size: int = 32  # examples per step; every other example's documents are in-batch negatives
    hard_negatives: int = 1  # per example, from the hybrid top-`mine_depth`
    mine_depth: int = 30
    learning_rate: float = 2e-5
    warmup: float = 0.1
    weight_decay: float = 0.01
    scale: float = 20.0  # scores are scale x cosine (temperature 0.05)
    dev_fraction: float = 0.2  # queries held out for model selection
    eval_depth: int = 50  # the held-out pool: each held-out query's hybrid top-N and its relevant documents
    patience: int = 1  # epochs without a held-out gain before stopping
    seed: int = 13
    device: str = "auto"

    def __post_init__(self):
        if self.epochs < 1 or self.batch_size < 2 or self.patience < 1:
            raise ConfigError("epochs >= 1, batch_size >= 2 (in-batch negatives need company) and patience >= 1 are required")
        if self.hard_negatives < 0 or self.mine_depth <= self.hard_negatives:
            raise ConfigError("need hard_negatives >= 0 and mine_depth > hard_negatives")
        if not 0.0 < self.dev_fraction < 1.0:
            raise ConfigError(f"dev_fraction must be in (0, 1): model selection needs held-out queries, got {self.dev_fraction}")
        if self.eval_depth < 10 or self.learning_rate <= 0 or self.scale <= 0:
            raise ConfigError("eval_depth >= 10, learning_rate > 0 and scale > 0 are required")
        check_device(self.device)


@dataclass(frozen=True)
class Example:
    query: str
    positive: int  # document index
    negatives: tuple[int, ...]
    positive_text: str | None = None  # what the positive reads as (None: the indexed document; a pseudo-query's is cut out)


def sample_examples(
    mined: list[MinedQuery], queries: dict[str, str], hard_negatives: int, rng: random.Random, passages: dict[str, str] | None = None
) -> list[Example]:
    """One example per (query, relevant document), with fresh negatives from the query's pool (too small a pool: skipped);
    `passages` gives a query's positive text in place of its document's."""
    return [
        Example(queries[m.query_id], positive, tuple(rng.sample(m.pool, hard_negatives)), (passages or {}).get(m.query_id))
        for m in mined
        if len(m.pool) >= hard_negatives
        for positive in m.positives
    ]


def relevant_mask(examples: list[Example], columns: list[int], relevant: dict[str, frozenset[int]]):
    """mask[i, j]: column j's document is relevant to example i's query but is not its own positive (column i)."""
    import torch

    mask = torch.tensor([[doc in relevant[e.query] for doc in columns] for e in examples], dtype=torch.bool)
    mask[torch.arange(len(examples)), torch.arange(len(examples))] = False
    return mask


def contrastive_loss(queries, documents, mask, scale: float):
    """Cross-entropy of each query (row) over every document of the batch (columns), its positive at column i."""
    import torch

    scores = scale * queries @ documents.T
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.nn.functional.cross_entropy(scores, torch.arange(len(queries), device=scores.device))


class HeldOut:
    """Held-out queries scored by dense retrieval over a fixed pool of documents (see the module docstring)."""

    def __init__(
        self,
        index: OpenIndex,
        queries: dict[str, str],
        qrels: dict[str, dict[str, int]],
        depth: int,
        progress: bool,
        passages: dict[str, str] | None = None,
    ):
        pipeline = index.pipeline()
        positions = index.doc_positions
        pool = {positions[d] for rels in qrels.values() for d in rels if d in positions}
        for text in tqdm(queries.values(), desc="held-out pool", disable=not progress):
            pool.update(pipeline.search(text, k=depth).ranking.doc_idx.tolist())
        self.pool = sorted(pool)
        # a pseudo-query's document is scored as it was trained on: without the query's own words
        cut = {positions[d]: passages[q] for q in queries if q in (passages or {}) for d in qrels[q] if d in positions}
        self.texts = [cut.get(i) or index.doc_text(i) for i in self.pool]
        self.pool_ids = [index.doc_ids[i] for i in self.pool]
        self.queries, self.qrels, self.progress = queries, qrels, progress

    def score(self, model, batch_size: int = 32) -> float:
        """Mean nDCG@10 of the held-out queries under `model` (sentence-transformers)."""
        docs = model.encode(
            self.texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=self.progress
        )
        qids = list(self.queries)
        vectors = model.encode(
            [self.queries[q] for q in qids],
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        scores = vectors @ docs.T
        top = np.argsort(-scores, axis=1)[:, :100]
        run = {q: {self.pool_ids[j]: float(scores[i, j]) for j in top[i]} for i, q in enumerate(qids)}
        values = per_query_scores(run, self.qrels, (METRIC,))[METRIC]
        return sum(values.values()) / len(values)


def _contrastive_step(model, relevant: dict[str, frozenset[int]], doc_text, scale: float, device: str):
    """A batch of examples' in-batch contrastive loss: every example's positive and hard negatives are columns."""
    import torch
    from sentence_transformers.util import batch_to_device

    def embed(texts: list[str]):
        features = batch_to_device(model.preprocess(texts), device)
        return torch.nn.functional.normalize(model(features)["sentence_embedding"], dim=-1)

    def loss(batch: list[Example]):
        columns = [e.positive for e in batch] + [d for e in batch for d in e.negatives]
        mask = relevant_mask(batch, columns, relevant).to(device)
        texts = [e.positive_text or doc_text(e.positive) for e in batch] + [doc_text(d) for d in columns[len(batch) :]]
        return contrastive_loss(embed([e.query for e in batch]), embed(texts), mask, scale)

    return loss


@dataclass(frozen=True)
class _Prepared:
    """What training needs besides the model: the mined training queries, the batches of examples, each training
    query's relevant documents (masked out of its row), the held-out queries."""

    mined: list[MinedQuery]
    batches: Resampled[Example]
    relevant: dict[str, frozenset[int]]
    held_out: HeldOut


def _prepare(
    index: OpenIndex, queries, qrels, train_ids: list[str], dev_ids: list[str], options: EmbedderOptions, passages, progress
) -> _Prepared:
    """Mine `train_ids`' hard negatives, sample the first epoch's examples, pool the held-out `dev_ids`' documents."""
    mined = mine(index, queries, qrels, train_ids, options.mine_depth, progress)
    rng = random.Random(options.seed)
    resample = lambda: sample_examples(mined, queries, options.hard_negatives, rng, passages)
    # drop_last: a short last batch would have few in-batch negatives
    batches = Resampled(resample(), resample, options.batch_size, rng, drop_last=True)
    if batches.steps_per_epoch == 0:
        raise ConfigError(
            f"{len(batches.first)} training examples, fewer than one batch of {options.batch_size}: "
            "need more judged queries (or a smaller --batch-size)"
        )
    positions = index.doc_positions
    relevant = {queries[q]: frozenset(positions[d] for d, r in qrels[q].items() if r > 0 and d in positions) for q in train_ids}
    held_out = HeldOut(index, {q: queries[q] for q in dev_ids}, {q: qrels[q] for q in dev_ids}, options.eval_depth, progress, passages)
    return _Prepared(mined, batches, relevant, held_out)


def _fit(model, index: OpenIndex, prepared: _Prepared, options: EmbedderOptions, device: str, progress: bool) -> TrainingRecord:
    """Train `model` on the prepared batches, fresh hard negatives every epoch after the first, keeping the epoch best on
    the held-out queries (epoch 0: the base model) and stopping after `options.patience` epochs without a better one."""
    batches, held_out = prepared.batches, prepared.held_out
    schedule = Schedule(options.epochs, batches.steps_per_epoch, options.learning_rate, options.weight_decay, options.warmup)
    step = _contrastive_step(model, prepared.relevant, index.doc_text, options.scale, device)
    return fit(model, step, batches, schedule, lambda: held_out.score(model), options.patience, progress=progress)


def _record(
    index: OpenIndex, base, options: EmbedderOptions, data: dict, prepared: _Prepared, device: str, training: TrainingRecord
) -> dict:
    """The training record (training.json) but for its seconds. The loss curve is rounded, and each epoch's loss is the
    mean of its rounded steps (as the record always had it)."""
    curve = [round(loss, 4) for loss in training.step_losses]
    per_epoch = [{"epoch": 0, METRIC: training.held_out[0]}]
    for epoch, losses in enumerate(training.losses, 1):
        rounded = [round(loss, 4) for loss in losses]
        per_epoch.append({"epoch": epoch, METRIC: training.held_out[epoch], "loss": sum(rounded) / len(rounded)})
    held_out = prepared.held_out
    return {
        "kind": "embedder",
        "base_model": {"name": base.name, "checksum": base.checksum},
        "options": asdict(options),
        "data": {
            **data,
            "index": str(index.path),
            "train_queries": len(prepared.mined),
            "examples_per_epoch": len(prepared.batches.first),
            "held_out_queries": len(held_out.queries),
            "held_out_pool": len(held_out.pool),
            "held_out_ids": sorted(held_out.queries),
        },
        "device": device,
        "held_out": {
            "metric": METRIC,
            "before": training.held_out[0],
            "after": training.held_out[training.best_epoch],
            "best_epoch": training.best_epoch,
            "per_epoch": per_epoch,
        },
        "loss": {"curve": curve, "chance": math.log(options.batch_size * (1 + options.hard_negatives))},
    }


def fine_tune(  # noqa: PLR0913
    index: OpenIndex,
    queries: dict[str, str],
    qrels: dict[str, dict[str, int]],
    train_ids: list[str],
    dev_ids: list[str],
    out: Path | str,
    options: EmbedderOptions,
    data: dict,
    progress: bool = True,
    passages: dict[str, str] | None = None,
) -> dict:
    """Train the index's encoder on `train_ids` (their qrels' relevant documents are the positives), select the epoch on
    `dev_ids`, publish the model folder at `out` atomically and return the training record; `data` describes the data.
    `passages`: a query's positive text in place of its document's (pseudo-queries: the document without the query)."""
    import torch
    from sentence_transformers import SentenceTransformer

    started = time.perf_counter()
    out = Path(out)
    if out.exists() and not (out / TRAINING_RECORD).is_file():
        raise ConfigError(f"{out} exists and is not a trained model folder: refusing to replace it")
    base = index_model(index.path)
    prepared = _prepare(index, queries, qrels, train_ids, dev_ids, options, passages, progress)
    prepared_at = time.perf_counter()

    torch.manual_seed(options.seed)
    device = training_device(options.device)
    model = SentenceTransformer(str(base.path), device=device)
    training = _fit(model, index, prepared, options, device, progress)
    record = _record(index, base, options, data, prepared, device, training)
    record["seconds"] = {"preparation": round(prepared_at - started, 1), "training": round(time.perf_counter() - prepared_at, 1)}
    record["peak_rss_mib"] = peak_memory_mib()
    out.parent.mkdir(parents=True, exist_ok=True)
    with publish_dir(out) as tmp:
        model.to("cpu").save(str(tmp))
        record["seconds"]["total"] = round(time.perf_counter() - started, 1)
        (tmp / TRAINING_RECORD).write_text(json.dumps(record, indent=2))
    return record


# Supervised training's defaults: the learning rate was chosen on held-out judged queries (docs/experiments.md);
# label-free adaptation keeps the library default, 2e-5.
SUPERVISED = EmbedderOptions(learning_rate=4e-5)


def train_embedder(
    index: OpenIndex,
    queries: dict[str, str],
    qrels: dict[str, dict[str, int]],
    out: Path | str,
    options: EmbedderOptions = SUPERVISED,
    split: str = "train",
    progress: bool = True,
) -> dict:
    """`hybrid train-embedder`: fine-tune on the judged queries of a train/dev split, a slice of them held out."""
    train_ids, dev_ids = split_dev(queries, qrels, options.dev_fraction, options.seed)
    return fine_tune(index, queries, qrels, train_ids, dev_ids, out, options, {"recipe": "supervised", "split": split}, progress)


def adapt_embedder(
    index: OpenIndex,
    out: Path | str,
    options: EmbedderOptions = EmbedderOptions(),
    recipe: str = "ict",
    max_queries: int = 2000,
    filter_depth: int = 10,
    progress: bool = True,
) -> dict:
    """`hybrid adapt`: fine-tune on filtered pseudo-queries (training.pseudo), no labels anywhere; a slice of the
    pseudo-queries is held out for the epoch selection."""
    pseudo = generate(index, recipe, max_queries, filter_depth, options.seed, progress)
    train_ids, dev_ids = split_dev(pseudo.queries, pseudo.qrels, options.dev_fraction, options.seed)
    return fine_tune(
        index,
        pseudo.queries,
        pseudo.qrels,
        train_ids,
        dev_ids,
        out,
        options,
        {"recipe": f"pseudo:{recipe}", "split": "pseudo-queries", "pseudo": pseudo.stats},
        progress,
        pseudo.passages,
    )
