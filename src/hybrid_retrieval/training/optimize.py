"""`hybrid optimize`: from judged queries to the best served pipeline, each step kept only if it wins on queries it
never saw.

The judged queries are split once, by query, into a fit part and a held-out part (`Split`, recorded in the work
folder). Everything is fitted on the fit part: the fusion, the hubness correction's betas, the encoder (whose own
epoch choice and fusion re-tuning use a slice of the fit part), the reranker and its weight (another slice). The
held-out part only judges: each step starts from the state the kept steps left, and its result is kept when its
held-out nDCG@10 beats that state's with the paired randomisation test at p < `SIGNIFICANCE_LEVEL` (0.05).

Steps, in order (`STEPS`): the fusion, QB-Norm hubness correction, encoder fine-tuning + re-embedding (the fusion
and a kept correction re-fitted for the new model), reranker training. Chunk sizes are not searched: they need a
rebuild per candidate (the passage scoring of a chunked index is tuned with the fusion).

Budget: the training steps are sized to what is left of `budget_minutes` after the cheap ones, from a measured
cost per text on this machine (`Costs`): epochs first, then examples; a step that cannot fit one epoch is skipped
and says so. Resume: the state is saved after every step; a rerun with the same split continues after the last
finished one. Publish: the source index changes only at the end, in one swap of its folder
(common.publish.publish_dir), only when the final state beats the start on the held-out part, and never over
writes that arrived meanwhile.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from hybrid_retrieval.common.errors import ConfigError, HybridError
from hybrid_retrieval.common.memory import peak_memory_mib
from hybrid_retrieval.common.publish import link_or_copy, publish_dir, write_atomic
from hybrid_retrieval.indexer.live.log import LIVE_DIR, WAL_FILE
from hybrid_retrieval.indexer.manifest import read_manifest, update_manifest
from hybrid_retrieval.indexer.reembed import reembed
from hybrid_retrieval.indexer.store import RERANKER_DIR, file_inventory, open_index, sha256_file
from hybrid_retrieval.models.cross_encoder import load_cross_encoder, rerank_weight
from hybrid_retrieval.models.onnx_export import ONNX_SUBDIR, TRAINING_RECORD
from hybrid_retrieval.quality.metrics import per_query_scores
from hybrid_retrieval.quality.significance import SIGNIFICANCE_LEVEL, randomization_test
from hybrid_retrieval.quality.splits import refuse_test_split, split_dev, training_split
from hybrid_retrieval.search.rerank import DEFAULT_RERANK_DEPTH
from hybrid_retrieval.search.spec import HubnessSpec
from hybrid_retrieval.training.embedder import EmbedderOptions, fine_tune
from hybrid_retrieval.training.fusion import tune_fusion_on_index
from hybrid_retrieval.training.hubness import DefaultRefused, fit_hubness_from_bank
from hybrid_retrieval.training.optimize_report import summary, write_report
from hybrid_retrieval.training.reranker import TrainOptions, train_reranker

logger = logging.getLogger(__name__)

METRIC = "ndcg@10"
STEPS = ("fusion", "hubness", "encoder", "reranker")
WORK = "optimize"  # the work folder inside the index folder; the published index keeps only its report
# The held-out part: a fifth of the judged queries (the usual dev share), at least MIN_HELD_OUT (or half of a small
# set) so the test can see a win, at most MAX_HELD_OUT: past a few hundred queries the test is already powered and
# more queries help fitting more than judging.
HELD_OUT_SHARE, MIN_HELD_OUT, MAX_HELD_OUT = 0.2, 50, 300
# The encoder's learning rate is chosen on its own held-out slice, one epoch each, when the budget allows the full
# epochs after that probe: sentence-transformers' default (2e-5), its half and its double. Otherwise the default.
LEARNING_RATES = (1e-5, 2e-5, 4e-5)
# Training a model needs enough judged queries to beat its base: below this many in the fit part the encoder and
# reranker steps are skipped (their own held-out slices would hold a handful of queries).
MIN_TRAINING_QUERIES = 100


class OptimizeError(HybridError):
    pass


@dataclass(frozen=True)
class OptimizeOptions:
    budget_minutes: float = 90.0
    held_out_fraction: float | None = None  # None: derived from the number of judged queries (see HELD_OUT_SHARE)
    steps: tuple[str, ...] = STEPS
    seed: int = 13
    device: str = "auto"
    publish: bool = True  # False: measure and report only; the index is left as it was

    def __post_init__(self):
        unknown = set(self.steps) - set(STEPS)
        if unknown:
            raise ConfigError(f"unknown steps {sorted(unknown)}; valid: {', '.join(STEPS)}")
        if self.budget_minutes <= 0:
            raise ConfigError(f"--budget must be > 0 minutes, got {self.budget_minutes}")
        if self.held_out_fraction is not None and not 0 < self.held_out_fraction < 1:
            raise ConfigError(f"--dev-fraction must be between 0 and 1, got {self.held_out_fraction}")


def held_out_size(judged: int, fraction: float | None = None) -> int:
    """How many of `judged` queries are held out (see HELD_OUT_SHARE); at least one is left to fit on."""
    if judged < 2:
        raise OptimizeError(f"{judged} judged queries with a relevant document: need at least 2 to hold some out")
    size = (
        round(fraction * judged)
        if fraction is not None
        else min(max(round(HELD_OUT_SHARE * judged), min(MIN_HELD_OUT, judged // 2)), MAX_HELD_OUT)
    )
    return min(max(size, 1), judged - 1)


@dataclass
class Split:
    """The recorded split: query texts, qrels, and which queries fit and which judge."""

    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    fit: list[str]
    held_out: list[str]
    source: dict  # the qrels file, its checksum, the seed and the share held out

    def part(self, ids: list[str]) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
        return {q: self.queries[q] for q in ids}, {q: self.qrels[q] for q in ids}


def make_split(queries_path: Path, qrels_path: Path, options: OptimizeOptions) -> Split:
    queries, qrels = training_split(queries_path, qrels_path)
    judged = sum(1 for rels in qrels.values() if any(r > 0 for r in rels.values()))
    fit, held_out = split_dev(queries, qrels, held_out_size(judged, options.held_out_fraction) / judged, options.seed)
    source = {
        "qrels": str(Path(qrels_path).resolve()),
        "sha256": sha256_file(Path(qrels_path)),
        "judged_queries": judged,
        "held_out_fraction": options.held_out_fraction,
        "seed": options.seed,
    }
    return Split(queries, qrels, fit, held_out, source)


def write_qrels(path: Path, ids: list[str], qrels: dict[str, dict[str, int]]) -> None:
    """The qrels of queries `ids` as a TSV the training tools read (their split is named after the file)."""
    rows = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{r}" for q in ids for d, r in qrels[q].items()]
    write_atomic(path, "\n".join(rows) + "\n")


def write_split(split: Split, work: Path) -> None:
    """The split as the training tools read it: queries.jsonl and fit.tsv (the fit part), and split.json (both parts)."""
    lines = [json.dumps({"_id": q, "text": t}) for q, t in split.queries.items()]
    write_atomic(work / "queries.jsonl", "\n".join(lines) + "\n")
    write_qrels(work / "fit.tsv", split.fit, split.qrels)
    write_atomic(work / "split.json", json.dumps({"source": split.source, "fit": split.fit, "held_out": split.held_out}, indent=2))


def read_split(work: Path, queries_path: Path, qrels_path: Path) -> Split | None:
    """The split recorded by an earlier run on the same qrels file (None: none, or another file)."""
    recorded = work / "split.json"
    if not recorded.is_file():
        return None
    saved = json.loads(recorded.read_text())
    if saved["source"]["sha256"] != sha256_file(Path(qrels_path)):
        return None
    queries, qrels = training_split(queries_path, qrels_path)
    return Split(queries, qrels, saved["fit"], saved["held_out"], saved["source"])


@dataclass
class Costs:
    """Seconds on this machine, measured once with the index's encoder on its own documents: a training step
    (forward + backward) per document at the encoder's length, a forward pass per document, and a training step per
    reranker pair (the reranker starts from the same model, at its shorter length)."""

    train_per_text: float
    forward_per_text: float
    train_per_pair: float
    device: str

    def encoder_epoch(self, examples: int, hard_negatives: int) -> float:
        return examples * (1 + hard_negatives + 0.25) * self.train_per_text  # + 0.25: a query is a short text

    def forward(self, texts: int) -> float:
        return texts * self.forward_per_text

    def reranker(self, groups: int, group_size: int, epochs: int, dev_queries: int) -> float:
        pair_forward = self.forward_per_text * self.train_per_pair / self.train_per_text
        return groups * group_size * epochs * self.train_per_pair + dev_queries * DEFAULT_RERANK_DEPTH * pair_forward


def measure_costs(index_dir: Path, device: str, pair_length: int, texts: int = 32) -> Costs:
    """Time a training step and a forward pass of the index's encoder on `texts` of its documents (a batch of the
    size training uses: smaller batches run faster per text on a CPU), and a training step at `pair_length`."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import batch_to_device

    from hybrid_retrieval.indexer.store import index_model
    from hybrid_retrieval.models.providers import training_device

    index = open_index(index_dir, verify="size", device="cpu")
    try:
        sample = [index.doc_text(i) for i in range(min(texts, index.num_docs))]
        base = index_model(index_dir)
    finally:
        index.close()
    torch_device = torch.device(training_device(device))
    model = SentenceTransformer(str(base.path), device=str(torch_device))

    def train_step() -> float:
        batch = batch_to_device(model.preprocess(sample), torch_device)
        model.train()
        model(batch)["sentence_embedding"].sum().backward()  # warm-up
        started = time.perf_counter()
        model(batch)["sentence_embedding"].sum().backward()
        return (time.perf_counter() - started) / len(sample)

    per_text = train_step()
    model.eval()
    with torch.no_grad():
        batch = batch_to_device(model.preprocess(sample), torch_device)
        started = time.perf_counter()
        model(batch)
        forward = (time.perf_counter() - started) / len(sample)
    model.max_seq_length = min(model.max_seq_length or pair_length, pair_length)
    per_pair = train_step()
    return Costs(per_text, forward, per_pair, str(torch_device))


