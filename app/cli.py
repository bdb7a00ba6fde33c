"""The `hybrid` command: index, serve, search, eval, bench, download-beir."""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

logger = logging.getLogger("hybrid")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _build_options(args):
    from indexer.build import BuildOptions
    from search.analyzer import Analyzer
    from search.bm25 import BM25Params
    from search.dense import FaissParams

    return BuildOptions(
        model=args.model,
        backend=args.backend,
        analyzer=Analyzer(stopwords=args.stopwords, stemmer=args.stemmer),
        bm25=BM25Params(method=args.bm25_method, k1=args.k1, b=args.b),
        faiss=FaissParams(kind=args.faiss, nlist=args.nlist, nprobe=args.nprobe, hnsw_m=args.hnsw_m, ef_search=args.ef_search),
        device=args.device,
        batch_size=args.batch_size,
        progress=not args.quiet,
    )


def _index_is_current(corpus: Path, out: Path) -> bool:
    """`out` is an intact index built from a corpus with the checksum `corpus` has now."""
    from indexer.corpus import corpus_file
    from indexer.store import IndexOpenError, read_manifest, sha256_file, verify_files

    try:
        manifest = read_manifest(out)
        verify_files(out, manifest, "size")
    except IndexOpenError:
        return False
    return manifest["corpus"].get("sha256") == sha256_file(corpus_file(corpus))


def cmd_index(args) -> int:
    from indexer.build import build_index

    if args.skip_if_current and _index_is_current(args.corpus, args.out):
        print(f"{args.out} is current (same corpus checksum): build skipped")
        return 0
    started = time.perf_counter()
    manifest = build_index(args.corpus, args.out, _build_options(args))
    wall = time.perf_counter() - started
    print(f"indexed {manifest['counts']['documents']} documents into {args.out} in {wall:.1f} s "
          f"(peak memory {_peak_rss_mib():.0f} MiB); stages: {json.dumps(manifest['build'])}")
    return 0


def cmd_serve(args) -> int:
    import uvicorn

    from app.main import create_app
    from app.settings import Settings

    overrides = {k: v for k, v in {"index": args.index, "host": args.host, "port": args.port, "device": args.device, "verify": args.verify}.items() if v is not None}
    settings = Settings(**overrides)
    if settings.index is None:
        print("error: no index given: pass --index DIR or set HYBRID_INDEX", file=sys.stderr)
        return 2
    if args.log_format == "json":
        from app.observability import JsonFormatter

        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    # Our middleware writes one structured access line per request: uvicorn's own access log would double it.
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level,
                access_log=False, log_config=None)
    return 0


def _open(path, device="auto", verify="size"):
    from indexer.store import open_index

    index = open_index(path, verify=verify, device=device)
    return index, index.pipeline()


def cmd_search(args) -> int:
    if args.rerank_weight is not None and not args.reranker:
        raise ValueError("--rerank-weight needs --reranker")
    index, pipeline = _open(args.index, args.device)
    if args.reranker:
        from models.cross_encoder import load_cross_encoder, rerank_weight
        from search.rerank import RerankOptions

        model = load_cross_encoder(args.reranker, device=args.device, precision=args.reranker_precision)
        pipeline = index.pipeline(rerank=RerankOptions(model, name=args.reranker, weight=rerank_weight(args.reranker, args.rerank_weight)))
    result = pipeline.search(args.query, k=args.k, mode=args.mode)
    hits = []
    for rank, (doc_idx, score) in enumerate(zip(result.ranking.doc_idx, result.ranking.scores), start=1):
        doc = index.docs.get(int(doc_idx))
        hits.append({"rank": rank, "id": doc["id"], "score": float(score), "title": doc["title"]})
    if args.json:
        print(json.dumps({"query": args.query, "mode": args.mode, "hits": hits, "timings_ms": result.timings_ms}, indent=2))
    else:
        for hit in hits:
            print(f"{hit['rank']:>4}  {hit['score']:10.4f}  {hit['id']:<16} {hit['title'][:80]}")
        print(f"({result.timings_ms['total']:.1f} ms)")
    return 0


