"""`hybrid train-reranker`: fine-tune a cross-encoder on a labelled split, with hard negatives mined by
our own hybrid retriever, tune how much to trust it on held-out queries, and save a folder the
service loads (torch weights + ONNX export + training.json).

Recipe: the judged queries are split into train and dev (`dev_fraction`, by query). For every train
(query, relevant document) pair, a group of that positive and `negatives` documents sampled from the
hybrid top-`mine_depth` that the qrels do not mark relevant, sampled afresh every epoch. The loss is
listwise softmax cross-entropy over each group (the positive must outscore its own hard negatives),
which suits small training sets better than pointwise BCE. The classifier head starts from scratch
on top of the base model's encoder; the word embeddings are frozen (most of the parameters, little to gain from a few
thousand pairs, and the optimiser step on them dominates CPU time). With a `teacher` (a larger reranker, e.g. our
6-layer one for a `--layers 3` model), the loss adds the KL divergence from the teacher's softmax over each group to the
model's: distillation on our own mined groups. The student then starts from its teacher's own weights unless told
otherwise (the teacher's first layers, its last and its head: `--layers`), not from the untrained base, which trains
a better student in less time (docs/BENCHMARKS.md, "Rerankers").

Then the dev queries' hybrid top-`DEFAULT_RERANK_DEPTH` are scored by the exported model and the
interpolation weight (search.rerank.interpolate) that maximises their nDCG@10 is recorded: a small
domain reranker is rarely better than a tuned hybrid retriever on its own, but it can correct it.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from hybrid_retrieval.common.devices import check_device
from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.common.publish import publish_dir
from hybrid_retrieval.indexer.store import OpenIndex
from hybrid_retrieval.models.cross_encoder import CachingCrossEncoder, load_cross_encoder
from hybrid_retrieval.models.onnx_export import ONNX_SUBDIR, TRAINING_RECORD, export_cross_encoder
from hybrid_retrieval.models.providers import training_device
from hybrid_retrieval.models.registry import ResolvedModel, resolve_model, weights_checksum
from hybrid_retrieval.models.student import keep_layers
from hybrid_retrieval.models.training_loop import Resampled, Schedule, TrainingRecord, fit
from hybrid_retrieval.quality.metrics import chosen_out_of_sample, per_query_scores
from hybrid_retrieval.quality.splits import split_dev
from hybrid_retrieval.search.rerank import DEFAULT_RERANK_DEPTH

logger = logging.getLogger(__name__)

DEFAULT_BASE_MODEL = "all-MiniLM-L6-v2"
WEIGHT_GRID = tuple(round(0.05 * i, 2) for i in range(21))  # interpolation weights tried on the dev queries


@dataclass(frozen=True)
class TrainOptions:
    base_model: str | None = None  # where training starts; None: the teacher when distilling, else DEFAULT_BASE_MODEL
    layers: int | None = None  # keep N of the base model's transformer layers, the first N-1 and the last (None: all)
    max_length: int = 128  # query + document tokens: title and the start of the abstract; CPU time grows ~linearly
    negatives: int = 7  # hard negatives per positive
    mine_depth: int = 30
    epochs: int = 2
    groups_per_step: int = 4
    learning_rate: float = 5e-5
    warmup: float = 0.1
    weight_decay: float = 0.01
    freeze_embeddings: bool = True
    dev_fraction: float = 0.2  # judged queries held out to tune the interpolation weight (0: plain reranking)
    teacher: str | None = None  # a reranker whose scores over each group the model also learns to match (distillation)
    seed: int = 13
    device: str = "auto"

    def __post_init__(self):
        if self.negatives < 1 or self.mine_depth <= self.negatives:
            raise ConfigError("need negatives >= 1 and mine_depth > negatives")
        if self.max_length < 16 or self.epochs < 1 or self.groups_per_step < 1:
            raise ConfigError("max_length >= 16, epochs >= 1 and groups_per_step >= 1 are required")
        if self.layers is not None and self.layers < 1:
            raise ConfigError(f"layers must be >= 1 (or unset for all of the base model's), got {self.layers}")
        if not 0.0 <= self.dev_fraction < 1.0:
            raise ConfigError(f"dev_fraction must be in [0, 1), got {self.dev_fraction}")
        check_device(self.device)

    @property
    def start_model(self) -> str:
        return self.base_model or self.teacher or DEFAULT_BASE_MODEL


@dataclass(frozen=True)
class Group:
    query_id: str
    positive: int  # document index
    negatives: tuple[int, ...]


@dataclass(frozen=True)
class MinedQuery:
    query_id: str
    positives: tuple[int, ...]  # document indices
    pool: tuple[int, ...]  # hard-negative candidates: hybrid top-`mine_depth` minus every judged document


def mine(
    index: OpenIndex,
    queries: dict[str, str],
    qrels: dict[str, dict[str, int]],
    query_ids: list[str],
    mine_depth: int,
    progress: bool = False,
) -> list[MinedQuery]:
    """Each query's judged positives and its hard-negative pool from the hybrid top-`mine_depth`."""
    position = {doc_id: i for i, doc_id in enumerate(index.doc_ids)}
    pipeline = index.pipeline()
    mined = []
    for qid in tqdm(query_ids, desc="mining negatives", disable=not progress):
        positives = tuple(position[d] for d, rel in sorted(qrels[qid].items()) if rel > 0 and d in position)
        if not positives:
            continue
        judged = {position[d] for d in qrels[qid] if d in position}
        hits = pipeline.search(queries[qid], k=mine_depth).ranking.doc_idx.tolist()
        mined.append(MinedQuery(qid, positives, tuple(d for d in hits if d not in judged)))
    return mined


