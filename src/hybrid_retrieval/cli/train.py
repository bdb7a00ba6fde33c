"""`hybrid tune` (fusion), `hybrid train-reranker` and `hybrid train-embedder`: fitting on a labelled train/dev split, never
test; `hybrid adapt` and `hybrid distil`: fitting an encoder to a corpus without labels."""

from __future__ import annotations

import json
from pathlib import Path

from hybrid_retrieval.cli.args import add_device, add_query_precision, add_quiet, default
from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.indexer.build import corpus_documents
from hybrid_retrieval.indexer.corpus import corpus_file
from hybrid_retrieval.indexer.manifest import read_manifest
from hybrid_retrieval.indexer.store import open_index
from hybrid_retrieval.models.cross_encoder import weight_evidence
from hybrid_retrieval.models.registry import DEFAULT_MODEL, resolve_model
from hybrid_retrieval.models.student import StudentRecipe, distil_student, training_texts
from hybrid_retrieval.quality.metrics import MEASURES, format_evidence
from hybrid_retrieval.quality.splits import training_split
from hybrid_retrieval.search.fusion import fusion_to_string
from hybrid_retrieval.training.embedder import SUPERVISED, EmbedderOptions, adapt_embedder, train_embedder
from hybrid_retrieval.training.fusion import format_table, pseudo_split, tune_fusion_on_index
from hybrid_retrieval.training.pseudo import RECIPES
from hybrid_retrieval.training.reranker import TrainOptions, train_reranker


def _add_split(p, required: bool = True) -> None:
    p.add_argument("--queries", type=Path, required=required, help="queries.jsonl (only the queries judged in --qrels are read)")
    p.add_argument("--qrels", type=Path, required=required, help="qrels TSV of a training or dev split (never test)")


def _add_pseudo(p) -> None:
    p.add_argument("--max-queries", type=int, default=2000, help="pseudo-queries kept after the filter")
    p.add_argument("--filter-depth", type=int, default=10, help="a pseudo-query is kept only if its document is in the hybrid top-N")


def register(commands) -> None:
    _register_tune(commands)
    _register_train_reranker(commands)
    _register_embedder_commands(commands)
    _register_distil(commands)


def _register_tune(commands) -> None:
    p = commands.add_parser("tune", help="choose the fusion (alpha, normalisation, rrf_k) on labelled training queries, or pseudo-queries")
    p.add_argument("index", type=Path)
    _add_split(p, required=False)
    p.add_argument(
        "--pseudo",
        choices=RECIPES,
        help="no labels: tune on pseudo-queries of this recipe cut from the index's documents "
        "(see `hybrid adapt`) instead of --queries/--qrels",
    )
    _add_pseudo(p)
    p.add_argument("--metric", choices=MEASURES, default="ndcg@10")
    p.add_argument("--out", type=Path, help="where the table and plot go (default INDEX/tuning)")
    p.add_argument("--dry-run", action="store_true", help="report only; leave the manifest unchanged")
    add_query_precision(p)
    add_quiet(p)
    p.set_defaults(run=run_tune)


def _register_train_reranker(commands) -> None:
    p = commands.add_parser(
        "train-reranker", help="fine-tune a cross-encoder on a train split with hard negatives from the hybrid retriever"
    )
    p.add_argument("index", type=Path, help="index whose hybrid retriever mines the hard negatives")
    _add_split(p)
    p.add_argument("--out", type=Path, required=True, help="model folder to write (torch weights + onnx/)")
    p.add_argument(
        "--base-model",
        default=default(TrainOptions, "base_model"),
        help="model name or local path to start from (default: the --teacher's own weights when distilling, else all-MiniLM-L6-v2)",
    )
    p.add_argument("--max-length", type=int, default=default(TrainOptions, "max_length"), help="query + document tokens")
    p.add_argument(
        "--layers",
        type=int,
        default=default(TrainOptions, "layers"),
        help="keep N of the base model's layers, the first N-1 and the last (default: all); reranking time is about proportional to N",
    )
    p.add_argument("--negatives", type=int, default=default(TrainOptions, "negatives"), help="hard negatives per positive")
    p.add_argument(
        "--mine-depth", type=int, default=default(TrainOptions, "mine_depth"), help="negatives are sampled from the hybrid top-N"
    )
    p.add_argument("--epochs", type=int, default=default(TrainOptions, "epochs"))
    p.add_argument(
        "--groups-per-step", type=int, default=default(TrainOptions, "groups_per_step"), help="(positive + negatives) groups per batch"
    )
    p.add_argument("--lr", type=float, default=default(TrainOptions, "learning_rate"))
    p.add_argument(
        "--dev-fraction",
        type=float,
        default=default(TrainOptions, "dev_fraction"),
        help="judged queries held out to tune the interpolation weight with the fused score (0: plain reranking)",
    )
    p.add_argument(
        "--teacher",
        help="a reranker (e.g. a 6-layer `hybrid train-reranker` folder) whose scores the model also learns "
        "to match over each group: distillation, for a small --layers model, which starts from the teacher's own layers "
        "unless --base-model says otherwise",
    )
    p.add_argument("--seed", type=int, default=default(TrainOptions, "seed"))
    add_device(p, help="training (and mining) device")
    add_quiet(p)
    p.set_defaults(run=run_train_reranker)