def cmd_eval(args) -> int:
    from evaluation.report import first_stage_table
    from evaluation.suite import EvalConfig, evaluate_dataset, summary_table
    from indexer.build import build_index

    if args.index and len(args.data) > 1:
        print("error: --index names one index; with several datasets each gets indexes/<dataset>", file=sys.stderr)
        return 2
    config = EvalConfig(split=args.split, pipelines=tuple(args.pipelines.split(",")), all_fusions=args.all_fusions,
                        all_hubness=args.all_hubness, tune=not args.no_tune, progress=not args.quiet,
                        reranker=args.reranker, rerank_depth=args.rerank_depth)
    reports = []
    for dataset in args.data:
        index_dir = args.index or Path("indexes") / dataset.name
        if not (index_dir / "manifest.json").is_file():
            build_index(dataset, index_dir, _build_options(args))
        report = evaluate_dataset(dataset, index_dir, config, args.out / dataset.name if args.out else None)
        reports.append(report)
        print(f"{dataset.name} / {args.split} ({report['queries']} queries; fusion tuned on {report['tuned_on'] or 'nothing: untuned'})")
        columns = [c for c, v in next(iter(report["pipelines"].values())).items() if not isinstance(v, dict)]
        widths = [max(10, len(c) + 2) for c in columns]
        print(f"{'pipeline':<22}" + "".join(f"{c:>{w}}" for c, w in zip(columns, widths)))
        for spec, metrics in report["pipelines"].items():
            print(f"{spec:<22}" + "".join(f"{metrics[c]:>{w}.4f}" if isinstance(metrics[c], float) else f"{metrics[c]:>{w}}"
                                          for c, w in zip(columns, widths)))
        print("\n".join(first_stage_table(report["pipelines"])))
    summary = summary_table(reports)
    print(summary)
    if args.out:
        (args.out / "summary.md").write_text(summary)
        (args.out / "summary.json").write_text(json.dumps(reports, indent=2))
        print(f"reports, charts, TREC runs and cached runs under {args.out}")
    return 0


def _training_split(queries_path: Path, qrels_path: Path) -> tuple[dict[str, str], dict]:
    """The judged queries of a train/dev split; test qrels are refused before a single query is read."""
    from evaluation.tuning import refuse_test_split
    from indexer.corpus import read_qrels, read_queries

    refuse_test_split(qrels_path)
    qrels = read_qrels(qrels_path)
    all_queries = read_queries(queries_path)
    missing = sorted(set(qrels) - set(all_queries))
    if missing:
        raise SystemExit(f"error: {len(missing)} judged queries of {qrels_path} are not in {queries_path}, e.g. {missing[:3]}")
    return {qid: all_queries[qid] for qid in qrels}, qrels


def cmd_tune(args) -> int:
    from evaluation.tuning import format_table, tune_index
    from search.fusion import fusion_to_dict

    queries, qrels = _training_split(args.queries, args.qrels)
    out = args.out or args.index / "tuning"
    result = tune_index(args.index, queries, qrels, args.qrels, args.metric, out, write=not args.dry_run, progress=not args.quiet)
    print(format_table(result))
    print(f"best: {fusion_to_dict(result.best_fusion())} ({args.metric} {result.best()[args.metric]:.4f} on {len(queries)} "
          f"queries of {args.qrels.name}); table and plot in {out}")
    if not args.dry_run:
        print(f"wrote the fusion into {args.index / 'manifest.json'}: the service now uses it by default")
    return 0


def cmd_train_reranker(args) -> int:
    from models.reranker_training import TrainOptions, train_reranker

    queries, qrels = _training_split(args.queries, args.qrels)
    options = TrainOptions(base_model=args.base_model, max_length=args.max_length, negatives=args.negatives,
                           mine_depth=args.mine_depth, epochs=args.epochs, groups_per_step=args.groups_per_step,
                           learning_rate=args.lr, dev_fraction=args.dev_fraction, seed=args.seed, device=args.device)
    index, _ = _open(args.index, args.device)
    record = train_reranker(index, queries, qrels, args.out, options, split=args.qrels.stem, progress=not args.quiet)
    print(json.dumps(record, indent=2))
    print(f"reranker saved to {args.out} (ONNX in {args.out / 'onnx'}); serve it with HYBRID_RERANKER={args.out}")
    return 0


