"""Term-frequency postings: BM25 scored at query time from the statistics of the documents that exist now.

bm25s (search.bm25) precomputes every term-document score with the build's statistics, which is fastest for
a collection that never changes. Once documents are added or deleted, BM25 must use the live collection's
document count, average length and document frequencies (a deleted document must not linger in them, as it
does in Lucene until a merge), so the index also keeps raw term frequencies:

    postings/indptr.npy   int64 (V + 1,)  term t's entries are [indptr[t], indptr[t + 1])
    postings/docs.npy     int32           document of each entry, ascending within a term
    postings/tfs.npy      uint8 (uint16, int32 where a frequency needs it)  term frequency of each entry
    postings/lengths.npy  int32 (n,)      analysed length of each document
    postings/title_tfs.npy      like tfs  how many of each entry's occurrences are in the document's title
    postings/title_lengths.npy  int32 (n,)  analysed length of each title

The title's frequencies (absent from indexes built before fields) are what scores title and text as separate fields
(search.fields): the text's are the entry's less the title's, as the analysed document is its title's terms then
its text's.

Term ids are the bm25s vocabulary's. The Lucene variant (bm25s "lucene", the default):
    score(q, d) = sum over query terms t of  idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl)),
    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5)).
"""

from __future__ import annotations

import itertools
import json
from array import array
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

POSTINGS_DIR = "postings"
_PARTS = ("indptr", "docs", "tfs", "lengths")
_FIELD_PARTS = ("title_tfs", "title_lengths")


def narrowest(tfs: np.ndarray) -> np.ndarray:
    """Term frequencies in the smallest dtype that holds them: nearly every frequency is below 256, and a byte an
    entry instead of four is a quarter of what a large collection's frequencies keep on disk and in memory."""
    return tfs.astype(narrowest_type(tfs))


def narrowest_type(*parts: np.ndarray) -> type:
    """The smallest dtype that holds the frequencies of all `parts`."""
    largest = max(int(part.max(initial=0)) for part in parts)
    return np.uint8 if largest <= np.iinfo(np.uint8).max else np.uint16 if largest <= np.iinfo(np.uint16).max else np.int32


class Postings:
    """Term frequencies of a set of documents, term-major (CSC), and their lengths."""

    def __init__(
        self,
        indptr: np.ndarray,
        docs: np.ndarray,
        tfs: np.ndarray,
        lengths: np.ndarray,
        title_tfs: np.ndarray | None = None,
        title_lengths: np.ndarray | None = None,
    ):
        self.indptr, self.docs, self.tfs, self.lengths = indptr, docs, tfs, lengths
        self.title_tfs, self.title_lengths = title_tfs, title_lengths  # None: an index built before fields

    @property
    def num_docs(self) -> int:
        return len(self.lengths)

    @property
    def has_fields(self) -> bool:
        return self.title_tfs is not None and self.title_lengths is not None

    @classmethod
    def from_tokens(cls, corpus_tokens: Iterable[list[str]], titles: Iterable[list[str]] | None = None) -> tuple[Postings, dict[str, int]]:
        """Postings of analysed documents (with their titles' tokens, for fields), and their vocabulary (term -> id,
        ids in sorted term order)."""
        builder = PostingsBuilder()
        for tokens, title in zip(corpus_tokens, titles if titles is not None else itertools.repeat(None)):
            builder.add(tokens, title)
        return builder.finish()

    def document_frequency(self, alive: np.ndarray | None = None) -> np.ndarray:
        """Per term, how many (alive) documents contain it: every list's length, less the entries of the documents
        not alive (found without materialising each entry's term: a live collection computes this at every refresh)."""
        every = np.diff(self.indptr)
        if alive is None or alive.all():
            return every
        gone = np.flatnonzero(~alive[self.docs])
        return every - np.bincount(np.searchsorted(self.indptr, gone, side="right") - 1, minlength=len(every))

    def entry_terms(self) -> np.ndarray:
        """The term of each entry (entries are term-major)."""
        return np.repeat(np.arange(len(self.indptr) - 1, dtype=np.int32), np.diff(self.indptr))

    def term(self, term_id: int) -> tuple[np.ndarray, np.ndarray]:
        start, stop = self.indptr[term_id], self.indptr[term_id + 1]
        return self.docs[start:stop], self.tfs[start:stop]

    def title_term(self, term_id: int) -> np.ndarray:
        """The title's share of `term`'s frequencies (aligned with `term(term_id)`)."""
        assert self.title_tfs is not None  # has_fields
        return self.title_tfs[self.indptr[term_id] : self.indptr[term_id + 1]]

    def save(self, folder: Path) -> None:
        where = folder / POSTINGS_DIR
        where.mkdir()
        for name in _PARTS + (_FIELD_PARTS if self.has_fields else ()):
            np.save(where / f"{name}.npy", getattr(self, name))

    @classmethod
    def load(cls, folder: Path, mmap: bool = True) -> Postings:
        where = folder / POSTINGS_DIR

        def part(name: str) -> np.ndarray:  # plain arrays over the mapping (np.memmap's per-slice overhead is a query's cost)
            return np.asarray(np.load(where / f"{name}.npy", mmap_mode="r" if mmap else None))

        fields = [part(name) for name in _FIELD_PARTS] if (where / f"{_FIELD_PARTS[0]}.npy").is_file() else [None, None]
        return cls(*(part(name) for name in _PARTS), *fields)


