import itertools
import json
import math
import re

import numpy as np
import pytest
from tokenizers import Tokenizer

from hybrid_retrieval.common.errors import ConfigError, SpecError
from hybrid_retrieval.indexer.chunking import Chunker, ChunkingParams, Span
from hybrid_retrieval.indexer.corpus import CorpusError, read_corpus
from hybrid_retrieval.indexer.live.validate import check_batch
from hybrid_retrieval.search.dense import DenseIndex, FaissParams, build_faiss_index
from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.passages import PassageIndex, aggregate
from hybrid_retrieval.search.ranking import top_k
from hybrid_retrieval.search.spec import PassageSpec, SearchSpec, parse_spec_string


@pytest.fixture(scope="module")
def model(tiny_index):
    return tiny_index / "model"


@pytest.fixture(scope="module")
def pieces(model):
    """Character offsets of every word piece of a text, as the chunker's tokenizer cuts it."""
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.no_truncation()
    return lambda text: tokenizer.encode(text, add_special_tokens=False).offsets


@pytest.fixture(scope="module")
def long_texts(scifact):
    with (scifact / "corpus.jsonl").open() as fh:
        docs = [json.loads(line) for line in itertools.islice(fh, 40)]
    return ["\n\n".join(f"{d['title']}. {d['text']}" for d in docs[i : i + 5]) for i in range(0, 40, 5)]


def check_cover(text: str, spans: list[Span], offsets, size: int, overlap: int) -> None:
    """Spans in order, each at most `size` pieces, cutting only between pieces, together holding every piece, the next
    one starting within the last `overlap` pieces of the previous."""
    starts = {a for a, _ in offsets}
    ends = {b for _, b in offsets}
    covered = np.zeros(len(offsets), dtype=bool)
    for before, span in zip([None, *spans], spans):
        assert span.start in starts and span.end in ends
        inside = [i for i, (a, b) in enumerate(offsets) if span.start <= a and b <= span.end]
        assert 0 < len(inside) <= size
        covered[inside] = True
        if before is not None:
            assert before.start < span.start
            repeated = sum(1 for a, b in offsets if span.start <= a and b <= before.end)
            assert repeated <= overlap
    assert covered.all()


@pytest.mark.parametrize("size, overlap", [(64, 8), (128, 0), (128, 16), (254, 32)])
def test_token_chunks_cover_the_text_in_pieces_that_fit(model, pieces, long_texts, size, overlap):
    chunker = Chunker(model, ChunkingParams("tokens", size, overlap))
    for text in long_texts:
        spans = chunker.spans(text)
        assert len(spans) >= math.ceil(len(pieces(text)) / size)
        check_cover(text, spans, pieces(text), size, overlap)


def test_chunks_end_at_a_sentence_end_when_one_is_in_the_window(model, pieces):
    sentences = [f"Sentence number {i} says that cells of kind {i} grow in culture." for i in range(40)]
    text = " ".join(sentences)
    spans = Chunker(model, ChunkingParams("tokens", 64, 16)).spans(text)
    assert len(spans) > 3
    for span in spans:
        assert text[span.start : span.end].startswith("Sentence") and text[span.start : span.end].endswith("culture.")
    check_cover(text, spans, pieces(text), 64, 16)


def test_without_a_sentence_end_chunks_cut_between_pieces(model, pieces):
    text = " ".join(f"word{i}" for i in range(500))
    spans = Chunker(model, ChunkingParams("tokens", 32, 4)).spans(text)
    check_cover(text, spans, pieces(text), 32, 4)
    assert max(len([o for o in pieces(text) if s.start <= o[0] and o[1] <= s.end]) for s in spans) == 32


def test_paragraphs_are_packed_while_they_fit_and_long_ones_cut(model, pieces):
    short = ["Quokkas are marsupials.", "They live on Rottnest Island.", "Tourists photograph them."]
    long = " ".join(f"The island has beach number {i}." for i in range(60))
    text = "\n\n".join([*short, long, "The end."])
    spans = Chunker(model, ChunkingParams("paragraphs", 64, 8)).spans(text)
    assert text[spans[0].start : spans[0].end] == "\n\n".join(short)  # packed
    cut = [text[s.start : s.end] for s in spans[1:-1]]
    assert len(cut) > 1 and all(part in long for part in cut)  # the long paragraph alone, cut by tokens
    assert text[spans[-1].start : spans[-1].end] == "The end."  # a cut paragraph takes no neighbour
    for span in spans:
        assert not re.search(r"\n\s*\n", text[span.start : span.end]) or span == spans[0]
    check_cover(text, spans, pieces(text), 64, 8)


def test_every_document_has_a_passage(model):
    chunker = Chunker(model, ChunkingParams("tokens", 64, 8))
    assert chunker.spans("") == [Span(0, 0)]
    assert chunker.spans("   ") == [Span(0, 3)]
    assert chunker.spans("A short note.") == [Span(0, 13)]
    assert Chunker(model, ChunkingParams()).spans("anything at all") == [Span(0, 15)]