def cmd_hubness_fit(args) -> int:
    from evaluation.hubness_eval import tune_hubness
    from evaluation.runner import doc_ids
    from indexer.corpus import read_qrels
    from indexer.hubness import fit_hubness, load_bank, pseudo_bank, sample_gallery
    from indexer.store import open_index
    from search.hubness import HubnessParams

    params = HubnessParams(beta=args.beta, beta1=args.beta1, beta2=args.beta2, k=args.k)
    index = open_index(args.index, verify="size", device="cpu")
    if str(args.bank) == "pseudo":
        texts, info = pseudo_bank(index, args.pseudo_size)
    else:
        texts, info = load_bank(args.bank, args.split_qrels)
    tuning, bank = None, index.embedder.encode(texts)
    if args.tune:
        if info["kind"] != "queries":
            print("error: --tune needs a labelled bank: --bank queries.jsonl --split-qrels qrels/train.tsv", file=sys.stderr)
            return 2
        qrels = read_qrels(args.split_qrels)
        embeddings = np.asarray(index.embeddings)
        params, table = tune_hubness(bank, list(qrels), qrels, embeddings, doc_ids(index), args.method, args.dynamic,
                                     params, sample_gallery(len(embeddings), args.gallery_size))
        tuning = {"metric": "ndcg@10", "folds": 5, "table": table}
        for row in table:
            print("  ".join(f"{k}={v:.4g}" for k, v in row.items()))
    manifest = fit_hubness(index, texts, info, params, args.method, args.dynamic, args.gallery_size, tuning=tuning, bank=bank)
    index.close()
    spec = manifest["hubness"]
    print(f"fitted {args.method}{' (dynamic)' if args.dynamic else ''} with {json.dumps(spec['params'])} on a {info['kind']} bank of {info['size']} "
          f"in {spec['fit_seconds']} s; activation sets: {spec['activation']}")
    return 0


def cmd_hubness_report(args) -> int:
    from evaluation.hubness_eval import hubness_report, plot_histograms
    from evaluation.runner import doc_ids
    from indexer.corpus import read_qrels, read_queries

    index, pipeline = _open(args.index, "cpu")
    if pipeline.hubness is None:
        print("error: this index has no fitted hubness correction: run `hybrid hubness fit` first", file=sys.stderr)
        return 2
    queries = read_queries(args.queries)
    if args.split_qrels:
        queries = {q: queries[q] for q in read_qrels(args.split_qrels) if q in queries}
    report = hubness_report(index.embedder.encode(list(queries.values())), np.asarray(index.embeddings),
                            pipeline.hubness.correction, doc_ids(index), k=args.k)
    out = args.out or args.index / "hubness_report"
    out.mkdir(parents=True, exist_ok=True)
    plot_histograms(report, out / "k_occurrence.png", args.k)
    rows = {name: {k: v for k, v in values.items() if k != "counts"} for name, values in report.items()}
    (out / "report.json").write_text(json.dumps({"queries": len(queries), "k": args.k, "variants": rows}, indent=2))
    print(f"{len(queries)} queries, dense top-{args.k}")
    print(f"{'variant':<14}{'skewness':>10}{'never':>8}{'max N':>7}  top hubs (doc id: N_k)")
    for name, r in rows.items():
        hubs = ", ".join(f"{d}: {n}" for d, n in r["top_hubs"][:3])
        print(f"{name:<14}{r['skewness']:>10.3f}{r['never_retrieved']:>8.1%}{r['max_occurrence']:>7}  {hubs}")
    print(f"histogram and JSON in {out}")
    return 0


