"""`hybrid index` and `hybrid download-beir`: corpora in, index folders out."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from hybrid_retrieval.cli.args import add_device, add_quiet, default
from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.common.memory import peak_memory_mib
from hybrid_retrieval.engine.offline import (
    DEFAULT_MAX_BATCH_DOCS,
    check_shard_count,
    data_dir,
    log_folder,
    new_collection_folder,
    parse_analyzer,
    repair_log,
    split_index,
    writer,
)
from hybrid_retrieval.evaluation.beir import ensure_dataset
from hybrid_retrieval.indexer.build import BuildOptions, build_index, index_is_current
from hybrid_retrieval.indexer.chunking import ChunkingParams
from hybrid_retrieval.indexer.corpus import read_corpus
from hybrid_retrieval.models.onnx_export import PRECISIONS
from hybrid_retrieval.models.profiles import PROFILES
from hybrid_retrieval.models.providers import BACKENDS
from hybrid_retrieval.search.analyzer import NORMALIZATIONS, STEMMERS, STOPWORD_LISTS
from hybrid_retrieval.search.bm25 import BM25_METHODS, BM25Params
from hybrid_retrieval.search.cjk import CJK_MODES
from hybrid_retrieval.search.dense import DEFAULT_PARAMS, FAISS_KINDS, FaissParams
from hybrid_retrieval.training.reembed import reembed_index


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_index(commands)
    _register_maintenance(commands)


def _register_index(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("index", help="build an index from a BEIR folder or a JSONL corpus")
    p.add_argument("corpus", type=Path)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, help="the index folder to build")
    where.add_argument(
        "--collection",
        help="build collection NAME in the data directory (--data): a running service serves it within a refresh "
        "interval (docs/collections.md)",
    )
    p.add_argument("--data", type=Path, help="with --collection: the data directory (default $HYBRID_DATA or ./data)")
    p.add_argument(
        "--replace", action="store_true", help="with --collection: rebuild an existing collection (its writes since are dropped)"
    )
    p.add_argument(
        "--skip-if-current",
        action="store_true",
        help="do nothing when --out already holds an index of this corpus (same sha256; build options are not compared)",
    )
    add_device(p)
    add_build_flags(p)
    g = p.add_argument_group("scale-out")
    g.add_argument(
        "--shards",
        type=int,
        help="split the built index into N shards by a stable hash of the id "
        "(corpus-wide BM25 statistics in each; serve them with `hybrid serve --ray`)",
    )
    g.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="embed the documents on a Ray cluster (none: start a local Ray instance); needs the ray extra",
    )
    g.add_argument(
        "--embed-actors",
        type=int,
        default=1,
        help="with --ray: embedding actors (one ONNX session each; one GPU each when the cluster has as many GPUs)",
    )
    p.set_defaults(run=run_index)


def _register_maintenance(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """shard, ingest, repair, reembed, download-beir: what is done to a built index, or before one is built."""
    p = commands.add_parser("shard", help="split a built index into N shards (corpus-wide BM25 statistics, hubness kept)")
    p.add_argument("index", type=Path)
    p.add_argument("--shards", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(run=run_shard)

    p = commands.add_parser("ingest", help="write documents into an index's live collection offline (as PUT /documents does)")
    p.add_argument("index", type=Path)
    p.add_argument("documents", type=Path, nargs="?", help="JSONL documents to upsert (id, title, text, metadata)")
    p.add_argument("--delete", type=Path, help="file of document ids to delete, one per line")
    p.add_argument("--batch-docs", type=int, default=DEFAULT_MAX_BATCH_DOCS, help="documents per logged batch")
    add_device(p)
    p.set_defaults(run=run_ingest)

    p = commands.add_parser(
        "repair", help="salvage a damaged write-ahead log: keep every intact record, report what could not be read (stop the service first)"
    )
    p.add_argument("index", type=Path)
    p.add_argument("--dry-run", action="store_true", help="report only; change nothing")
    p.set_defaults(run=run_repair)

    p = commands.add_parser(
        "reembed",
        help="embed an index's documents again with another model (e.g. from train-embedder or adapt): "
        "new FAISS index, hubness refitted, fusion re-tuned; published atomically",
    )
    p.add_argument("index", type=Path)
    p.add_argument("--model", help="sentence-transformers model name or local path (default: the index's)")
    p.add_argument(
        "--profile",
        choices=PROFILES,
        help="encoder profile (default: the index's): full, small (a student distilled on the documents), or fast (a static model)",
    )
    p.add_argument("--precision", choices=PRECISIONS, help="ONNX weights that embed the documents (default: the index's)")
    p.add_argument("--queries", type=Path, help="queries of the split the fusion was tuned on (default: queries.jsonl beside its qrels)")
    p.add_argument("--keep-fusion", action="store_true", help="keep the fusion tuned for the previous model instead of re-tuning it")
    add_device(p)
    add_quiet(p)
    p.set_defaults(run=run_reembed)

    p = commands.add_parser("download-beir", help="fetch a BEIR dataset if it is not on disk")
    p.add_argument("name")
    p.add_argument("--to", type=Path, default=Path(os.environ.get("BEIR_DATA", "data/beir")))
    p.set_defaults(run=lambda args: print(ensure_dataset(args.name, args.to)))


def add_build_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("index build")
    g.add_argument("--model", default=default(BuildOptions, "model"), help="sentence-transformers model name or local path")
    g.add_argument(
        "--profile",
        choices=PROFILES,
        default=default(BuildOptions, "profile"),
        help="encoder profile: full (the model), small (a 3-layer student distilled from it on the corpus), or fast (a static "
        "model distilled from it and aligned to it on the corpus): docs/relevance.md#encoder-profiles",
    )
    g.add_argument("--backend", choices=BACKENDS, default=default(BuildOptions, "backend"), help="how documents are embedded")
    g.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=default(BuildOptions, "precision"),
        help="ONNX weights that embed documents and later writes (int8: faster on CPU, see docs/BENCHMARKS.md)",
    )
    g.add_argument(
        "--faiss",
        choices=FAISS_KINDS,
        help=f"the vector index (default: flat below --exact-below documents, {DEFAULT_PARAMS.kind} from there: "
        "8-bit codes in IVF clusters, candidates rescored from the stored vectors)",
    )
    g.add_argument("--nlist", type=int, default=default(FaissParams, "nlist"), help="IVF clusters (default ~4*sqrt(n))")
    g.add_argument("--nprobe", type=int, default=default(FaissParams, "nprobe"))
    g.add_argument("--hnsw-m", type=int, default=default(FaissParams, "hnsw_m"))
    g.add_argument(
        "--pq-m", type=int, default=default(FaissParams, "pq_m"), help="ivfpq: bytes a vector (sub-quantizers; must divide the dimension)"
    )
    g.add_argument(
        "--pq-refine",
        type=int,
        default=default(FaissParams, "pq_refine"),
        help="ivfpq, sq8, hnsw_sq8: candidates fetched per result and rescored exactly with the stored vectors",
    )
    g.add_argument("--ef-search", type=int, default=default(FaissParams, "ef_search"))
    g.add_argument("--bm25-method", choices=BM25_METHODS, default=default(BM25Params, "method"))
    g.add_argument("--k1", type=float, default=default(BM25Params, "k1"))
    g.add_argument("--b", type=float, default=default(BM25Params, "b"))
    g.add_argument("--language", help="BM25's language (name or ISO code): sets --stemmer and --stopwords (default english)")
    g.add_argument("--stopwords", choices=STOPWORD_LISTS, help="stop-word list (default: the language's; en: Lucene's English list)")
    g.add_argument("--stemmer", choices=STEMMERS, help="stemmer (default: the language's; porter for English)")
    g.add_argument("--normalization", choices=NORMALIZATIONS, help="nfkc: fold full-width and compatibility forms (default none)")
    g.add_argument("--fold-accents", action="store_true", help="strip accents: café matches cafe")
    g.add_argument("--cjk", choices=CJK_MODES, help="Chinese/Japanese/Korean runs: bigram (default) or a segmenter (extras zh, ja, ko)")
    g.add_argument("--synonyms", type=Path, help="a JSON file of query-time synonym rules (search.synonyms; changeable later)")
    g.add_argument(
        "--flat-search-cutoff",
        type=int,
        default=default(FaissParams, "flat_search_cutoff"),
        help="IVF and HNSW: a filter admitting at most this many documents is scored exactly over their vectors",
    )
    g.add_argument(
        "--exact-below",
        type=int,
        help="below this many documents the vector index is exact (Flat) whatever --faiss says (default: "
        f"{DEFAULT_PARAMS.exact_below:,} without --faiss, 0 with it; a collection's vectors.exact_below: build one "
        "offline with its value to get the same index)",
    )
    g.add_argument(
        "--filterable",
        type=_field_list,
        help='metadata fields to index for filters, comma-separated (default: every field whose values share a type; "" for none)',
    )
    g.add_argument(
        "--chunking",
        type=_chunking,
        default=ChunkingParams(),
        metavar="METHOD[:SIZE[:OVERLAP]]",
        help="cut documents into passages for the dense leg: tokens or paragraphs, SIZE word pieces of the model, OVERLAP "
        f"repeated (default none: one vector per document, of its head; tokens alone: tokens:{default(ChunkingParams, 'size')}:"
        f"{default(ChunkingParams, 'overlap')})",
    )
    g.add_argument("--batch-size", type=int, default=default(BuildOptions, "batch_size"))
    add_quiet(g)


def run_ingest(args: argparse.Namespace) -> None:
    if args.documents is None and args.delete is None:
        raise ConfigError("nothing to do: give a documents file and/or --delete IDS_FILE")
    collection = writer(args.index, args.device, args.batch_docs)
    started, written, deleted = time.perf_counter(), 0, 0
    try:
        if args.documents is not None:
            batch = []
            for doc in read_corpus(args.documents):
                batch.append({"id": doc.doc_id, "title": doc.title, "text": doc.text, "metadata": doc.metadata})
                if len(batch) == args.batch_docs:
                    written += len(batch)
                    collection.upsert(batch)
                    batch = []
            if batch:
                written += len(batch)
                collection.upsert(batch)
        if args.delete is not None:
            ids = [line.strip() for line in args.delete.read_text(encoding="utf-8").splitlines() if line.strip()]
            for start in range(0, len(ids), args.batch_docs):
                collection.delete(ids[start : start + args.batch_docs])
            deleted = len(ids)
    finally:
        collection.close()
    print(
        f"{written} documents upserted, {deleted} ids deleted in {time.perf_counter() - started:.1f} s; logged up to "
        f"sequence {collection.seq} in {log_folder(args.index)} (a running service picks them up on restart or reload)"
    )


def run_repair(args: argparse.Namespace) -> int:
    """Prints the salvage report as JSON; exit code 0 when every record was intact, 1 when some were dropped."""
    report = repair_log(args.index, dry_run=args.dry_run)
    print(json.dumps({"index": str(args.index), "dry_run": args.dry_run, **report.to_dict()}, indent=2))
    return 1 if report.damage else 0


def run_reembed(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    if args.model is None and args.profile is None:
        raise ConfigError("give --model, --profile or both: what the documents are embedded with next")
    report = reembed_index(
        args.index, args.model, args.precision, args.device, args.queries, args.keep_fusion, progress=not args.quiet, profile=args.profile
    )
    print(json.dumps(report, indent=2))
    took = time.perf_counter() - started
    what = f"{report['model']} ({report['profile']} profile)"
    print(f"re-embedded {report['documents']} documents of {args.index} with {what} in {took:.1f} s")


def build_options(args: argparse.Namespace) -> BuildOptions:
    given = {name: getattr(args, name) for name in ("language", "stemmer", "stopwords", "normalization", "cjk") if getattr(args, name)}
    analyzer = parse_analyzer({**given, **({"fold_accents": True} if args.fold_accents else {})}, "analyzer")
    return BuildOptions(
        model=args.model,
        profile=args.profile,
        backend=args.backend,
        precision=args.precision,
        analyzer=analyzer,
        synonyms=tuple(json.loads(args.synonyms.read_text())) if args.synonyms else (),
        bm25=BM25Params(method=args.bm25_method, k1=args.k1, b=args.b),
        faiss=FaissParams(
            kind=args.faiss or DEFAULT_PARAMS.kind,
            nlist=args.nlist,
            nprobe=args.nprobe,
            hnsw_m=args.hnsw_m,
            pq_m=args.pq_m,
            pq_refine=args.pq_refine,
            ef_search=args.ef_search,
            flat_search_cutoff=args.flat_search_cutoff,
            exact_below=args.exact_below if args.exact_below is not None else DEFAULT_PARAMS.exact_below if args.faiss is None else 0,
        ),
        device=args.device,
        batch_size=args.batch_size,
        progress=not args.quiet,
        filterable=args.filterable,
        chunking=args.chunking,
    )


def _chunking(text: str) -> ChunkingParams:
    method, *numbers = text.split(":")
    if len(numbers) > 2 or not all(n.isdigit() for n in numbers):
        raise argparse.ArgumentTypeError(f"expected METHOD[:SIZE[:OVERLAP]] with whole numbers, got {text!r}")
    try:
        return ChunkingParams(method, *map(int, numbers))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _field_list(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _collection_folder(args: argparse.Namespace) -> Path:
    """Where `--collection NAME` builds: the data directory's folder of that name, free unless --replace."""
    folder = new_collection_folder(data_dir(args.data), args.collection, replace=args.replace or args.skip_if_current)
    if args.shards is not None:
        raise ConfigError("--collection builds a whole index: a data directory's collections are not sharded")
    return folder