def sample_groups(mined: list[MinedQuery], negatives: int, rng: random.Random) -> list[Group]:
    """One group per positive with `negatives` fresh samples from its query's pool (too small a pool: skipped)."""
    return [
        Group(m.query_id, positive, tuple(rng.sample(m.pool, negatives)))
        for m in mined
        if len(m.pool) >= negatives
        for positive in m.positives
    ]


def tune_interpolation(
    index: OpenIndex, model, queries: dict[str, str], qrels: dict[str, dict[str, int]], depth: int = DEFAULT_RERANK_DEPTH
) -> dict:
    """nDCG@10 of the dev queries' first stage (the index's default spec) reranked to `depth` at every weight
    of WEIGHT_GRID by the pipeline's rerank stage, and the best weight.

    Weight 0 orders like the first stage and weight 1 like the cross-encoder alone, so the record
    shows what the reranker adds; ties go to the smaller weight (the first stage is the known quantity).
    `gain` says whether choosing the weight beats the first stage out of sample: the service reranks by
    default only then."""
    pipeline = index.pipeline(cross_encoder=CachingCrossEncoder(model))  # each pair is scored once, not once per weight
    heads = {qid: pipeline.search(text, k=depth, spec={"rerank": {"enabled": False}}).ranking for qid, text in queries.items()}

    def ndcg(weight: float) -> dict[str, float]:
        run = {}
        for qid, head in heads.items():
            ranking = pipeline.reranker.rerank(queries[qid], head, depth, weight).ranking
            run[qid] = {index.doc_ids[int(i)]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores)}
        return per_query_scores(run, {q: qrels[q] for q in queries}, ("ndcg@10",))["ndcg@10"]

    per_query = [ndcg(w) for w in WEIGHT_GRID]
    grid = {w: sum(values.values()) / len(values) for w, values in zip(WEIGHT_GRID, per_query)}
    best = max(WEIGHT_GRID, key=lambda w: (grid[w], -w))
    # the weight is chosen on these queries: whether reranking helps is judged out of sample (choose on 4 folds,
    # score the 5th), against weight 0, which is the first stage; a tie keeps the first stage
    chosen = chosen_out_of_sample(per_query)
    gain = chosen > grid[0.0]
    if not gain:
        logger.warning(
            "the reranker did not beat the first stage on the %d held-out queries out of sample (nDCG@10 %.4f vs "
            "%.4f): the service will not rerank by default",
            len(queries),
            chosen,
            grid[0.0],
        )
    return {
        "weight": best,
        "normalisation": "zscore",
        "depth": depth,
        "gain": gain,
        "dev": {
            "queries": len(queries),
            "ndcg@10": {"first_stage": grid[0.0], "reranker_only": grid[1.0], "interpolated": grid[best], "chosen_out_of_sample": chosen},
            "grid": {f"{w:g}": v for w, v in grid.items()},
        },
    }