def cmd_bench(args) -> int:
    from evaluation.accel_bench import (
        batching_tradeoff,
        embedding_throughput,
        faiss_cpu_vs_gpu,
        query_embedding_latency,
        rerank_latency,
    )
    from evaluation.bench import (
        ann_comparison,
        bm25_throughput,
        http_load,
        hubness_overhead,
        pipeline_latency,
    )
    from indexer.corpus import split_queries

    queries, _ = split_queries(args.data, args.split)
    texts = list(queries.values())
    index, _ = _open(args.index, args.device)
    report = {
        "index": str(args.index),
        "documents": index.num_docs,
        "queries": len(texts),
        "cpu_count": os.cpu_count(),
        "bm25_throughput": bm25_throughput(index, texts),
        "latency": pipeline_latency(index, texts),
    }
    if index.hubness is not None:
        report["hubness_overhead"] = hubness_overhead(index, texts)
    report["dense_indexes"] = ann_comparison(index, texts)
    report["query_embedding"] = query_embedding_latency(index, texts)
    report["embedding_throughput"] = embedding_throughput(index)
    if args.batching_seconds > 0:
        report["batching"] = batching_tradeoff(index, texts, seconds=args.batching_seconds)
    if args.reranker:
        from models.onnx_export import training_record

        report["rerank_latency"] = rerank_latency(index, args.reranker, texts, device="cpu")
        report["reranker_training"] = training_record(args.reranker)
    if args.faiss_vectors:
        report["faiss_cpu_vs_gpu"] = faiss_cpu_vs_gpu(args.faiss_vectors)
    report["http"] = http_load(args.index, texts, requests_per_level=args.http_requests)
    build = index.manifest["build"]
    report["build"] = {"documents_per_s": round(index.num_docs / build["total_s"], 1), "total_s": build["total_s"],
                       "peak_rss_mib": build.get("peak_rss_mib")}
    report["peak_rss_mib"] = round(_peak_rss_mib(), 1)
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


def cmd_download_beir(args) -> int:
    from evaluation.beir import ensure_dataset

    print(ensure_dataset(args.name, args.to))
    return 0