class PostingsBuilder:
    """Analysed documents collected one at a time into compact arrays (12 bytes a distinct term of a document, instead
    of a Python string a token): what lets a build of a million documents hold its terms in memory."""

    def __init__(self) -> None:
        self._vocabulary: dict[str, int] = {}  # term -> id in order of first appearance
        self._terms, self._tfs = array("i"), array("i")  # each document's distinct terms and their frequencies
        self._title_tfs = array("i")  # the title's share of each
        self._lengths, self._distinct = array("q"), array("q")  # each document's tokens and distinct terms
        self._title_lengths = array("q")
        self._fields = True  # every document came with its title's tokens

    def __len__(self) -> int:
        return len(self._lengths)

    def add(self, tokens: list[str], title_tokens: list[str] | None = None) -> None:
        """A document's analysed tokens, and its title's (the first of them; None: not known, and the postings have no
        fields)."""
        counts, in_title = Counter(tokens), Counter(title_tokens or ())
        self._fields = self._fields and title_tokens is not None
        vocabulary = self._vocabulary
        self._terms.extend([vocabulary.setdefault(term, len(vocabulary)) for term in counts])
        self._tfs.extend(counts.values())
        self._title_tfs.extend([in_title[term] for term in counts])
        self._lengths.append(len(tokens))
        self._title_lengths.append(len(title_tokens or ()))
        self._distinct.append(len(counts))

    def finish(self) -> tuple[Postings, dict[str, int]]:
        """The postings, term-major with documents ascending within a term, over the vocabulary in sorted term order
        (term ids that do not depend on the order documents came in), then "" unless a document had it (bm25s's
        vocabulary always holds "": search.bm25)."""
        terms = sorted(self._vocabulary)
        new_id = np.empty(len(terms), dtype=np.int32)
        new_id[[self._vocabulary[t] for t in terms]] = np.arange(len(terms), dtype=np.int32)
        if "" not in self._vocabulary:
            terms.append("")
        entry_terms = new_id[np.frombuffer(self._terms, dtype=np.int32)] if len(self._terms) else np.empty(0, np.int32)
        lengths = np.frombuffer(self._lengths, dtype=np.int64)
        entry_docs = np.repeat(np.arange(len(lengths), dtype=np.int32), np.frombuffer(self._distinct, dtype=np.int64))
        order = np.argsort(entry_terms, kind="stable")  # by term; documents stay ascending within one
        indptr = np.concatenate([[0], np.cumsum(np.bincount(entry_terms, minlength=len(terms)))]).astype(np.int64)
        tfs, title_tfs = (narrowest(np.frombuffer(f, dtype=np.int32))[order] for f in (self._tfs, self._title_tfs))
        title_lengths = np.frombuffer(self._title_lengths, dtype=np.int64).astype(np.int32)
        postings = Postings(indptr, entry_docs[order], tfs, lengths.astype(np.int32))
        if self._fields:
            postings.title_tfs, postings.title_lengths = title_tfs, title_lengths
        return postings, {t: i for i, t in enumerate(terms)}