@dataclass
class StepResult:
    name: str
    decision: str  # kept, not kept, skipped
    why: str
    before: float | None = None
    after: float | None = None
    p_value: float | None = None
    wins_ties_losses: list[int] | None = None
    seconds: float = 0.0
    peak_rss_mib: float = 0.0
    plan: dict = field(default_factory=dict)
    detail: dict = field(default_factory=dict)


@dataclass
class State:
    """What the work folder records: the state the kept steps left (`current`, a folder of the work folder, with the
    held-out scores of its served pipeline), the steps done, and the start's scores."""

    current: str
    start_scores: dict[str, float]
    scores: dict[str, float]
    reranker: str | None = None  # the kept reranker's folder, relative to the work folder
    steps: list[StepResult] = field(default_factory=list)
    wal_bytes: int = 0  # the source's write-ahead log when the run began: publishing needs it unchanged
    manifest_sha256: str = ""
    started_at: str = ""
    budget_seconds: float = 0.0
    spent_seconds: float = 0.0
    costs: dict | None = None

    @classmethod
    def load(cls, path: Path) -> State:
        data = json.loads(path.read_text())
        data["steps"] = [StepResult(**s) for s in data["steps"]]
        return cls(**data)

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self), indent=2))

    @property
    def done(self) -> set[str]:
        return {s.name for s in self.steps}


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def copy_index(source: Path, target: Path) -> None:
    """A working copy of an index folder: immutable files hard-linked (every writer replaces files whole), the live
    log copied (it is appended in place), this module's work folder left out."""

    def link_or_copy_file(src: str, dst: str) -> None:
        if Path(src).name == WAL_FILE:
            shutil.copy2(src, dst)
        else:
            link_or_copy(src, dst)

    shutil.copytree(source, target, copy_function=link_or_copy_file, ignore=lambda folder, names: [WORK] if Path(folder) == source else [])