def _add_build_flags(p: argparse.ArgumentParser) -> None:
    from indexer.build import BuildOptions
    from search.analyzer import STEMMERS, STOPWORD_LISTS
    from search.bm25 import BM25_METHODS
    from search.dense import FAISS_KINDS

    g = p.add_argument_group("index build")
    g.add_argument("--model", default=BuildOptions.model, help="sentence-transformers model name or local path")
    g.add_argument("--backend", choices=("onnx", "torch"), default="onnx", help="how documents are embedded")
    g.add_argument("--faiss", choices=FAISS_KINDS, default="flat")
    g.add_argument("--nlist", type=int, default=None, help="IVF clusters (default ~4*sqrt(n))")
    g.add_argument("--nprobe", type=int, default=16)
    g.add_argument("--hnsw-m", type=int, default=32)
    g.add_argument("--ef-search", type=int, default=128)
    g.add_argument("--bm25-method", choices=BM25_METHODS, default="lucene")
    g.add_argument("--k1", type=float, default=1.5)
    g.add_argument("--b", type=float, default=0.75)
    g.add_argument("--stopwords", choices=STOPWORD_LISTS, default="en")
    g.add_argument("--stemmer", choices=STEMMERS, default="english")
    g.add_argument("--batch-size", type=int, default=16)
    g.add_argument("--quiet", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    from search.rerank import DEFAULT_RERANK_DEPTH

    parser = argparse.ArgumentParser(prog="hybrid", description="Hybrid BM25 + dense retrieval")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    devices = ("auto", "cpu", "gpu")

    p = sub.add_parser("index", help="build an index from a BEIR folder or a JSONL corpus")
    p.add_argument("corpus", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", choices=devices, default="auto", help="FAISS / ONNX device")
    p.add_argument("--skip-if-current", action="store_true",
                   help="do nothing when --out already holds an index of this corpus (same sha256; build options are not compared)")
    _add_build_flags(p)
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("serve", help="serve POST /search over HTTP")
    p.add_argument("--index", type=Path, help="index folder (env HYBRID_INDEX)")
    p.add_argument("--host", help="bind address (env HYBRID_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (env HYBRID_PORT, default 8000)")
    p.add_argument("--device", choices=devices)
    p.add_argument("--verify", choices=("full", "size", "none"), help="index file check at startup (default full)")
    p.add_argument("--log-format", choices=("json", "text"), default="json", help="log lines as JSON objects (default) or text")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("search", help="query an index from the command line")
    p.add_argument("index", type=Path)
    p.add_argument("query")
    p.add_argument("--mode", choices=("bm25", "dense", "hybrid"), default="hybrid")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--json", action="store_true")
    p.add_argument("--reranker", help=f"rerank the top {DEFAULT_RERANK_DEPTH} with this cross-encoder (e.g. a `hybrid train-reranker` folder)")
    p.add_argument("--reranker-precision", choices=("fp32", "int8"), default="fp32")
    p.add_argument("--rerank-weight", type=_unit_interval, help="interpolation weight of the cross-encoder, 0..1 (default: its tuned weight, else 1)")
    p.add_argument("--device", choices=devices, default="auto")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("eval", help="evaluate pipelines on a BEIR dataset split")
    p.add_argument("--data", type=Path, nargs="+", required=True, help="BEIR dataset folder(s) (corpus.jsonl, queries.jsonl, qrels/)")
    p.add_argument("--split", default="test")
    p.add_argument("--index", type=Path, help="index folder to use or build (default indexes/<dataset>)")
    p.add_argument("--no-tune", action="store_true", help="do not tune the fusion on the train/dev split of an untuned index")
    p.add_argument("--pipelines", default="bm25,dense,hybrid",
                   help="comma-separated: bm25, dense, hybrid (the index's default fusion), rrf:RRF_K, cc:NORM:ALPHA; append +qbnorm, +dbnorm[:dis] for hubness and +rerank[:int8] for the cross-encoder (--reranker)")
    p.add_argument("--all-hubness", action="store_true", help="also dense and hybrid with every hubness variant (needs `hybrid hubness fit`)")
    p.add_argument("--reranker", help="cross-encoder for `+rerank` pipelines (e.g. a `hybrid train-reranker` folder)")
    p.add_argument("--rerank-depth", type=int, default=DEFAULT_RERANK_DEPTH, help="first-stage candidates the reranker reorders")
    p.add_argument("--all-fusions", action="store_true", help="also every fusion the tuning record names (rrf 60, tuned rrf, each norm at its tuned alpha)")
    p.add_argument("--out", type=Path)
    p.add_argument("--device", choices=devices, default="auto")
    _add_build_flags(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("tune", help="choose the fusion (alpha, normalisation, rrf_k) on labelled training queries")
    p.add_argument("index", type=Path)
    p.add_argument("--queries", type=Path, required=True, help="queries.jsonl (only the queries judged in --qrels are read)")
    p.add_argument("--qrels", type=Path, required=True, help="qrels TSV of a training or dev split (never test)")
    p.add_argument("--metric", default="ndcg@10", help="ndcg@10, recall@100, mrr@10 or map@100")
    p.add_argument("--out", type=Path, help="where the table and plot go (default INDEX/tuning)")
    p.add_argument("--dry-run", action="store_true", help="report only; leave the manifest unchanged")
    p.add_argument("--device", choices=devices, default="auto")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("train-reranker", help="fine-tune a cross-encoder on a train split with hard negatives from the hybrid retriever")
    p.add_argument("index", type=Path, help="index whose hybrid retriever mines the hard negatives")
    p.add_argument("--queries", type=Path, required=True, help="queries.jsonl (only the queries judged in --qrels are read)")
    p.add_argument("--qrels", type=Path, required=True, help="qrels TSV of a training or dev split (never test)")
    p.add_argument("--out", type=Path, required=True, help="model folder to write (torch weights + onnx/)")
    from models.reranker_training import TrainOptions

    defaults = TrainOptions()
    p.add_argument("--base-model", default=defaults.base_model, help="model name or local path to start from")
    p.add_argument("--max-length", type=int, default=defaults.max_length, help="query + document tokens")
    p.add_argument("--negatives", type=int, default=defaults.negatives, help="hard negatives per positive")
    p.add_argument("--mine-depth", type=int, default=defaults.mine_depth, help="negatives are sampled from the hybrid top-N")
    p.add_argument("--epochs", type=int, default=defaults.epochs)
    p.add_argument("--groups-per-step", type=int, default=defaults.groups_per_step, help="(positive + negatives) groups per batch")
    p.add_argument("--lr", type=float, default=defaults.learning_rate)
    p.add_argument("--dev-fraction", type=_unit_interval, default=defaults.dev_fraction,
                   help="judged queries held out to tune the interpolation weight with the fused score (0: plain reranking)")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--device", choices=devices, default="auto", help="training (and mining) device")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_train_reranker)

    p = sub.add_parser("hubness", help="fit or inspect hubness correction (QB-Norm, DBNorm)")
    hub = p.add_subparsers(dest="hubness_command", required=True)
    p = hub.add_parser("fit", help="fit both corrections from a query bank; the chosen method becomes the default")
    p.add_argument("index", type=Path)
    p.add_argument("--bank", required=True, help="queries.jsonl (with --split-qrels), a text file with one query per line, or 'pseudo' (document titles)")
    p.add_argument("--split-qrels", type=Path, help="qrels of the split whose queries form the bank (never test)")
    p.add_argument("--method", choices=("qbnorm", "dbnorm"), default="qbnorm", help="the default applied to queries")
    p.add_argument("--dynamic", action="store_true", help="dynamic inverted softmax (DIS) by default")
    p.add_argument("--beta", type=float, default=20.0)
    p.add_argument("--beta1", type=float, default=1 / 1.99)
    p.add_argument("--beta2", type=float, default=3.0)
    p.add_argument("--k", type=int, default=1, help="activation set: each bank member's top-k documents")
    p.add_argument("--gallery-size", type=int, default=10_000)
    p.add_argument("--pseudo-size", type=int, default=5_000)
    p.add_argument("--tune", action="store_true", help="choose the method's betas by 5-fold cross-fitting on the labelled bank")
    p.set_defaults(func=cmd_hubness_fit)
    p = hub.add_parser("report", help="k-occurrence skewness, never-retrieved share and top hubs, before and after")
    p.add_argument("index", type=Path)
    p.add_argument("--queries", type=Path, required=True)
    p.add_argument("--split-qrels", type=Path, help="restrict to the queries of this split")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--out", type=Path)
    p.set_defaults(func=cmd_hubness_report)

    p = sub.add_parser("bench", help="measure throughput and latency side by side")
    p.add_argument("index", type=Path)
    p.add_argument("--data", type=Path, required=True, help="BEIR dataset folder supplying the queries")
    p.add_argument("--split", default="test")
    p.add_argument("--out", type=Path, help="write the JSON report here")
    p.add_argument("--http-requests", type=int, default=400, help="HTTP requests per concurrency level (loopback)")
    p.add_argument("--reranker", help=f"also time reranking the top {DEFAULT_RERANK_DEPTH}: torch vs ONNX fp32 vs ONNX int8")
    p.add_argument("--batching-seconds", type=float, default=10.0, help="per load level of the batching trade-off (0: skip)")
    p.add_argument("--faiss-vectors", type=int, default=0, help="also FAISS flat/IVF search on N random vectors, CPU vs GPU (0: skip)")
    p.add_argument("--device", choices=devices, default="auto")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("download-beir", help="fetch a BEIR dataset if it is not on disk")
    p.add_argument("name")
    p.add_argument("--to", type=Path, default=Path(os.environ.get("BEIR_DATA", "data/beir")))
    p.set_defaults(func=cmd_download_beir)
    return parser


def _unit_interval(text: str) -> float:
    """argparse type: a number from 0 to 1 (argparse names the flag in its error)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, RuntimeError, OSError) as exc:
        logger.debug("command failed", exc_info=True)
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
