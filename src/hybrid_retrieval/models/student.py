"""The `small` encoder profile: a shallower transformer distilled from an embedding model on a corpus's own text.

The student keeps some of the teacher's layers (`StudentRecipe.layers`, spread over its depth), its embeddings
(frozen) and its pooling, and is trained, without labels, so that its normalised pooled vectors reproduce the
teacher's (loss 1 - cosine) on a sample of the corpus: documents (title and text), their sentences and titles. A
held-out part of the sample measures the student's cosine to the teacher before training and after each epoch; the
best epoch is kept. The folder written is a sentence-transformers model plus `training.json` (kind `student`), so
`hybrid index --model` takes it like any model, and its ONNX export (int8 too) names the profile and the recipe.

Training needs torch and transformers (the `index` extra); what it writes is served without them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import random
import re
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.common.progress import progress_bar
from hybrid_retrieval.common.publish import publish_dir
from hybrid_retrieval.models.onnx_export import STUDENT_KIND, TRAINING_RECORD, pool, training_record
from hybrid_retrieval.models.providers import training_device
from hybrid_retrieval.models.registry import ResolvedModel
from hybrid_retrieval.models.training_loop import Schedule, TrainingRecord, fit

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

STUDENT_FORMAT = 1  # bump when the method changes (loss, pooling, sampling), so cached students are made again
MIN_TEXTS = 20  # a tenth of them (at least one) is held out to choose the epoch
SENTENCE_WORDS = (5, 60)  # a sentence shorter or longer than this (in words) is not a training text
_NOT_COPIED = ("*.safetensors", "*.bin", "*.pt", "*.h5", "*.msgpack", "*.onnx", "onnx", "openvino", "README.md")


@dataclass(frozen=True)
class StudentRecipe:
    """How the student is made. The defaults led on scifact's train queries (dense nDCG@10; docs/experiments.md, "A
    3-layer student on a GPU" and "The small profile"): layers 2, 4 and 6 of six, six epochs over 5,000 documents, 30,000
    of their sentences and their titles."""

    layers: tuple[int, ...] = (1, 3, 5)  # the teacher's layers kept, 0-based
    epochs: int = 6
    documents: int = 5_000  # documents sampled from the corpus (their sentences and titles come with them)
    sentences: int = 30_000  # sentences kept of those documents
    max_length: int = 256  # word pieces per training text
    batch_size: int = 128
    learning_rate: float = 1e-4
    held_out: int = 500  # sampled texts kept out of training: the cosine to the teacher on them picks the epoch
    seed: int = 0

    def __post_init__(self):
        if not self.layers or list(self.layers) != sorted(set(self.layers)) or self.layers[0] < 0:
            raise ConfigError(f"student layers must be distinct teacher layer numbers in increasing order, got {list(self.layers)}")
        for name in ("epochs", "documents", "max_length", "batch_size", "held_out"):
            if getattr(self, name) < 1:
                raise ConfigError(f"student {name} must be >= 1, got {getattr(self, name)}")
        if self.sentences < 0:
            raise ConfigError(f"student sentences must be >= 0, got {self.sentences}")
        if not 0 < self.learning_rate < 1:
            raise ConfigError(f"student learning rate (--lr) must be in (0, 1), got {self.learning_rate}")

    def key(self) -> str:
        """Keys a cached student: the recipe and the method's format."""
        spec = {**asdict(self), "format": STUDENT_FORMAT}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]


def training_texts(documents: Iterable[tuple[str, str]], recipe: StudentRecipe = StudentRecipe()) -> list[str]:
    """The texts a student is trained on, from (title, text) pairs: a uniform sample of `recipe.documents` documents
    (reservoir sampling, so a corpus of any size is read once in bounded memory), each as title and text, then
    `recipe.sentences` of their sentences and their titles, each text once. Deterministic for a corpus and a recipe."""
    rng = random.Random(recipe.seed)
    sample = sample_documents(documents, recipe.documents, rng)
    shortest, longest = SENTENCE_WORDS
    sentences = [s for _, text in sample for s in re.split(r"(?<=[.!?])\s+", text) if shortest <= len(s.split()) <= longest]
    rng.shuffle(sentences)
    whole = [f"{title} {text}".strip() for title, text in sample]
    texts = whole + sentences[: recipe.sentences] + [title.strip() for title, _ in sample]
    return [t for t in dict.fromkeys(texts) if t]  # once each: a one-sentence document is also its sentence


