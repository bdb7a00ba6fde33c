"""A growing haystack: the real documents of a BEIR dataset plus generated distractors, so the dataset's test queries
keep their judgments while the collection grows to a million documents, and quality can be followed as it does.

Distractors copy the corpus's term statistics without copying its documents. Each one picks a real document at
random as its topic: its length (title and text, in words) is that document's, and each word is, with probability
TOPICAL, one of that document's words, else a word of the corpus's unigram distribution (Zipfian, as text is).
Topic words make terms repeat within a document and co-occur across documents as they do in real text (a
distractor about a real document's subject competes with it), and the unigram words give every term its corpus-wide
frequency. Words are the corpus's raw lowercased words, stopwords included, so the analyzer does its usual work.

Everything is a function of the seed: distractor i is the same in every run and in every size (made in blocks of
BLOCK, each from its own generator), so 100k is a prefix of 1M. Generated queries (for checks that need many, not
for quality: they have no judgments) take 4-12 words of a random real document.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from hybrid_retrieval.indexer.corpus import indexed_text

TOPICAL = 0.5
BLOCK = 10_000
EMBED_BATCH = 256
WORD = re.compile(r"\w+(?:[-']\w+)*")


@dataclass(frozen=True)
class Haystack:
    corpus: Path  # a BEIR corpus.jsonl
    seed: int = 0

    @cached_property
    def real(self) -> list[dict]:
        with self.corpus.open() as fh:
            return [json.loads(line) for line in fh]

    @cached_property
    def _words(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(vocabulary, cumulative unigram probabilities, every real document's word ids flat, their offsets,
        title lengths, text lengths)."""
        vocabulary: dict[str, int] = {}
        flat: list[int] = []
        offsets, titles, texts = [0], [], []
        for doc in self.real:
            title, text = WORD.findall(doc.get("title", "").lower()), WORD.findall(doc["text"].lower())
            flat.extend(vocabulary.setdefault(w, len(vocabulary)) for w in title + text)
            offsets.append(len(flat))
            titles.append(len(title))
            texts.append(len(text))
        ids = np.asarray(flat, dtype=np.int64)
        counts = np.bincount(ids, minlength=len(vocabulary))
        words = np.array(sorted(vocabulary, key=vocabulary.__getitem__), dtype=object)
        return words, np.cumsum(counts) / counts.sum(), ids, np.asarray(offsets), np.asarray(titles), np.asarray(texts)

    @property
    def vocabulary_size(self) -> int:
        return len(self._words[0])

    def documents(self, size: int) -> Iterator[dict]:
        """`size` documents: the real ones first (all of them, in corpus order), then distractors `x0000000`, ...."""
        if size < len(self.real):
            raise ValueError(f"a haystack holds the {len(self.real)} real documents at least, asked for {size}")
        yield from ({"_id": d["_id"], "title": d.get("title", ""), "text": d["text"]} for d in self.real)
        made = 0
        for block in range(-(-(size - len(self.real)) // BLOCK)):
            for doc in self._block(block):
                if made == size - len(self.real):
                    return
                made += 1
                yield doc

    def _block(self, block: int) -> Iterator[dict]:
        words, cumulative, flat, offsets, titles, texts = self._words
        rng = np.random.default_rng([self.seed, block])
        topics = rng.integers(0, len(titles), BLOCK)
        lengths = titles[topics] + texts[topics]
        total = int(lengths.sum())
        owner = np.repeat(topics, lengths)
        topical = flat[offsets[owner] + (rng.random(total) * (offsets[owner + 1] - offsets[owner])).astype(np.int64)]
        unigram = np.minimum(np.searchsorted(cumulative, rng.random(total), side="right"), len(words) - 1)
        chosen = words[np.where(rng.random(total) < TOPICAL, topical, unigram)]
        ends = np.cumsum(lengths)
        for i in range(BLOCK):
            start, title_end = ends[i] - lengths[i], ends[i] - lengths[i] + titles[topics[i]]
            yield {
                "_id": f"x{block * BLOCK + i:07d}",
                "title": " ".join(chosen[start:title_end]),
                "text": " ".join(chosen[title_end : ends[i]]),
            }

    def queries(self, count: int) -> list[str]:
        """`count` generated queries: 4-12 words of a random real document each."""
        _, _, flat, offsets, _, _ = self._words
        words = self._words[0]
        rng = np.random.default_rng([self.seed, 2**32 - 1])  # a stream no block uses
        out = []
        for topic in rng.integers(0, len(self.real), count):
            start, stop = offsets[topic], offsets[topic + 1]
            out.append(" ".join(words[flat[rng.integers(start, stop, int(rng.integers(4, 13)))]]))
        return out


def haystack_vectors(haystack: Haystack, size: int, real: np.ndarray, embed: Callable[[list[str]], np.ndarray], cache: Path) -> np.ndarray:
    """The unit vectors of `haystack.documents(size)`, memory-mapped from `cache` (an .npy made on the first call):
    the real documents' are `real` (in corpus order: an index of the dataset's), the distractors' are `embed`ded
    (indexed_text, as a build embeds them), one BLOCK at a time."""
    if not cache.is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_name(cache.name + ".partial")
        out = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float32, shape=(size, real.shape[1]))
        out[: len(real)] = real
        distractors = itertools.islice(haystack.documents(size), len(real), None)
        at = len(real)
        while at < size:
            texts = [indexed_text(doc["title"], doc["text"]) for doc in itertools.islice(distractors, BLOCK)]
            out[at : at + len(texts)] = embed(texts)
            at += len(texts)
        out.flush()
        del out
        os.replace(partial, cache)
    vectors = np.load(cache, mmap_mode="r")
    if vectors.shape[0] != size:
        raise ValueError(f"{cache} holds {vectors.shape[0]} vectors, not {size}: remove it to embed again")
    return vectors
