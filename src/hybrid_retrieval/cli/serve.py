"""`hybrid serve` (starts the HTTP service, which owns its flags) and `hybrid search` (one query, no server)."""

from __future__ import annotations

import html
import json
import os
import sys
from pathlib import Path

from hybrid_retrieval.cli.args import add_device, add_filter
from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.engine.offline import search_view
from hybrid_retrieval.models.cross_encoder import load_cross_encoder, rerank_weight
from hybrid_retrieval.models.onnx_export import SERVED_PRECISIONS
from hybrid_retrieval.search.rerank import DEFAULT_RERANK_DEPTH
from hybrid_retrieval.search.spec import MODES, parse_spec_string


def register(commands) -> None:
    # every flag goes to the service itself (app/__main__.py): `hybrid serve --help` lists them
    p = commands.add_parser("serve", help="serve POST /search over HTTP (flags: hybrid serve --help)", add_help=False)
    p.set_defaults(run=run_serve)

    p = commands.add_parser("search", help="query an index from the command line")
    p.add_argument("index", type=Path)
    p.add_argument("query")
    p.add_argument("--mode", choices=MODES)
    p.add_argument(
        "--spec", help="search spec in its string form, e.g. 'hybrid+cc:zscore:0.45+rerank:w=0.5' (docs/http-api.md: the search spec)"
    )
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--offset", type=int, default=0, help="hits to skip (page 2 of 10: --offset 10)")
    add_filter(p)
    p.add_argument("--highlight", action="store_true", help="show the best snippet of each hit, query terms in [brackets]")
    p.add_argument(
        "--fields", type=lambda text: text if text == "*" else text.split(","), help="metadata fields to show, comma-separated, or '*'"
    )
    p.add_argument("--passages", type=int, default=0, help="a chunked index: show each hit's N passages nearest the query")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--reranker", help=f"rerank the top {DEFAULT_RERANK_DEPTH} with this cross-encoder (e.g. a `hybrid train-reranker` folder)"
    )
    p.add_argument("--reranker-precision", choices=SERVED_PRECISIONS, default="auto", help="auto: int8 on CPU, fp32 on GPU")
    p.add_argument(
        "--rerank-weight", type=float, help="interpolation weight of the cross-encoder, 0..1 (default: its tuned weight, else 1)"
    )
    add_device(p)
    p.set_defaults(run=run_search)


def run_serve(args) -> int | None:
    if any(option == "--ray" or option.startswith("--ray=") for option in args.options):
        from hybrid_retrieval.cluster.serve import main  # sharded serving on Ray Serve (the ray extra)

        return main(args.options)
    # The service is its own program (app/__main__.py): exec it, so signals such as SIGHUP reach it directly.
    os.execv(sys.executable, [sys.executable, "-m", "hybrid_retrieval.app", *args.options])


def run_search(args) -> None:
    if args.rerank_weight is not None and not args.reranker:
        raise ConfigError("--rerank-weight needs --reranker")
    if args.mode and args.spec:
        raise ConfigError("give --mode or --spec (which starts with the mode), not both")
    spec = parse_spec_string(args.spec) if args.spec else {"mode": args.mode} if args.mode else {}
    if args.filter is not None:
        spec["filter"] = args.filter
    if args.highlight:
        spec["highlight"] = True
    view = search_view(args.index, args.device)  # with the writes of the API or `hybrid ingest`
    model, reranking = None, {}
    if args.reranker:
        model = load_cross_encoder(args.reranker, device=args.device, precision=args.reranker_precision)
        reranking = {"rerank": {"enabled": True, "weight": rerank_weight(args.reranker, args.rerank_weight)}}
    pipeline = view.pipeline(reranking, cross_encoder=model, cross_encoder_name=args.reranker or "")
    presenter = view.presenter()
    fields = presenter.check_fields(args.fields, "--fields")
    passages = presenter.check_passages(args.passages, "--passages")
    result = pipeline.search(args.query, args.k, spec, offset=args.offset)
    hits = presenter.hits(result, args.query, fields=fields, passages=passages)
    if args.json:
        print(
            json.dumps(
                {
                    "query": args.query,
                    "offset": result.offset,
                    "has_more": result.has_more,
                    "spec": result.spec.to_dict(),
                    "hits": hits,
                    "timings_ms": result.timings_ms,
                },
                indent=2,
                ensure_ascii=False,
            )
        )
        return
    for hit in hits:
        print(f"{hit['rank']:>4}  {hit['score']:10.4f}  {hit['id']:<16} {hit['title'][:80]}")
        if "fields" in hit:
            print(f"{'':22}{json.dumps(hit['fields'], ensure_ascii=False)}")
        snippets = hit.get("highlight", {}).get("text", [])
        if snippets:
            print(f"{'':22}{_plain(snippets[0]['text'])}")
        for passage in hit.get("passages", []):
            print(f"{'':22}{passage['score']:.4f} [{passage['start']}:{passage['end']}] {passage['text'][:100]}")
    more = ", more below" if result.has_more else ""
    print(f"({result.timings_ms['total']:.1f} ms, {result.spec.to_string()}{more})")


def _plain(snippet: str) -> str:
    """A highlight snippet for a terminal: marks as [brackets], entities unescaped."""
    return html.unescape(snippet.replace("<mark>", "[").replace("</mark>", "]"))