def install_reranker(model: Path, index_dir: Path) -> None:
    """Put a `hybrid train-reranker` folder's ONNX export and record into the index folder (RERANKER_DIR), inventoried in
    its manifest: the index then carries the reranker it is served with."""
    target = index_dir / RERANKER_DIR
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(model / ONNX_SUBDIR, target / ONNX_SUBDIR)
    shutil.copy2(model / TRAINING_RECORD, target / TRAINING_RECORD)

    def inventory(manifest) -> None:
        manifest.files = {k: v for k, v in manifest.files.items() if not k.startswith(RERANKER_DIR + "/")}
        manifest.files.update(file_inventory(target, prefix=f"{RERANKER_DIR}/"))

    update_manifest(index_dir, inventory)


def own_rerank_spec(reranker: Path) -> dict:
    """The reranking an index's own reranker is served with: on, the default depth, its tuned weight."""
    return {"rerank": {"enabled": True, "depth": DEFAULT_RERANK_DEPTH, "weight": rerank_weight(reranker)}}


def served_scores(
    index_dir: Path, queries: dict[str, str], qrels: dict[str, dict[str, int]], reranker: Path | None = None, device: str = "auto"
) -> dict[str, float]:
    """Per-query nDCG@10 of the index's served pipeline (queries embedded as served; `reranker` at its tuned weight, as
    the service reranks with an index's own reranker)."""
    index = open_index(index_dir, verify="size", device=device)
    try:
        spec: dict = {}
        cross_encoder = None
        if reranker is not None:
            cross_encoder = load_cross_encoder(reranker / ONNX_SUBDIR, device=device, precision="auto")
            spec = own_rerank_spec(reranker)
        pipeline = index.pipeline(cross_encoder=cross_encoder)
        resolved = pipeline.resolve(spec)
        run = {}
        for qid, text in queries.items():
            ranking = pipeline.search(text, k=100, spec=resolved).ranking
            run[qid] = {index.doc_ids[int(i)]: float(s) for i, s in zip(ranking.doc_idx, ranking.scores)}
    finally:
        index.close()
    return per_query_scores(run, qrels, (METRIC,))[METRIC]


