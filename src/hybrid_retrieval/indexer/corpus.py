"""Streaming readers for corpora (BEIR folder or plain JSONL), queries and qrels.

Every problem names the file and line: a build stops at the first one.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hybrid_retrieval.common import fastjson
from hybrid_retrieval.common.errors import HybridError
from hybrid_retrieval.indexer.chunking import joined_paragraphs


class CorpusError(HybridError, ValueError):
    """A corpus, queries or qrels file is malformed; the message names the file and line."""

    def __init__(self, path: Path | str, line: int | None, message: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path, self.line = str(path), line


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str
    title: str = ""
    metadata: dict = field(default_factory=dict)

    @property
    def indexed_text(self) -> str:
        return indexed_text(self.title, self.text)


def indexed_text(title: str, text: str) -> str:
    """What both retrievers see: title and body, as in the BEIR baselines."""
    return f"{title} {text}" if title else text


def corpus_file(path: Path | str) -> Path:
    """`corpus.jsonl` inside a BEIR folder, or the JSONL file itself."""
    path = Path(path)
    if path.is_dir():
        candidate = path / "corpus.jsonl"
        if not candidate.is_file():
            raise CorpusError(path, None, "folder has no corpus.jsonl (expected BEIR layout)")
        return candidate
    if not path.is_file():
        raise CorpusError(path, None, "no such corpus file or folder")
    return path


def count_records(path: Path | str) -> int:
    """How many records (non-blank lines) the corpus has, without parsing them: the total of a build's progress."""
    with corpus_file(path).open("rb") as fh:
        return sum(1 for raw in fh if raw.strip())


def _records(path: Path) -> Iterator[tuple[int, dict]]:
    with path.open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                record = fastjson.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise CorpusError(path, line_no, f"malformed JSON ({exc})") from None
            if not isinstance(record, dict):
                raise CorpusError(path, line_no, f"expected a JSON object, got {type(record).__name__}")
            yield line_no, record


def _record_id(path: Path, line_no: int, record: dict) -> str:
    raw = record.get("_id", record.get("id"))
    if isinstance(raw, bool) or not isinstance(raw, (str, int)) or str(raw).strip() == "":
        raise CorpusError(path, line_no, "missing or empty id (field '_id' or 'id', string or integer)")
    return str(raw)


def _optional_str(path: Path, line_no: int, record: dict, name: str) -> str:
    value = record.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        kind = "a string" + (" or a list of strings (paragraphs)" if name == "text" else "")
        raise CorpusError(path, line_no, f"field {name!r} must be {kind}, got {type(value).__name__}")
    return value


def read_corpus(path: Path | str) -> Iterator[Document]:
    """Yield documents one by one; stops with CorpusError on the first bad line or repeated id."""
    file = corpus_file(path)
    seen: dict[str, int] = {}
    for line_no, record in _records(file):
        doc_id = _record_id(file, line_no, record)
        if doc_id in seen:
            raise CorpusError(file, line_no, f"duplicate id {doc_id!r} (first seen on line {seen[doc_id]})")
        seen[doc_id] = line_no
        if "text" not in record:
            raise CorpusError(file, line_no, "missing field 'text'")
        text = _optional_str(file, line_no, {**record, "text": joined_paragraphs(record["text"])}, "text")
        title = _optional_str(file, line_no, record, "title")
        if not (text.strip() or title.strip()):
            raise CorpusError(file, line_no, "document has neither text nor title")
        metadata = dict(record["metadata"]) if isinstance(record.get("metadata"), dict) else {}
        metadata.update({k: v for k, v in record.items() if k not in ("_id", "id", "title", "text", "metadata")})
        yield Document(doc_id=doc_id, text=text, title=title, metadata=metadata)


def read_queries(path: Path | str) -> dict[str, str]:
    """BEIR `queries.jsonl` ({"_id", "text"}) as {query_id: text}."""
    file = Path(path)
    queries: dict[str, str] = {}
    for line_no, record in _records(file):
        query_id = _record_id(file, line_no, record)
        text = record.get("text")
        if not isinstance(text, str) or not text.strip():
            raise CorpusError(file, line_no, "query has no text")
        queries[query_id] = text
    return queries


def read_qrels(path: Path | str) -> dict[str, dict[str, int]]:
    """BEIR qrels TSV (header `query-id corpus-id score`) as {query_id: {doc_id: relevance}}."""
    file = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    with file.open(newline="") as fh:
        for line_no, row in enumerate(csv.reader(fh, delimiter="\t"), start=1):
            if not row or (line_no == 1 and row[0] == "query-id"):
                continue
            if len(row) != 3:
                raise CorpusError(file, line_no, f"expected 3 tab-separated columns, got {len(row)}")
            try:
                relevance = int(row[2])
            except ValueError:
                raise CorpusError(file, line_no, f"relevance {row[2]!r} is not an integer") from None
            qrels.setdefault(row[0], {})[row[1]] = relevance
    return qrels


def split_queries(dataset: Path | str, split: str) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """Queries and qrels of one split of a BEIR folder: only queries judged in that split."""
    dataset = Path(dataset)
    qrels_file = dataset / "qrels" / f"{split}.tsv"
    if not qrels_file.is_file():
        available = sorted(p.stem for p in (dataset / "qrels").glob("*.tsv"))
        raise CorpusError(qrels_file, None, f"no qrels for split {split!r}; available: {', '.join(available) or 'none'}")
    qrels = read_qrels(qrels_file)
    queries = read_queries(dataset / "queries.jsonl")
    missing = sorted(set(qrels) - set(queries))
    if missing:
        raise CorpusError(qrels_file, None, f"{len(missing)} judged queries missing from queries.jsonl, e.g. {missing[:3]}")
    return {qid: queries[qid] for qid in qrels}, qrels