def _register_embedder_commands(commands) -> None:
    p = commands.add_parser(
        "train-embedder", help="fine-tune the index's dense encoder on a train split with hard negatives from the hybrid retriever"
    )
    p.add_argument("index", type=Path, help="index whose encoder is tuned and whose hybrid retriever mines the hard negatives")
    _add_split(p)
    p.add_argument("--out", type=Path, required=True, help="model folder to write (sentence-transformers + training.json)")
    add_embedder_training_flags(p, SUPERVISED)
    p.set_defaults(run=run_train_embedder)

    p = commands.add_parser(
        "adapt", help="fine-tune the index's dense encoder without labels, on pseudo-queries cut from its own documents"
    )
    p.add_argument("index", type=Path, help="index whose documents give the pseudo-queries and whose encoder is tuned")
    p.add_argument("--out", type=Path, required=True, help="model folder to write (sentence-transformers + training.json)")
    p.add_argument(
        "--recipe",
        choices=RECIPES,
        default="ict",
        help="title: titles as queries; ict: a sentence of the body as the query (inverse cloze task); both",
    )
    _add_pseudo(p)
    add_embedder_training_flags(p)
    p.set_defaults(run=run_adapt)


def _register_distil(commands) -> None:
    recipe = StudentRecipe()
    p = commands.add_parser(
        "distil",
        help="distil a shallower student of an embedding model on a corpus's own text, no labels (the small encoder profile)",
    )
    p.add_argument("corpus", type=Path, help="corpus.jsonl or a BEIR dataset folder: the text the student learns from")
    p.add_argument("--out", type=Path, required=True, help="model folder to write (sentence-transformers + training.json)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="the teacher: a sentence-transformers model name or folder")
    g = p.add_argument_group("distillation")
    g.add_argument("--layers", type=int, nargs="+", default=list(recipe.layers), help="the teacher's layers kept (0-based)")
    g.add_argument("--epochs", type=int, default=recipe.epochs, help="at most; the epoch closest to the teacher on held-out texts is kept")
    g.add_argument("--documents", type=int, default=recipe.documents, help="documents sampled from the corpus")
    g.add_argument("--sentences", type=int, default=recipe.sentences, help="sentences of those documents trained on besides")
    g.add_argument("--max-length", type=int, default=recipe.max_length, help="word pieces per training text")
    g.add_argument("--batch-size", type=int, default=recipe.batch_size)
    g.add_argument("--lr", type=float, default=recipe.learning_rate)
    g.add_argument("--seed", type=int, default=recipe.seed)
    add_device(g, help="training device")
    add_quiet(g)
    p.set_defaults(run=run_distil)


def add_embedder_training_flags(p, defaults: EmbedderOptions = EmbedderOptions()) -> None:
    g = p.add_argument_group("embedder training")
    g.add_argument("--epochs", type=int, default=defaults.epochs, help="at most; the best held-out epoch is kept")
    g.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help="examples per step (the others' documents are in-batch negatives)"
    )
    g.add_argument("--hard-negatives", type=int, default=defaults.hard_negatives, help="per example")
    g.add_argument("--mine-depth", type=int, default=defaults.mine_depth, help="hard negatives are sampled from the hybrid top-N")
    g.add_argument("--lr", type=float, default=defaults.learning_rate)
    g.add_argument("--dev-fraction", type=float, default=defaults.dev_fraction, help="queries held out to choose the epoch")
    g.add_argument("--eval-depth", type=int, default=defaults.eval_depth, help="held-out queries are scored over their hybrid top-N pooled")
    g.add_argument("--seed", type=int, default=defaults.seed)
    add_device(g, help="training (and mining) device")
    add_quiet(g)