def teacher_scores(teacher, batch: list[Group], queries: dict[str, str], doc_text, group_size: int):
    """The teacher's logits for each group's documents, as a (groups, group_size) tensor (positive first)."""
    import torch

    rows = [teacher.score(queries[g.query_id], [doc_text(d) for d in (g.positive, *g.negatives)]) for g in batch]
    return torch.tensor(np.stack(rows), dtype=torch.float32).view(len(batch), group_size)


def distillation_loss(student, teacher):
    """KL divergence from the teacher's softmax over each group to the student's: the student learns how much the
    teacher prefers each document, not only which one is relevant (a denser signal for a small model)."""
    import torch

    teacher = teacher.to(student.device)
    return torch.nn.functional.kl_div(
        torch.log_softmax(student, -1), torch.log_softmax(teacher, -1), log_target=True, reduction="batchmean"
    )


def _check_layers(base_path: Path, layers: int | None) -> None:
    if layers is not None:
        from transformers import AutoConfig

        available = AutoConfig.from_pretrained(str(base_path)).num_hidden_layers
        if layers > available:
            raise ConfigError(f"--layers {layers}: the base model has {available} layers")


def _keep_layers(model, layers: int | None) -> None:
    """Keep the first `layers` - 1 transformer layers and the last one. The last layer is the one that gathers the
    sentence into [CLS], which the classification head reads: in all-MiniLM-L6-v2 (trained with mean pooling) [CLS]
    barely varies across inputs below it (std 0.001 after the first two layers, 0.22 after layers 1 and 6, 0.25 after
    all six), and a head over the first layers alone did not learn (listwise loss stayed at chance)."""
    if layers is not None:
        last = model.config.num_hidden_layers - 1
        keep_layers(model.base_model, [*range(layers - 1), last])


def _checked_start(out: Path, options: TrainOptions) -> ResolvedModel:
    """The model training starts from, after refusing what would fail later (before minutes of mining): an `out`
    that is not a reranker's folder, a start without torch weights, layers it does not have."""
    if out.exists() and not (out / TRAINING_RECORD).is_file():
        raise ConfigError(f"{out} exists and is not a `hybrid train-reranker` folder: refusing to replace it")
    base = resolve_model(options.start_model)
    if not (base.path / "config.json").is_file():
        raise ConfigError(
            f"{base.path} has no torch model (config.json) to start training from: pass --base-model "
            f"(a teacher exported to ONNX only cannot seed its student)"
        )
    _check_layers(base.path, options.layers)
    return base


def _starting_model(base: ResolvedModel, options: TrainOptions, device: str):
    """The tokenizer and the model training starts from: `base` with one output, cut to `options.layers`, its word
    embeddings frozen when asked."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base.path))
    model = AutoModelForSequenceClassification.from_pretrained(str(base.path), num_labels=1)
    _keep_layers(model, options.layers)
    model = model.to(device)
    if options.freeze_embeddings:
        model.base_model.embeddings.word_embeddings.weight.requires_grad_(False)
    return tokenizer, model


def _group_loss(model, tokenizer, queries: dict[str, str], doc_text, teacher, options: TrainOptions, device: str):
    """A batch of groups' loss: softmax cross-entropy over each group, the positive first (it must outscore its own hard
    negatives), plus the teacher's distillation loss when there is one."""
    import torch

    group_size = 1 + options.negatives

    def loss(batch: list[Group]):
        pairs = [(queries[g.query_id], doc_text(d)) for g in batch for d in (g.positive, *g.negatives)]
        encoded = tokenizer(
            [q for q, _ in pairs],
            [t for _, t in pairs],
            truncation=True,
            max_length=options.max_length,
            padding=True,
            return_tensors="pt",
        ).to(device)
        logits = model(**encoded).logits.view(len(batch), group_size)
        value = torch.nn.functional.cross_entropy(logits, torch.zeros(len(batch), dtype=torch.long, device=device))
        if teacher is not None:
            value = value + distillation_loss(logits, teacher_scores(teacher, batch, queries, doc_text, group_size))
        return value

    return loss