def with_titles(postings: Postings, vocabulary: dict[str, int], titles: Iterable[list[str]]) -> Postings:
    """`postings` (of an index built before fields) with the title frequencies of its documents' analysed `titles`: the
    title's terms are among the document's, so each title entry finds its document's entry."""
    title_postings, title_vocabulary = Postings.from_tokens(titles)
    main_id = np.array([vocabulary[t] for t in sorted(title_vocabulary, key=title_vocabulary.__getitem__)], dtype=np.int64)
    n = max(postings.num_docs, 1)
    keys = postings.entry_terms().astype(np.int64) * n + postings.docs  # term-major, documents ascending: sorted
    title_keys = main_id[title_postings.entry_terms()] * n + title_postings.docs
    title_tfs = np.zeros(len(keys), dtype=title_postings.tfs.dtype)
    title_tfs[np.searchsorted(keys, title_keys)] = title_postings.tfs
    return Postings(postings.indptr, postings.docs, postings.tfs, postings.lengths, title_tfs, title_postings.lengths)


@dataclass(frozen=True)
class AddedTerms:
    """Documents' analysed terms end to end: each distinct term of each document (its id in `terms`, its frequency,
    the title's share of it), and each document's count of distinct terms, length and title length."""

    ids: np.ndarray
    tfs: np.ndarray
    title_tfs: np.ndarray
    counts: np.ndarray
    lengths: np.ndarray
    title_lengths: np.ndarray
    terms: list[str]

    @classmethod
    def of(cls, documents: list[tuple[np.ndarray, np.ndarray, int, np.ndarray, int]], terms: list[str]) -> AddedTerms:
        """From (term ids, frequencies, length, the title's frequencies, the title's length) a document."""

        def joined(at: int) -> np.ndarray:
            return np.concatenate([doc[at] for doc in documents]).astype(np.int64) if documents else np.empty(0, np.int64)

        counts = np.array([len(doc[0]) for doc in documents], dtype=np.int64)
        lengths, title_lengths = (np.array([doc[at] for doc in documents], dtype=np.int64) for at in (2, 4))
        return cls(joined(0), joined(1), joined(3), counts, lengths, title_lengths, terms)

    def save(self, folder: Path) -> None:
        folder.mkdir()
        for name in _ADDED_PARTS:
            np.save(folder / f"{name}.npy", getattr(self, name))
        (folder / "terms.json").write_text(json.dumps(self.terms, ensure_ascii=False))

    @classmethod
    def load(cls, folder: Path) -> AddedTerms:
        ids, tfs, title_tfs, counts, lengths, title_lengths = (np.load(folder / f"{name}.npy", mmap_mode="r") for name in _ADDED_PARTS)
        return cls(ids, tfs, title_tfs, counts, lengths, title_lengths, json.loads((folder / "terms.json").read_text()))


_ADDED_PARTS = ("ids", "tfs", "title_tfs", "counts", "lengths", "title_lengths")


@dataclass(frozen=True)
class TermMerge:
    """A compaction's postings, to be made: the `keep` documents of `base` (its terms by `base_vocabulary`) followed by
    the `added` ones (`merged`). Saved as files (the base's by the folder it was read from, when given: not copied), so
    that a build in a child process merges them there, not in the service (indexer.build_process)."""

    base: Postings
    base_vocabulary: dict[str, int]
    keep: np.ndarray
    added: AddedTerms
    base_folder: Path | None = None  # where `base` was loaded from (Postings.load)

    def merged(self) -> tuple[Postings, dict[str, int]]:
        return merged_postings(self.base, self.base_vocabulary, self.keep, self.added)

    def save(self, folder: Path) -> None:
        folder.mkdir()
        base_folder = self.base_folder
        if base_folder is None:
            base_folder = folder
            self.base.save(folder)
        np.save(folder / "keep.npy", self.keep)
        self.added.save(folder / "added")
        meta = {"base_folder": str(base_folder), "base_vocabulary": self.base_vocabulary}
        (folder / "merge.json").write_text(json.dumps(meta, ensure_ascii=False))

    @classmethod
    def load(cls, folder: Path) -> TermMerge:
        meta = json.loads((folder / "merge.json").read_text())
        base_folder = Path(meta["base_folder"])
        keep = np.load(folder / "keep.npy")
        return cls(Postings.load(base_folder), meta["base_vocabulary"], keep, AddedTerms.load(folder / "added"), base_folder)