def run_index(args: argparse.Namespace) -> None:
    if args.collection is not None:
        args.out = _collection_folder(args)
    elif args.data is not None or args.replace:
        raise ConfigError("--data and --replace go with --collection")
    if args.skip_if_current and index_is_current(args.corpus, args.out):
        print(f"{args.out} is current (same corpus checksum): build skipped")
        return
    started = time.perf_counter()
    embed = None
    if args.ray is not None:
        from hybrid_retrieval.cluster.build import ray_embed  # Ray is an optional extra

        embed = ray_embed(args.ray or None, args.embed_actors, args.precision, args.device, args.batch_size)
    if args.shards is None:
        manifest = build_index(args.corpus, args.out, build_options(args), embed=embed)
    else:
        check_shard_count(args.shards)
        with tempfile.TemporaryDirectory(prefix=f".{args.out.name}.whole-", dir=args.out.resolve().parent) as work:
            manifest = build_index(args.corpus, Path(work) / "index", build_options(args), embed=embed)
            split_index(Path(work) / "index", args.out, args.shards, verify="size")
    peak = peak_memory_mib()
    into = f"{args.out} ({args.shards} shards)" if args.shards else args.out
    print(
        f"indexed {manifest.documents} documents into {into} in {time.perf_counter() - started:.1f} s "
        f"(peak memory {peak:.0f} MiB); stages: {json.dumps(manifest.build)}"
    )


def run_shard(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    info = split_index(args.index, args.out, args.shards)
    sizes = ", ".join(str(shard["documents"]) for shard in info["shards"])
    print(
        f"split {info['documents']} documents of {args.index} into {len(info['shards'])} shards at {args.out} "
        f"({sizes} documents) in {time.perf_counter() - started:.1f} s"
    )