def sample_documents(documents: Iterable[tuple[str, str]], size: int, rng: random.Random) -> list[tuple[str, str]]:
    """A uniform sample of `size` (title, text) pairs, the corpus read once in bounded memory (reservoir sampling)."""
    sample: list[tuple[str, str]] = []
    for seen, document in enumerate(documents):
        if len(sample) < size:
            sample.append(document)
        elif (slot := rng.randrange(seen + 1)) < size:
            sample[slot] = document
    return sample


def texts_digest(texts: list[str]) -> str:
    """Identifies a training sample (it keys the cached student of a corpus)."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def is_student(model: ResolvedModel) -> bool:
    return (training_record(model.path) or {}).get("kind") == STUDENT_KIND


def _pooling(folder: Path) -> str:
    """The teacher's pooling (sentence-transformers' 1_Pooling config; mean where the folder has none)."""
    configs = sorted(folder.glob("*Pooling*/config.json"))
    if not configs:
        return "mean"
    config = json.loads(configs[0].read_text())
    if config.get("pooling_mode_cls_token"):
        return "cls"
    if config.get("pooling_mode_mean_tokens", True):
        return "mean"
    raise ConfigError(f"the small profile distils models with mean or CLS pooling; {folder} pools otherwise")


class _Encoder:
    """Pooled, normalised vectors of a transformer, in batches of similar length (less padding)."""

    def __init__(self, tokenizer, pooling: str, max_length: int, device: str):
        self.tokenizer, self.pooling, self.max_length, self.device = tokenizer, pooling, max_length, device

    def batch(self, texts: list[str]):
        return self.tokenizer(texts, truncation=True, max_length=self.max_length, padding=True, return_tensors="pt").to(self.device)

    def forward(self, model, batch):
        import torch

        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.startswith("cuda")):
            hidden = model(**batch).last_hidden_state.float()
        return pool(hidden, batch["attention_mask"], self.pooling)

    def encode(self, model, texts: list[str], batch_size: int, bar=None):
        import torch

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = torch.empty(len(texts), model.config.hidden_size, device=self.device)
        model.eval()
        with torch.no_grad():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                out[rows] = self.forward(model, self.batch([texts[i] for i in rows]))
                if bar is not None:
                    bar.update(len(rows))
        return out


def _layer_list(encoder) -> Any:
    layers = getattr(getattr(encoder, "encoder", None), "layer", None)
    if layers is None:
        raise ConfigError(f"dropping layers needs a BERT-style encoder (encoder.layer); {type(encoder).__name__} has none")
    return layers


def check_layers(encoder, layers: Sequence[int]) -> None:
    available = len(_layer_list(encoder))
    if layers[-1] >= available:
        raise ConfigError(f"layers {list(layers)} do not exist in a model of {available} layers (0 to {available - 1})")


def keep_layers(encoder, layers: Sequence[int]) -> None:
    """Keep only `layers` (0-based, increasing) of a BERT-style encoder's transformer layers, in place (the student
    here; the smaller rerankers of training.reranker)."""
    import torch

    check_layers(encoder, layers)
    encoder.encoder.layer = torch.nn.ModuleList([encoder.encoder.layer[i] for i in layers])
    encoder.config.num_hidden_layers = len(layers)


def make_student(teacher, layers: tuple[int, ...]):
    """A copy of `teacher` keeping `layers` (its embeddings frozen)."""
    student = copy.deepcopy(teacher)
    keep_layers(student, layers)
    for parameter in student.embeddings.parameters():
        parameter.requires_grad_(False)
    return student


def _length_batches(texts: list[str], rows: list[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """`rows` shuffled into batches of texts of similar length (sorted within windows of 50 batches), in random order."""
    rows = rows[:]
    rng.shuffle(rows)
    window = batch_size * 50
    batches = []
    for start in range(0, len(rows), window):
        chunk = sorted(rows[start : start + window], key=lambda i: len(texts[i]))
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


class _StudentSchedule(Schedule):
    """The student's learning rate: up over the first `warmup` share of the steps (at least one, counting the first as
    one), times a fall to 0 over all of them. Not the trainers' linear warm-up, so that a recipe makes the same student
    it always made (STUDENT_FORMAT)."""

    def scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        import torch

        steps, warmup = self.steps, max(1, int(self.warmup * self.steps))
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / warmup) * max(0.0, (steps - k) / steps))


def _train(
    student, encoder: _Encoder, texts: list[str], targets, rows: tuple[list[int], list[int]], recipe: StudentRecipe, rng, progress: bool
) -> TrainingRecord:
    """Train `student` for `1 - cosine` to the teacher's `targets` on the texts of `rows`' first part, keeping the epoch
    whose cosine on the second (held out) was best (epoch 0: the teacher's layers as they are)."""
    train, held = rows

    def loss(batch: list[int]):
        vectors = encoder.forward(student, encoder.batch([texts[i] for i in batch]))
        return (1 - (vectors * targets[batch]).sum(-1)).mean()

    def held_out_cosine() -> float:
        vectors = encoder.encode(student, [texts[i] for i in held], recipe.batch_size)
        return round(float((vectors * targets[held]).sum(-1).mean()), 4)

    schedule = _StudentSchedule(recipe.epochs, math.ceil(len(train) / recipe.batch_size), recipe.learning_rate, warmup=0.05)
    batches = lambda epoch: _length_batches(texts, train, recipe.batch_size, rng)
    return fit(student, loss, batches, schedule, held_out_cosine, desc="distilling", progress=progress)


def _teacher_and_student(base: ResolvedModel, texts: list[str], recipe: StudentRecipe, device: str, progress: bool):
    """The encoder (the teacher's tokenizer and pooling), the teacher's vectors of `texts` and the student cut from it."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base.path))
    teacher = AutoModel.from_pretrained(str(base.path), dtype=torch.float32).to(device)  # trained in fp32 (bf16 autocast on a GPU)
    check_layers(teacher, recipe.layers)  # before the teacher's pass, which can take long
    encoder = _Encoder(tokenizer, _pooling(base.path), recipe.max_length, device)
    with progress_bar(len(texts), "teacher vectors", "texts", progress) as bar:
        targets = encoder.encode(teacher, texts, recipe.batch_size, bar)
    return encoder, targets, make_student(teacher, recipe.layers).to(device)


def distil_student(
    base: ResolvedModel,
    texts: list[str],
    out: Path | str,
    recipe: StudentRecipe = StudentRecipe(),
    device: str = "auto",
    progress: bool = True,
    keep_existing: bool = False,
) -> dict:
    """Distil a student of `base` on `texts` (training_texts) and publish it at `out` (a sentence-transformers folder
    with training.json), replacing a student there (or keeping it: `keep_existing`, for a cache); returns the training
    record. A folder at `out` that is not a student is refused before any work."""
    try:
        import torch
        import transformers  # noqa: F401  (checked here, before any work; _teacher_and_student loads the models)
    except ImportError as exc:
        raise ConfigError(f"distilling the small profile needs torch and transformers ({exc.name} is missing)") from None
    out = Path(out)
    if out.exists() and (training_record(out) or {}).get("kind") != STUDENT_KIND:
        raise ConfigError(f"{out} exists and is not a student's folder: refusing to replace it")
    if len(texts) < MIN_TEXTS:
        raise ConfigError(
            f"distilling a student needs at least {MIN_TEXTS} training texts, got {len(texts)}: "
            "embed a corpus this small with the full profile"
        )
    started = time.perf_counter()
    device = training_device(device)
    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    encoder, targets, student = _teacher_and_student(base, texts, recipe, device, progress)
    order = list(range(len(texts)))
    rng.shuffle(order)
    held = order[: min(recipe.held_out, len(texts) // 10 or 1)]
    train = order[len(held) :]

    training = _train(student, encoder, texts, targets, (train, held), recipe, rng, progress)
    curve, best_epoch = list(training.held_out), training.best_epoch
    record = {
        "kind": STUDENT_KIND,
        "base_model": base.name,
        "base_model_checksum": base.checksum,
        "recipe": {**asdict(recipe), "layers": list(recipe.layers)},
        "texts": {"training": len(train), "held_out": len(held), "digest": texts_digest(texts)},
        "held_out": {"metric": "cosine to the teacher", "by_epoch": curve, "best_epoch": best_epoch},
        "device": device,
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_student(base, student.cpu(), record, out, keep_existing)
    logger.info(
        "distilled a %d-layer student of %s: held-out cosine %.4f -> %.4f", len(recipe.layers), base.name, curve[0], curve[best_epoch]
    )
    return record


def write_student(base: ResolvedModel, student, record: dict, out: Path, keep_existing: bool = False) -> None:
    """Publish `student` (a transformers model) at `out` as a sentence-transformers folder: the teacher's tokenizer,
    pooling and module files, the student's config and weights, and `record` as training.json."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with publish_dir(out, keep_existing=keep_existing) as tmp:
        shutil.copytree(base.path, tmp, ignore=shutil.ignore_patterns(*_NOT_COPIED), dirs_exist_ok=True)
        student.save_pretrained(str(tmp))
        (tmp / TRAINING_RECORD).write_text(json.dumps(record, indent=2))
