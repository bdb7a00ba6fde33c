"""`hybrid train-reranker`: fine-tune a cross-encoder on a labelled split, with hard negatives mined by
our own hybrid retriever, and save a folder the service loads (torch weights + ONNX export).

Recipe: for every judged (query, relevant document) pair, a group of that positive and
`negatives` documents sampled from the hybrid top-`mine_depth` that the qrels do not mark relevant.
The loss is listwise softmax cross-entropy over each group (the positive must outscore its own hard
negatives), which suits small training sets better than pointwise BCE. The classifier head starts
from scratch on top of the base model's encoder; the word embeddings are frozen (most of the
parameters, little to gain from a few thousand pairs, and the optimiser step on them dominates CPU
time).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

TRAINING_RECORD = "training.json"


@dataclass(frozen=True)
class TrainOptions:
    base_model: str = "all-MiniLM-L6-v2"
    max_length: int = 128  # query + document tokens: title and the start of the abstract; CPU time grows ~linearly
    negatives: int = 3  # hard negatives per positive
    mine_depth: int = 30
    epochs: int = 1
    groups_per_step: int = 4
    learning_rate: float = 5e-5
    warmup: float = 0.1
    weight_decay: float = 0.01
    freeze_embeddings: bool = True
    seed: int = 13
    device: str = "auto"

    def __post_init__(self):
        if self.negatives < 1 or self.mine_depth <= self.negatives:
            raise ValueError("need negatives >= 1 and mine_depth > negatives")
        if self.max_length < 16 or self.epochs < 1 or self.groups_per_step < 1:
            raise ValueError("max_length >= 16, epochs >= 1 and groups_per_step >= 1 are required")


@dataclass(frozen=True)
class Group:
    query_id: str
    positive: int  # document index
    negatives: tuple[int, ...]


def mine_groups(index, queries: dict[str, str], qrels: dict[str, dict[str, int]], options: TrainOptions,
                progress: bool = False) -> list[Group]:
    """One group per judged positive: the positive and hard negatives from the hybrid top-`mine_depth`."""
    from tqdm import tqdm

    from evaluation.runner import doc_ids

    position = {doc_id: i for i, doc_id in enumerate(doc_ids(index))}
    pipeline = index.pipeline()
    rng = random.Random(options.seed)
    groups = []
    for qid in tqdm(sorted(qrels), desc="mining negatives", disable=not progress):
        positives = [position[d] for d, rel in sorted(qrels[qid].items()) if rel > 0 and d in position]
        if qid not in queries or not positives:
            continue
        judged = {position[d] for d in qrels[qid] if d in position}
        hits = pipeline.search(queries[qid], k=options.mine_depth).ranking.doc_idx.tolist()
        pool = [d for d in hits if d not in judged]
        if len(pool) < options.negatives:
            continue
        for positive in positives:
            groups.append(Group(qid, positive, tuple(rng.sample(pool, options.negatives))))
    return groups


def _torch_device(device: str) -> str:
    import torch

    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"unknown device {device!r}; valid: auto, cpu, gpu")
    if device != "cpu" and torch.cuda.is_available():
        return "cuda"
    if device == "gpu":
        logger.warning("GPU requested but torch sees no CUDA device: training on CPU")
    return "cpu"


def train_reranker(index, queries: dict[str, str], qrels: dict[str, dict[str, int]], out: Path | str,
                   options: TrainOptions = TrainOptions(), split: str = "train", progress: bool = True) -> dict:
    """Train, save to `out` (published atomically), export ONNX into `out/onnx`; return the training record."""
    import torch
    from tqdm import tqdm
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        get_linear_schedule_with_warmup,
    )

    from models.cross_encoder import ONNX_SUBDIR
    from models.onnx_export import export_cross_encoder
    from models.registry import ResolvedModel, resolve_model, weights_checksum

    started = time.perf_counter()
    out = Path(out)
    base = resolve_model(options.base_model)
    groups = mine_groups(index, queries, qrels, options, progress)
    if not groups:
        raise ValueError("no training groups: no judged query has a relevant document in this index")
    mined = time.perf_counter()

    torch.manual_seed(options.seed)
    device = _torch_device(options.device)
    tokenizer = AutoTokenizer.from_pretrained(str(base.path))
    model = AutoModelForSequenceClassification.from_pretrained(str(base.path), num_labels=1).to(device)
    if options.freeze_embeddings:
        model.base_model.embeddings.word_embeddings.weight.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=options.learning_rate, weight_decay=options.weight_decay)
    steps = options.epochs * math.ceil(len(groups) / options.groups_per_step)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(options.warmup * steps), steps)
    doc_text = functools.lru_cache(maxsize=None)(index.doc_text)  # each document recurs in several groups

    rng = random.Random(options.seed)
    group_size = 1 + options.negatives
    losses = []
    model.train()
    bar = tqdm(total=steps, desc="training", disable=not progress)
    for _ in range(options.epochs):
        order = groups[:]
        rng.shuffle(order)
        for start in range(0, len(order), options.groups_per_step):
            batch = order[start : start + options.groups_per_step]
            pairs = [(queries[g.query_id], doc_text(d)) for g in batch for d in (g.positive, *g.negatives)]
            encoded = tokenizer([q for q, _ in pairs], [t for _, t in pairs], truncation=True,
                                max_length=options.max_length, padding=True, return_tensors="pt").to(device)
            logits = model(**encoded).logits.view(len(batch), group_size)
            # the positive is column 0 of every group
            loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(batch), dtype=torch.long, device=device))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(float(loss))
            bar.update()
            bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.3f}")
    bar.close()
    trained = time.perf_counter()

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the service may run as another user
    try:
        model.eval().to("cpu")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        window = max(1, len(losses) // 10)
        record = {
            "base_model": {"name": base.name, "checksum": base.checksum},
            "options": asdict(options),
            "data": {"split": split, "queries": len({g.query_id for g in groups}), "groups": len(groups),
                     "pairs": len(groups) * group_size, "index": str(index.path),
                     "fusion": index.manifest["fusion"]["default"]},
            "device": device,
            "steps": len(losses),
            "loss": {"first_10pct": sum(losses[:window]) / window, "last_10pct": sum(losses[-window:]) / window,
                     "chance": math.log(group_size)},
            "seconds": {"mining": round(mined - started, 1), "training": round(trained - mined, 1)},
        }
        (tmp / TRAINING_RECORD).write_text(json.dumps(record, indent=2))
        resolved = ResolvedModel(name=str(out), path=tmp, checksum=weights_checksum(tmp))
        export_cross_encoder(resolved, target=tmp / ONNX_SUBDIR)
        record["seconds"]["export"] = round(time.perf_counter() - trained, 1)
        record["seconds"]["total"] = round(time.perf_counter() - started, 1)
        (tmp / TRAINING_RECORD).write_text(json.dumps(record, indent=2))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record