def embedder_options(args) -> EmbedderOptions:
    return EmbedderOptions(
        epochs=args.epochs,
        batch_size=args.batch_size,
        hard_negatives=args.hard_negatives,
        mine_depth=args.mine_depth,
        learning_rate=args.lr,
        dev_fraction=args.dev_fraction,
        eval_depth=args.eval_depth,
        seed=args.seed,
        device=args.device,
    )


def _report_embedder(record: dict, out: Path) -> None:
    held_out = record["held_out"]
    print(json.dumps({k: v for k, v in record.items() if k != "loss"}, indent=2))
    print(
        f"held-out {held_out['metric']} (dense, {record['data']['held_out_queries']} queries): base {held_out['before']:.4f} -> "
        f"{held_out['after']:.4f} (epoch {held_out['best_epoch']}); model saved to {out}; "
        f"re-embed an index with it: hybrid reembed INDEX --model {out}"
    )


def run_tune(args) -> None:
    if (args.pseudo is None) == (args.queries is None or args.qrels is None) or (args.pseudo and (args.queries or args.qrels)):
        raise ConfigError("give either --queries and --qrels (a labelled split) or --pseudo RECIPE (no labels)")
    if args.pseudo:
        queries, qrels, split = pseudo_split(
            args.index, args.pseudo, args.max_queries, args.filter_depth, args.query_precision, progress=not args.quiet
        )
    else:
        (queries, qrels), split = training_split(args.queries, args.qrels), args.qrels
    out = args.out or args.index / "tuning"
    result, evidence = tune_fusion_on_index(
        args.index,
        queries,
        qrels,
        split,
        args.metric,
        out,
        write=not args.dry_run,
        progress=not args.quiet,
        query_precision=args.query_precision,
    )
    print(format_table(result))
    print(
        f"best: {fusion_to_string(result.best_fusion())} ({args.metric} {result.best()[args.metric]:.4f} on {len(queries)} "
        f"queries of {Path(split).name}, in-sample); table and plot in {out}"
    )
    print(format_evidence(evidence))
    if not args.dry_run:
        print(
            f"recorded in {args.index / 'manifest.json'}; the index's default fusion is now "
            f"{fusion_to_string(read_manifest(args.index).defaults.fusion)}"
        )


def run_train_reranker(args) -> None:
    options = TrainOptions(
        base_model=args.base_model,
        layers=args.layers,
        max_length=args.max_length,
        negatives=args.negatives,
        mine_depth=args.mine_depth,
        epochs=args.epochs,
        groups_per_step=args.groups_per_step,
        learning_rate=args.lr,
        dev_fraction=args.dev_fraction,
        teacher=args.teacher,
        seed=args.seed,
        device=args.device,
    )
    queries, qrels = training_split(args.queries, args.qrels)
    index = open_index(args.index, verify="size", device=args.device)
    record = train_reranker(index, queries, qrels, args.out, options, split=args.qrels.stem, progress=not args.quiet)
    print(json.dumps(record, indent=2))
    evidence = weight_evidence(args.out)
    if evidence:
        print(format_evidence(evidence))
    print(f"reranker saved to {args.out} (ONNX in {args.out / 'onnx'}); serve it with HYBRID_RERANKER={args.out}")


def run_train_embedder(args) -> None:
    options = embedder_options(args)
    queries, qrels = training_split(args.queries, args.qrels)
    index = open_index(args.index, verify="size", device=args.device)
    _report_embedder(train_embedder(index, queries, qrels, args.out, options, split=args.qrels.stem, progress=not args.quiet), args.out)


def run_adapt(args) -> None:
    options = embedder_options(args)
    index = open_index(args.index, verify="size", device=args.device)
    record = adapt_embedder(index, args.out, options, args.recipe, args.max_queries, args.filter_depth, progress=not args.quiet)
    _report_embedder(record, args.out)


def run_distil(args) -> None:
    recipe = StudentRecipe(
        layers=tuple(args.layers),
        epochs=args.epochs,
        documents=args.documents,
        sentences=args.sentences,
        max_length=args.max_length,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        seed=args.seed,
    )
    texts = training_texts(corpus_documents(corpus_file(args.corpus))(), recipe)
    record = distil_student(resolve_model(args.model), texts, args.out, recipe, args.device, progress=not args.quiet)
    held_out = record["held_out"]
    print(json.dumps(record, indent=2))
    print(
        f"held-out {held_out['metric']} ({record['texts']['held_out']} texts): {held_out['by_epoch'][0]:.4f} before training -> "
        f"{held_out['by_epoch'][held_out['best_epoch']]:.4f} (epoch {held_out['best_epoch']}); model saved to {args.out}; "
        f"build with it: hybrid index CORPUS --model {args.out} --profile small"
    )