def merged_postings(
    base: Postings, base_vocabulary: dict[str, int], keep: np.ndarray, added: AddedTerms
) -> tuple[Postings, dict[str, int]]:
    """The postings of the `keep` documents of `base` followed by the `added` ones, over the terms they hold: what
    PostingsBuilder makes of the same documents analysed again (a compaction merges, it does not analyse a collection
    twice). Without the base's title frequencies (built before fields), the merge has none either."""
    renumber = np.cumsum(keep) - 1  # a kept base document's number in the merge
    held = keep[base.docs]
    base_terms, base_docs, base_tfs = base.entry_terms()[held], renumber[base.docs[held]], base.tfs[held]
    added_ids = np.asarray(added.ids, dtype=np.int64)
    added_docs = np.repeat(np.arange(len(added.counts), dtype=np.int64) + int(keep.sum()), added.counts)
    by_base_id = sorted(base_vocabulary, key=base_vocabulary.__getitem__)
    base_counts = np.bincount(base_terms, minlength=len(by_base_id))  # each base term's kept entries
    present = {by_base_id[t] for t in np.flatnonzero(base_counts).tolist()} | {added.terms[t] for t in np.unique(added_ids).tolist()}
    terms = sorted(present)
    if "" not in present:
        terms.append("")
    vocabulary = {t: i for i, t in enumerate(terms)}
    base_map = np.array([vocabulary.get(t, -1) for t in by_base_id], dtype=np.int64)
    added_map = np.array([vocabulary.get(t, -1) for t in added.terms], dtype=np.int64)
    indptr, to_base, to_added, added_order = _placed(base_terms, base_counts, base_map, added_map[added_ids], len(terms))

    def merged(base_values: np.ndarray, added_values: np.ndarray, dtype: type) -> np.ndarray:
        out: np.ndarray = np.empty(int(indptr[-1]), dtype=dtype)
        out[to_base], out[to_added] = base_values, added_values[added_order]
        return out

    docs = merged(base_docs, added_docs, np.int32)
    tfs = merged(base_tfs, added.tfs, narrowest_type(base_tfs, added.tfs))
    lengths = np.concatenate([base.lengths[keep], added.lengths]).astype(np.int32)
    if not base.has_fields:
        return Postings(indptr, docs, tfs, lengths), vocabulary
    assert base.title_tfs is not None and base.title_lengths is not None  # has_fields
    base_title_tfs = base.title_tfs[held]
    title_tfs = merged(base_title_tfs, added.title_tfs, narrowest_type(base_title_tfs, added.title_tfs))
    title_lengths = np.concatenate([base.title_lengths[keep], added.title_lengths]).astype(np.int32)
    return Postings(indptr, docs, tfs, lengths, title_tfs, title_lengths), vocabulary


def _placed(
    base_terms: np.ndarray, base_counts: np.ndarray, base_map: np.ndarray, added_terms: np.ndarray, terms: int
) -> tuple[np.ndarray, ...]:
    """Where a merge puts each entry, without sorting them all: (indptr, each base entry's place, each added entry's
    place in `added_order`, added_order). Within a term, the base's entries (documents ascending, as the base holds
    them: `base_terms` are their term ids, non-decreasing, `base_counts` of each) come first, then the added ones in
    order; `base_map` (base term id -> merged id) and `added_terms` are ids of the merged vocabulary (`terms` ids)."""
    base_new = base_map[base_terms]
    merged_base_counts = np.zeros(terms, dtype=np.int64)
    merged_base_counts[base_map[base_counts > 0]] = base_counts[base_counts > 0]
    added_counts = np.bincount(added_terms, minlength=terms)
    indptr = np.concatenate([[0], np.cumsum(merged_base_counts + added_counts)]).astype(np.int64)
    run_start = (np.cumsum(base_counts) - base_counts)[base_terms]  # where each entry's base term starts
    to_base = indptr[base_new] + (np.arange(len(base_terms)) - run_start)
    added_order = np.argsort(added_terms, kind="stable")  # the added entries only: a write's share of the collection
    ordered = added_terms[added_order]
    first_added = np.cumsum(added_counts) - added_counts
    to_added = indptr[ordered] + merged_base_counts[ordered] + (np.arange(len(ordered)) - first_added[ordered])
    return indptr, to_base, to_added, added_order
