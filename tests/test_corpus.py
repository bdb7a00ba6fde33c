import json

import pytest

from hybrid_retrieval.indexer.corpus import (
    CorpusError,
    corpus_file,
    read_corpus,
    read_qrels,
    read_queries,
    split_queries,
)
from tests.conftest import write_jsonl


def test_reads_ids_titles_text_and_metadata(tmp_path):
    path = write_jsonl(
        tmp_path / "c.jsonl",
        [
            {"_id": "a", "title": "T", "text": "body", "metadata": {"year": 2020}},
            {"id": 7, "text": "no title", "source": "web"},
        ],
    )
    docs = list(read_corpus(path))
    assert [(d.doc_id, d.title, d.text) for d in docs] == [("a", "T", "body"), ("7", "", "no title")]
    assert docs[0].metadata == {"year": 2020} and docs[1].metadata == {"source": "web"}
    assert docs[0].indexed_text == "T body" and docs[1].indexed_text == "no title"


def test_beir_folder_resolves_to_its_corpus(tmp_path):
    write_jsonl(tmp_path / "corpus.jsonl", [{"_id": "a", "text": "x"}])
    assert corpus_file(tmp_path) == tmp_path / "corpus.jsonl"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CorpusError, match="no corpus.jsonl"):
        corpus_file(empty)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"_id": "b", "text": ', "malformed JSON"),
        ('{"_id": "b", "title": "only"}', "missing field 'text'"),
        ('{"text": "no id"}', "missing or empty id"),
        ('{"_id": "b", "text": 5}', "field 'text' must be a string"),
        ('{"_id": "b", "text": "  ", "title": ""}', "document has neither text nor title"),
        ('["a", "list"]', "expected a JSON object"),
        ('{"_id": "a", "text": "again"}', "duplicate id 'a' \\(first seen on line 1\\)"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"_id": "a", "text": "fine"}) + "\n\n" + line + "\n")
    with pytest.raises(CorpusError, match=f"c.jsonl:3: {message}"):
        list(read_corpus(path))


def test_queries_qrels_and_split(tmp_path):
    write_jsonl(tmp_path / "queries.jsonl", [{"_id": "1", "text": "q one"}, {"_id": "2", "text": "q two"}])
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n2\td1\t1\n2\td2\t2\n")
    assert read_queries(tmp_path / "queries.jsonl") == {"1": "q one", "2": "q two"}
    assert read_qrels(tmp_path / "qrels" / "test.tsv") == {"2": {"d1": 1, "d2": 2}}
    queries, qrels = split_queries(tmp_path, "test")
    assert queries == {"2": "q two"} and qrels == {"2": {"d1": 1, "d2": 2}}
    with pytest.raises(CorpusError, match="no qrels for split 'train'; available: test"):
        split_queries(tmp_path, "train")


def test_qrels_with_wrong_columns_name_the_line(tmp_path):
    path = tmp_path / "q.tsv"
    path.write_text("query-id\tcorpus-id\tscore\n1\td1\n")
    with pytest.raises(CorpusError, match="q.tsv:2: expected 3 tab-separated columns"):
        read_qrels(path)
