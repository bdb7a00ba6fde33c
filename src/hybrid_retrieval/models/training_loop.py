"""The one training loop of every model trained here: the reranker (training.reranker), the dense encoder
(training.embedder) and the small profile's student (models.student).

A trainer gives each epoch's batches and each batch's loss; the loop owns what they share: AdamW over the trainable
parameters, the learning-rate schedule, gradient clipping, the progress bar and, with a held-out score, keeping the
best epoch (the starting weights count as epoch 0) and stopping after `patience` epochs without a gain. It lives here,
not in training/, because the student (a model of this layer) trains with it too.
"""

from __future__ import annotations

import copy
import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from hybrid_retrieval.common.progress import progress_bar

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

T = TypeVar("T")
MAX_GRAD_NORM = 1.0


@dataclass(frozen=True)
class TrainingRecord:
    """What one training run did: every step's loss, epoch by epoch, and, with a held-out score, that score before
    training (epoch 0) and after each epoch run. `best_epoch` is the epoch whose weights the model kept: the best
    held-out one, or the last one run without a held-out score."""

    losses: tuple[tuple[float, ...], ...]
    held_out: tuple[float, ...]
    best_epoch: int

    @property
    def epochs(self) -> int:
        return len(self.losses)

    @property
    def steps(self) -> int:
        return sum(len(epoch) for epoch in self.losses)

    @property
    def step_losses(self) -> list[float]:
        return [loss for epoch in self.losses for loss in epoch]


@dataclass(frozen=True)
class Schedule:
    """AdamW's settings and the learning rate's course: up from 0 over the first `warmup` share of the steps, then
    linearly down to 0 at the last one (transformers' linear schedule with warm-up)."""

    epochs: int
    steps_per_epoch: int
    learning_rate: float
    weight_decay: float = 0.01
    warmup: float = 0.1

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        from transformers import get_linear_schedule_with_warmup

        return get_linear_schedule_with_warmup(optimizer, int(self.warmup * self.steps), self.steps)


@dataclass(frozen=True)
class Resampled(Generic[T]):
    """Epoch 1's batches from `first`, each later epoch's from a fresh `resample()` (new hard negatives), shuffled by
    `rng` and cut into batches of `size`; `drop_last`: without a short last batch (in-batch negatives need company).
    Every sample is as long as `first`, so every epoch has as many steps."""

    first: list[T]
    resample: Callable[[], list[T]]
    size: int
    rng: random.Random
    drop_last: bool = False

    @property
    def steps_per_epoch(self) -> int:
        return len(self.first) // self.size if self.drop_last else math.ceil(len(self.first) / self.size)

    def __call__(self, epoch: int) -> list[list[T]]:
        order = self.first[:] if epoch == 1 else self.resample()
        self.rng.shuffle(order)
        return [order[start : start + self.size] for start in range(0, self.steps_per_epoch * self.size, self.size)]


class _Selection:
    """The held-out score before training and after each epoch, and the weights of the best epoch so far."""

    def __init__(self, model: torch.nn.Module, score: Callable[[], float] | None, patience: int | None):
        self.model, self.score, self.patience = model, score, patience
        self.scores = [score()] if score else []
        self.best = 0
        self.state = copy.deepcopy(model.state_dict()) if score else None

    def stop_after(self, epoch: int) -> bool:
        """Score `epoch`, keep its weights if it is the best yet; whether `patience` epochs have passed without a gain."""
        if self.score is None:
            self.best = epoch
            return False
        self.scores.append(self.score())
        if self.scores[-1] > self.scores[self.best]:  # a tie keeps the earlier epoch
            self.best, self.state = epoch, copy.deepcopy(self.model.state_dict())
            return False
        return self.patience is not None and epoch - self.best >= self.patience

    def note(self, epoch: int) -> str:
        return f", held-out {self.scores[epoch]:.4f} (before training {self.scores[0]:.4f})" if self.scores else ""

    def restore(self) -> None:
        if self.state is not None:
            if self.best == 0:
                logger.warning("no epoch beat the starting weights on the held-out score (%.4f): the model keeps them", self.scores[0])
            self.model.load_state_dict(self.state)


def fit(
    model: torch.nn.Module,
    step: Callable[[Any], torch.Tensor],
    batches: Callable[[int], Sequence[Any]],
    schedule: Schedule,
    held_out: Callable[[], float] | None = None,
    patience: int | None = None,
    desc: str = "training",
    progress: bool = True,
) -> TrainingRecord:
    """Train `model` for `schedule.epochs` epochs, each over `batches(epoch)` (epochs count from 1), minimising
    `step(batch)`, the batch's loss. With `held_out` (a score, higher is better) the model ends with the weights of its
    best epoch, stopping early after `patience` epochs without a gain (None: never); without, with its last."""
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=schedule.learning_rate, weight_decay=schedule.weight_decay)
    scheduler = schedule.scheduler(optimizer)
    selection = _Selection(model, held_out, patience)
    losses: list[tuple[float, ...]] = []
    with progress_bar(schedule.steps, desc, "steps", progress) as bar:
        for epoch in range(1, schedule.epochs + 1):
            model.train()
            epoch_losses = []
            for batch in batches(epoch):
                loss = step(batch)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(trainable, MAX_GRAD_NORM)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                epoch_losses.append(loss.item())
                bar.update()
                bar.set_postfix(loss=f"{sum(epoch_losses[-50:]) / len(epoch_losses[-50:]):.3f}")
            losses.append(tuple(epoch_losses))
            stop = selection.stop_after(epoch)
            logger.info("epoch %d: loss %.4f%s", epoch, sum(epoch_losses) / len(epoch_losses), selection.note(epoch))
            if stop:
                break
    selection.restore()
    return TrainingRecord(tuple(losses), tuple(selection.scores), selection.best)