def _record(
    index: OpenIndex, base: ResolvedModel, options: TrainOptions, split: str, groups, dev_ids, device: str, training: TrainingRecord
) -> dict:
    """The training record (training.json) as far as training goes; the export and the tuning add theirs."""
    losses = training.step_losses
    window = max(1, len(losses) // 10)
    group_size = 1 + options.negatives
    return {
        "kind": "reranker",
        "base_model": {"name": base.name, "checksum": base.checksum},
        "options": asdict(options),
        "data": {
            "split": split,
            "queries": len({g.query_id for g in groups}),
            "dev_queries": len(dev_ids),
            "groups_per_epoch": len(groups),
            "pairs": training.epochs * len(groups) * group_size,
            "index": str(index.path),
            "defaults": index.manifest.defaults.to_dict(),
        },
        "device": device,
        "steps": training.steps,
        "loss": {
            "first_10pct": sum(losses[:window]) / window,
            "last_10pct": sum(losses[-window:]) / window,
            "chance": math.log(group_size),
        },
    }


def _tune_exported(index: OpenIndex, dev_queries: dict[str, str], qrels: dict[str, dict[str, int]], device: str, onnx: Path) -> dict:
    """The interpolation weight tuned on the dev queries by the exported model: the one the service will run."""
    return tune_interpolation(index, load_cross_encoder(onnx, device=device), dev_queries, qrels)


def _publish(out: Path, model, tokenizer, record: dict, tune: Callable[[Path], dict] | None, started: float) -> None:
    """Save the model and its ONNX export at `out` atomically, with the interpolation weight `tune` gives for the export
    (none without dev queries); `record["seconds"]` gains each stage's and the total since `started`."""
    trained = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with publish_dir(out) as tmp:
        model.eval().to("cpu")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / TRAINING_RECORD).write_text(json.dumps(record, indent=2))  # the export reads max_length from it
        export_cross_encoder(ResolvedModel(name=str(out), path=tmp, checksum=weights_checksum(tmp)), target=tmp / ONNX_SUBDIR)
        exported = time.perf_counter()
        record["seconds"]["export"] = round(exported - trained, 1)
        if tune is not None:
            record["interpolation"] = tune(tmp / ONNX_SUBDIR)
            record["seconds"]["tuning"] = round(time.perf_counter() - exported, 1)
        record["seconds"]["total"] = round(time.perf_counter() - started, 1)
        (tmp / TRAINING_RECORD).write_text(json.dumps(record, indent=2))


def train_reranker(
    index: OpenIndex,
    queries: dict[str, str],
    qrels: dict[str, dict[str, int]],
    out: Path | str,
    options: TrainOptions = TrainOptions(),
    split: str = "train",
    progress: bool = True,
) -> dict:
    """Train, export ONNX into `out/onnx`, tune the interpolation weight on the dev queries, and
    publish `out` atomically; return the training record."""
    import torch

    started = time.perf_counter()
    out = Path(out)
    base = _checked_start(out, options)
    train_ids, dev_ids = split_dev(queries, qrels, options.dev_fraction, options.seed)
    mined = mine(index, queries, qrels, train_ids, options.mine_depth, progress)
    rng = random.Random(options.seed)
    resample = lambda: sample_groups(mined, options.negatives, rng)  # fresh negatives for every epoch after the first
    batches = Resampled(resample(), resample, options.groups_per_step, rng)
    if not batches.first:
        raise ConfigError("no training groups: no judged query has a relevant document and enough negatives in this index")
    mined_at = time.perf_counter()

    torch.manual_seed(options.seed)
    device = training_device(options.device)
    tokenizer, model = _starting_model(base, options, device)
    doc_text = functools.lru_cache(maxsize=None)(index.doc_text)  # each document recurs in several groups
    teacher = CachingCrossEncoder(load_cross_encoder(options.teacher, device=options.device)) if options.teacher else None
    step = _group_loss(model, tokenizer, queries, doc_text, teacher, options, device)
    schedule = Schedule(options.epochs, batches.steps_per_epoch, options.learning_rate, options.weight_decay, options.warmup)
    training = fit(model, step, batches, schedule, progress=progress)  # no held-out score: the last epoch is kept
    record = _record(index, base, options, split, batches.first, dev_ids, device, training)
    record["seconds"] = {"mining": round(mined_at - started, 1), "training": round(time.perf_counter() - mined_at, 1)}
    tune = functools.partial(_tune_exported, index, {q: queries[q] for q in dev_ids}, qrels, options.device) if dev_ids else None
    _publish(out, model, tokenizer, record, tune, started)
    return record