def test_bad_parameters_name_what_is_valid(model):
    with pytest.raises(ConfigError, match="valid: none, tokens, paragraphs"):
        ChunkingParams("sentences")
    with pytest.raises(ConfigError, match="overlap"):
        ChunkingParams("tokens", 64, 40)
    with pytest.raises(ConfigError, match="exceeds what the model reads"):
        Chunker(model, ChunkingParams("tokens", 1000, 8))
    with pytest.raises(SpecError, match="valid: max, soft") as refused:
        SearchSpec().merge({"passage_scoring": {"aggregation": "mean"}})
    assert refused.value.field == "passage_scoring.aggregation"
    with pytest.raises(SpecError, match="passage_scoring.temperature"):
        SearchSpec().merge({"passage_scoring": {"temperature": 0}})


@pytest.mark.parametrize("scoring", [PassageSpec("max"), PassageSpec("soft", 0.05, 3), PassageSpec("soft", 0.5, 1)])
def test_aggregation_equals_its_formula(scoring):
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 50, 400)
    scores = rng.normal(size=400).astype(np.float32)
    docs, aggregated = aggregate(scores, rows, scoring)
    assert docs.tolist() == sorted(set(rows.tolist()))
    for doc, value in zip(docs, aggregated):
        mine = sorted(scores[rows == doc].astype(np.float64), reverse=True)
        if scoring.aggregation == "max":
            expected = mine[0]
        else:
            top = mine[: scoring.top]
            expected = scoring.temperature * math.log(sum(math.exp(s / scoring.temperature) for s in top))
        assert value == pytest.approx(expected, abs=1e-5)


def passage_index(num_docs: int, seed: int, kind: str = "flat") -> PassageIndex:
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.integers(0, num_docs, num_docs * 3))
    rows = np.sort(np.r_[rows, np.arange(num_docs)])  # every document has a passage
    vectors = rng.normal(size=(len(rows), 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    params = FaissParams(kind=kind, exact_below=0)
    dense = DenseIndex(build_faiss_index(vectors, params, "cpu"), params, "cpu", vectors)
    return PassageIndex(dense, vectors, rows, np.zeros((len(rows), 2), dtype=np.int64), num_docs)


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
@pytest.mark.parametrize("scoring", [PassageSpec("max"), PassageSpec("soft", 0.05, 3)])
def test_passage_search_equals_brute_force_aggregation(scoring, kind):
    """Exact on a flat index (every passage scored); on HNSW, the documents it finds carry their exact scores."""
    index = passage_index(300, 1, kind)
    rng = np.random.default_rng(2)
    for _ in range(20):
        query = rng.normal(size=16).astype(np.float32)
        query /= np.linalg.norm(query)
        mask = rng.random(300) < rng.choice([1.0, 0.3, 0.02])
        allowed = Allowed(mask) if not mask.all() else None
        docs, scores = aggregate(index.vectors @ query, index.rows, scoring)
        keep = mask[docs]
        expected = top_k(scores[keep], 10)
        ranking = index.search(query, 10, scoring, allowed)
        if kind == "flat":
            assert docs[keep][expected.doc_idx].tolist() == ranking.doc_idx.tolist()
            np.testing.assert_allclose(ranking.scores, expected.scores, atol=1e-6)
        else:
            assert len(ranking) == min(10, int(mask.sum()))
            np.testing.assert_allclose(ranking.scores, scores[np.searchsorted(docs, ranking.doc_idx)], atol=1e-6)
        assert set(ranking.doc_idx.tolist()) <= set(np.flatnonzero(mask).tolist())
        some = rng.choice(300, 40, replace=False)
        np.testing.assert_allclose(index.scores(some, query, scoring), [scores[docs == d][0] for d in some], atol=1e-6)


def test_passage_scoring_round_trips_through_the_string_form():
    spec = SearchSpec().merge({"mode": "dense", "passage_scoring": {"aggregation": "soft", "temperature": 0.1, "top": 4}})
    assert spec.to_string() == "dense+cc:zscore:0.5+depth:100+nohub+rerank:off:d=50:w=1+passages:soft:t=0.1:top=4:bm25=document"
    assert SearchSpec().merge(parse_spec_string(spec.to_string())) == spec
    assert "passages" not in SearchSpec().to_string()  # the default is not named


def test_a_text_given_as_paragraphs_is_joined_by_blank_lines(tmp_path, model):
    paragraphs = ["First paragraph.", "Second one, longer than the first.", "Third."]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "p", "text": paragraphs}) + "\n" + json.dumps({"_id": "q", "text": [1, 2]}) + "\n")
    with pytest.raises(CorpusError, match="a string or a list of strings"):
        list(read_corpus(corpus))
    (doc,) = itertools.islice(read_corpus(corpus), 1)
    assert doc.text == "First paragraph.\n\nSecond one, longer than the first.\n\nThird."
    (written,) = check_batch([{"id": "p", "text": paragraphs}], 10, {})
    assert written["text"] == doc.text
    with pytest.raises(SpecError, match="list of strings") as refused:
        check_batch([{"id": "q", "text": ["a", 2]}], 10, {})
    assert refused.value.field == "documents[0].text"
    spans = Chunker(model, ChunkingParams("paragraphs", 8, 0)).spans(doc.text)  # one paragraph a passage
    assert [doc.text[s.start : s.end] for s in spans] == paragraphs