def compare(before: dict[str, float], after: dict[str, float]) -> tuple[float, float, float, list[int]]:
    """Mean before, mean after, the paired randomisation test's p, and per-query wins/ties/losses."""
    qids = sorted(before)
    a, b = np.array([after[q] for q in qids]), np.array([before[q] for q in qids])
    diff = a - b
    counts = [int((diff > 1e-12).sum()), int((np.abs(diff) <= 1e-12).sum()), int((diff < -1e-12).sum())]
    return float(b.mean()), float(a.mean()), float(randomization_test(a, b)), counts


def _unaffordable(step: str, plan: dict) -> StepResult:
    return StepResult(step, "skipped", f"one epoch does not fit the budget left ({plan})", plan=plan)


class Optimizer:
    """One run of the recipe on an index folder (see the module docstring)."""

    def __init__(self, index_dir: Path, queries_path: Path, qrels_path: Path, options: OptimizeOptions, progress: bool = True):
        refuse_test_split(qrels_path)
        self.source = Path(index_dir).resolve()
        read_manifest(self.source)  # an index folder, or a clear error
        if (self.source / "shards.json").exists():
            raise ConfigError(f"{self.source} is sharded: optimize runs on one index folder")
        self.work = self.source / WORK
        self.options, self.progress = options, progress
        self.queries_path, self.qrels_path = Path(queries_path), Path(qrels_path)
        self.state_path = self.work / "state.json"

    # -- the run -------------------------------------------------------------------------------------------------
    def run(self, on_step: Callable[[StepResult], None] | None = None) -> dict:
        started = time.perf_counter()
        self.work.mkdir(exist_ok=True)
        split = read_split(self.work, self.queries_path, self.qrels_path)
        state = State.load(self.state_path) if split is not None and self.state_path.is_file() else None
        if state is None:
            split = make_split(self.queries_path, self.qrels_path, self.options)
            state = self._start(split)
        else:
            logger.info("resuming %s after %s", self.work, ", ".join(s.name for s in state.steps) or "the start")
        assert split is not None
        self.split = split
        for name in (s for s in STEPS if s in self.options.steps):
            if name in state.done:
                continue
            step_started = time.perf_counter()
            result = getattr(self, f"_step_{name}")(state)
            result.seconds = round(time.perf_counter() - step_started, 1)
            result.peak_rss_mib = peak_memory_mib()
            state.steps.append(result)
            state.spent_seconds = round(state.spent_seconds + result.seconds, 1)
            state.save(self.state_path)
            if on_step:
                on_step(result)
        report = self._finish(state, split)
        logger.info("optimize finished in %.0f s", time.perf_counter() - started)
        return report

    def _start(self, split: Split) -> State:
        for leftover in self.work.iterdir():  # an earlier run on another split: start over
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        write_split(split, self.work)
        wal_bytes = _size(self.source / LIVE_DIR / WAL_FILE)
        manifest_sha = sha256_file(self.source / "manifest.json")
        copy_index(self.source, self.work / "state-0")
        scores = served_scores(self.work / "state-0", *split.part(split.held_out), device=self.options.device)
        state = State(
            current="state-0",
            start_scores=scores,
            scores=scores,
            wal_bytes=wal_bytes,
            manifest_sha256=manifest_sha,
            started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            budget_seconds=self.options.budget_minutes * 60,
        )
        state.save(self.state_path)
        return state

    # -- steps: each works on a copy of the current state and returns its result ----------------------------------
    def _candidate(self, state: State, name: str) -> Path:
        folder = self.work / f"state-{len(state.steps) + 1}-{name}"
        if folder.exists():  # a step an interruption cut short
            shutil.rmtree(folder)
        copy_index(self.work / state.current, folder)
        return folder

    def _judge(self, state: State, name: str, candidate: Path, reranker: Path | None = None, **extra) -> StepResult:
        """Score the candidate on the held-out part; keep it (it becomes the current state) when it wins at SIGNIFICANCE_LEVEL."""
        scores = served_scores(candidate, *self.split.part(self.split.held_out), reranker, self.options.device)
        before, after, p, counts = compare(state.scores, scores)
        kept = after > before and p < SIGNIFICANCE_LEVEL
        if kept:
            state.current, state.scores = candidate.name, scores
            if reranker is not None:
                state.reranker = str(reranker.relative_to(self.work))
            why = f"held-out {METRIC} {before:.4f} -> {after:.4f}, p {p:.4f}"
        else:
            why = f"held-out {METRIC} {before:.4f} -> {after:.4f}, p {p:.4f}: " + ("not significant" if after > before else "no gain")
        result = StepResult(name, "kept" if kept else "not kept", why, round(before, 4), round(after, 4), round(p, 4), counts, **extra)
        if not kept and candidate.name != state.current:
            shutil.rmtree(candidate, ignore_errors=True)
        return result

    def _left(self, state: State) -> float:
        return state.budget_seconds - state.spent_seconds

    def _step_fusion(self, state: State) -> StepResult:
        candidate = self._candidate(state, "fusion")
        queries, qrels = self.split.part(self.split.fit)
        # any out-of-sample win is a candidate: the held-out test below decides at the significance level
        _, proof = tune_fusion_on_index(candidate, queries, qrels, self.work / "fit.tsv", METRIC, progress=self.progress, level=None)
        return self._judge(state, "fusion", candidate, detail={"tuning": proof})

    def _step_hubness(self, state: State) -> StepResult:
        candidate = self._candidate(state, "hubness")
        try:
            fit_hubness_from_bank(
                candidate,
                self.work / "queries.jsonl",
                HubnessSpec("qbnorm"),
                split_qrels=self.work / "fit.tsv",
                tune=True,
                set_default=True,
            )
        except DefaultRefused as refused:
            shutil.rmtree(candidate, ignore_errors=True)
            return StepResult("hubness", "not kept", f"cross-fitting on the fit part: {refused}")
        return self._judge(state, "hubness", candidate, detail={"evidence": read_manifest(candidate).evidence.get("hubness")})

    def _costs(self, state: State) -> Costs:
        if state.costs is None:
            state.costs = asdict(measure_costs(self.work / state.current, self.options.device, TrainOptions().max_length))
            state.save(self.state_path)
        return Costs(**state.costs)

    def _fit_size(self) -> int:
        return len(self.split.fit)

    def encoder_plan(self, state: State, share: float) -> tuple[EmbedderOptions | None, dict]:
        """Epochs (at most `EmbedderOptions().epochs`) that fit `share` of what is left of the budget, and whether the
        learning-rate probe fits beside them."""
        costs = self._costs(state)
        queries, qrels = self.split.part(self.split.fit)
        base = EmbedderOptions(device=self.options.device, seed=self.options.seed)
        train_ids, dev_ids = split_dev(queries, qrels, base.dev_fraction, base.seed)
        examples = sum(1 for q in train_ids for r in qrels[q].values() if r > 0)
        documents = read_manifest(self.work / state.current).counts["documents"]
        # scoring the epoch-choosing pool costs at most about a third of an epoch: the pool is at most twice the
        # examples (each held-out query's hybrid top-N and its relevant documents)
        depth = max(10, min(base.eval_depth, (2 * examples) // max(1, len(dev_ids))))  # 10: nDCG@10 needs ten per query
        base = replace(base, eval_depth=depth)
        pool = min(documents, len(dev_ids) * depth)
        fixed = costs.forward(documents) + 60  # re-embedding every document, the ONNX export and re-tuning
        per_epoch = costs.encoder_epoch(examples, base.hard_negatives) + costs.forward(pool)  # an epoch, then its held-out score
        allowed = share * self._left(state) - fixed - costs.forward(pool)  # the base model is scored first
        epochs = min(base.epochs, int(allowed // per_epoch)) if allowed > 0 else 0
        probe = len(LEARNING_RATES) * (per_epoch + costs.forward(pool))  # one epoch per rate, the base scored each time
        plan = {
            "examples_per_epoch": examples,
            "eval_depth": depth,
            "epoch_seconds_estimate": round(per_epoch),
            "reembed_seconds_estimate": round(fixed),
            "epochs": epochs,
            "learning_rate_probe": epochs == base.epochs and allowed - probe >= epochs * per_epoch,
            "budget_share_seconds": round(share * self._left(state)),
        }
        if epochs < 1:
            return None, plan
        return replace(base, epochs=epochs), plan

    def _learning_rate(self, index, queries, qrels, train_ids, dev_ids, options: EmbedderOptions) -> tuple[float, dict]:
        """The rate of LEARNING_RATES whose first epoch scores best on the encoder's held-out slice."""
        scores = {}
        for rate in LEARNING_RATES:
            folder = self.work / "models" / f"probe-{rate:g}"
            record = fine_tune(
                index, queries, qrels, train_ids, dev_ids, folder, replace(options, epochs=1, learning_rate=rate),
                {"recipe": "supervised", "split": "fit", "probe": True}, self.progress,
            )  # fmt: skip
            scores[f"{rate:g}"] = round(record["held_out"]["per_epoch"][-1][METRIC], 4)
            shutil.rmtree(folder)
        best = max(LEARNING_RATES, key=lambda rate: scores[f"{rate:g}"])  # the first of equals: the smallest
        return best, scores

    def reranker_plan(self, state: State, share: float) -> tuple[TrainOptions | None, dict]:
        costs = self._costs(state)
        queries, qrels = self.split.part(self.split.fit)
        base = TrainOptions(device=self.options.device, seed=self.options.seed)
        train_ids, dev_ids = split_dev(queries, qrels, base.dev_fraction, base.seed)
        groups = sum(1 for q in train_ids for r in qrels[q].values() if r > 0)
        allowed = share * self._left(state)
        epochs = base.epochs
        while epochs >= 1 and costs.reranker(groups, 1 + base.negatives, epochs, len(dev_ids)) + 60 > allowed:
            epochs -= 1
        plan = {
            "groups_per_epoch": groups,
            "seconds_estimate": round(costs.reranker(groups, 1 + base.negatives, max(epochs, 1), len(dev_ids)) + 60),
            "epochs": epochs,
            "budget_share_seconds": round(allowed),
        }
        return (replace(base, epochs=epochs) if epochs >= 1 else None), plan

    def _too_few(self) -> str | None:
        if self._fit_size() < MIN_TRAINING_QUERIES:
            return f"{self._fit_size()} judged queries to fit on, fewer than {MIN_TRAINING_QUERIES}: too few to train a model on"
        return None

    def _step_encoder(self, state: State) -> StepResult:
        if (why := self._too_few()) is not None:
            return StepResult("encoder", "skipped", why)
        # the encoder gets what the reranker (trained after it, on its candidates) does not need
        reranking = "reranker" in self.options.steps and "reranker" not in state.done
        share = 1.0 - (self._reranker_share(state) if reranking else 0.0)
        options, plan = self.encoder_plan(state, share)
        if options is None:
            return _unaffordable("encoder", plan)
        index = open_index(self.work / state.current, verify="size", device=self.options.device)
        model = self.work / "models" / "encoder"
        queries, qrels = self.split.part(self.split.fit)
        try:
            train_ids, dev_ids = split_dev(queries, qrels, options.dev_fraction, options.seed)
            if plan["learning_rate_probe"]:
                rate, plan["learning_rate_probe"] = self._learning_rate(index, queries, qrels, train_ids, dev_ids, options)
                options = replace(options, learning_rate=rate)
            plan["learning_rate"] = options.learning_rate
            record = fine_tune(
                index, queries, qrels, train_ids, dev_ids, model, options, {"recipe": "supervised", "split": "fit"}, self.progress
            )
        finally:
            index.close()
        if record["held_out"]["best_epoch"] == 0:
            return StepResult("encoder", "not kept", "no epoch beat the base model on the encoder's own held-out slice", plan=plan)
        candidate = self._candidate(state, "encoder")
        old = read_manifest(candidate)
        reembed(candidate, str(model), device=self.options.device, progress=self.progress)
        detail: dict = {"training": {k: record[k] for k in ("held_out", "seconds", "device")}}
        # what was fitted to the old model's scores, fitted again: on the queries the encoder did not train on
        dev_queries, dev_qrels = self.split.part(dev_ids)
        dev_path = self.work / "encoder-dev.tsv"
        write_qrels(dev_path, dev_ids, qrels)
        # the fusion is tuned for the new model whatever the old one had: a fine-tuned dense leg deserves another weight,
        # and tune_fusion_on_index keeps the default unless tuning wins out of sample (the step's held-out test judges the whole)
        _, detail["fusion"] = tune_fusion_on_index(candidate, dev_queries, dev_qrels, dev_path, METRIC, progress=self.progress, level=None)
        if old.defaults.hubness.method != "none":
            try:
                fit_hubness_from_bank(
                    candidate, self.work / "queries.jsonl", old.defaults.hubness, split_qrels=dev_path, tune=True, set_default=True
                )
                detail["hubness"] = "refitted"
            except DefaultRefused as refused:
                detail["hubness"] = f"dropped: {refused}"
        return self._judge(state, "encoder", candidate, plan=plan, detail=detail)

    def _reranker_share(self, state: State) -> float:
        """The reranker's share of the budget left: what its full recipe needs, at most half."""
        options, plan = self.reranker_plan(state, 1.0)
        if options is None:
            return 0.0
        return min(0.5, plan["seconds_estimate"] / max(self._left(state), 1.0))

    def _step_reranker(self, state: State) -> StepResult:
        if (why := self._too_few()) is not None:
            return StepResult("reranker", "skipped", why)
        options, plan = self.reranker_plan(state, 1.0)
        if options is None:
            return _unaffordable("reranker", plan)
        index = open_index(self.work / state.current, verify="size", device=self.options.device)
        model = self.work / "models" / "reranker"
        queries, qrels = self.split.part(self.split.fit)
        try:
            record = train_reranker(index, queries, qrels, model, options, split="fit", progress=self.progress)
        finally:
            index.close()
        detail = {"interpolation": record.get("interpolation"), "seconds": record["seconds"], "device": record["device"]}
        current = self.work / state.current
        return self._judge(state, "reranker", current, reranker=model, plan=plan, detail=detail)

    # -- the end -------------------------------------------------------------------------------------------------
    def _finish(self, state: State, split: Split) -> dict:
        final = self.work / state.current
        report = summary(
            state, split, compare(state.start_scores, state.scores), METRIC, SIGNIFICANCE_LEVEL, self.work, read_manifest(final)
        )
        improved = report["held_out"]["improved"]
        thin = len(split.held_out) < MIN_HELD_OUT
        if thin:
            report["evidence_note"] = (
                f"{len(split.held_out)} held-out queries: a step is kept only when it wins on most of them; "
                "the evidence is too thin to change a default by a small margin"
            )
        if not improved:
            report["published"] = "nothing changed: the final state does not beat the start on the held-out part"
        elif not self.options.publish:
            report["published"] = "not published (--dry-run)"
        else:
            report["published"] = f"published to {self.source}"
            self._publish(state, report)
            return report
        write_report(report, self.work)
        return report

    def _publish(self, state: State, report: dict) -> None:
        final = self.work / state.current
        if state.reranker is not None:
            install_reranker(self.work / state.reranker, final)
        summary_record = {k: report[k] for k in ("held_out", "steps", "served", "finished_at")}
        update_manifest(final, lambda manifest: manifest.evidence.__setitem__("optimize", summary_record))
        with publish_dir(self.source) as tmp:
            if (
                _size(self.source / LIVE_DIR / WAL_FILE) != state.wal_bytes
                or sha256_file(self.source / "manifest.json") != state.manifest_sha256
            ):
                raise OptimizeError(
                    f"{self.source} changed while optimizing (documents written, or its defaults changed): nothing published. "
                    "Pause writes and run it again; the finished steps are kept in the work folder and are redone only if the index changed"
                )
            for item in final.iterdir():
                os.rename(item, tmp / item.name)
            (tmp / WORK).mkdir()
            encoder = self.work / "models" / "encoder"
            if read_manifest(tmp).embedder.model == str(encoder):  # the index names it: it stays where it was trained
                (tmp / WORK / "models").mkdir()
                os.rename(encoder, tmp / WORK / "models" / "encoder")
            write_report(report, tmp / WORK)


def optimize(
    index_dir: Path | str, queries: Path | str, qrels: Path | str, options: OptimizeOptions = OptimizeOptions(), progress: bool = True
) -> dict:
    """`hybrid optimize` on an index folder; returns the report (also written to INDEX/optimize/report.*)."""
    return Optimizer(Path(index_dir), Path(queries), Path(qrels), options, progress).run()
