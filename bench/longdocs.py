"""A long-document variant of a BEIR dataset, to measure chunking where it matters.

Each long document is `group` consecutive documents of the original corpus (in its file order), each part written as
its title and text, parts separated by a blank line; the long document has no title of its own. A query is relevant to
a long document when it was relevant to one of its parts (the highest grade among them). Queries are unchanged. With
scifact's abstracts (about 300 word pieces each) and group 5, a long document is about 1,500 word pieces, six times
what all-MiniLM-L6-v2 reads.

    python -m bench.longdocs OUT [--data ../shared/data/beir/scifact] [--group 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from hybrid_retrieval.indexer.corpus import read_corpus, read_qrels

PART_SEPARATOR = "\n\n"


def make_long_variant(source: Path, out: Path, group: int = 5) -> Path:
    """Write the variant of the BEIR folder `source` into `out` (BEIR layout) and return `out`; kept when present and
    made with the same group size."""
    description = {"source": str(source), "group": group, "separator": PART_SEPARATOR}
    if (out / "variant.json").is_file() and json.loads((out / "variant.json").read_text()) == description:
        return out
    out.mkdir(parents=True, exist_ok=True)
    parent_of: dict[str, str] = {}
    docs = list(read_corpus(source))
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for first in range(0, len(docs), group):
            parts = docs[first : first + group]
            doc_id = f"long-{first // group}"
            text = PART_SEPARATOR.join(f"{d.title}. {d.text}" if d.title else d.text for d in parts)
            fh.write(json.dumps({"_id": doc_id, "title": "", "text": text, "parts": [d.doc_id for d in parts]}, ensure_ascii=False) + "\n")
            parent_of.update({d.doc_id: doc_id for d in parts})
    shutil.copyfile(source / "queries.jsonl", out / "queries.jsonl")
    (out / "qrels").mkdir(exist_ok=True)
    for qrels_file in sorted((source / "qrels").glob("*.tsv")):
        mapped: dict[tuple[str, str], int] = {}
        for qid, judged in read_qrels(qrels_file).items():
            for doc_id, grade in judged.items():
                key = (qid, parent_of[doc_id])
                mapped[key] = max(grade, mapped.get(key, grade))
        lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t{g}" for (q, d), g in mapped.items())]
        (out / "qrels" / qrels_file.name).write_text("\n".join(lines) + "\n")
    (out / "variant.json").write_text(json.dumps(description, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.longdocs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/beir/scifact"))
    parser.add_argument("--group", type=int, default=5, help="original documents per long document")
    args = parser.parse_args(argv)
    print(make_long_variant(args.data, args.out, args.group))


if __name__ == "__main__":
    main()
