"""Splitting a long document into passages the embedder can read whole.

A model reads at most `max_seq_length` word pieces (256 for all-MiniLM-L6-v2) and silently drops the rest, so a
document longer than that gets a vector of its head only. Chunking cuts the text into passages of at most `size`
word pieces of the embedder's own tokenizer, ending at a sentence boundary where one lies in the window's second
half, the next passage repeating the last `overlap` word pieces (from a sentence start where one lies there).
`paragraphs` cuts at blank lines first (a corpus that already splits its documents, e.g. a list of paragraphs joined
by blank lines) and packs consecutive paragraphs into one passage while they fit.

Each passage is a span of character offsets into the document's text: `text[start:end]` is exactly what the passage
holds, so results can point into the stored text.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hybrid_retrieval.common.errors import ConfigError
from hybrid_retrieval.common.progress import progress_bar
from hybrid_retrieval.models.onnx_export import CONFIG_FILE, TOKENIZER_FILE

CHUNKING_METHODS = ("none", "tokens", "paragraphs")
SPECIAL_TOKENS = 2  # [CLS] and [SEP]: what a passage may not use of the model's window
PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")
PARAGRAPH_SEPARATOR = "\n\n"  # joins a text given as a list of paragraphs (what `paragraphs` cuts at)
SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*$")


def joined_paragraphs(value: object) -> object:
    """A text given as a list of strings (a corpus that splits its documents already) as one string, its paragraphs
    separated by a blank line; any other value as it is (its reader checks it)."""
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        return PARAGRAPH_SEPARATOR.join(value)
    return value


@dataclass(frozen=True)
class ChunkingParams:
    method: str = "none"  # none: one vector per document, of its first max_seq_length word pieces
    size: int = 128  # word pieces per passage, at most the model's window less its special tokens
    overlap: int = 16  # word pieces a passage repeats of the previous one (tokens only)

    def __post_init__(self) -> None:
        if self.method not in CHUNKING_METHODS:
            raise ConfigError(f"unknown chunking method {self.method!r}; valid: {', '.join(CHUNKING_METHODS)}")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 8:
            raise ConfigError(f"chunking size must be an integer of at least 8 word pieces, got {self.size!r}")
        if isinstance(self.overlap, bool) or not isinstance(self.overlap, int) or not 0 <= self.overlap <= self.size // 2:
            raise ConfigError(f"chunking overlap must be an integer from 0 to half a passage ({self.size // 2}), got {self.overlap!r}")

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    def to_dict(self) -> dict:
        return {"method": self.method, "size": self.size, "overlap": self.overlap}


@dataclass(frozen=True)
class Span:
    """A passage: `text[start:end]` of its document's text."""

    start: int
    end: int


class Chunker:
    """Cuts texts into passages with the word pieces of the embedder in `model_folder` (an index's model/ or an ONNX
    export): the same tokenizer that will embed them, so a passage of `size` pieces is never truncated."""

    def __init__(self, model_folder: Path | str, params: ChunkingParams):
        from tokenizers import Tokenizer

        folder = Path(model_folder)
        window = int(json.loads((folder / CONFIG_FILE).read_text())["max_seq_length"]) - SPECIAL_TOKENS
        if params.size > window:
            raise ConfigError(f"chunking size {params.size} exceeds what the model reads ({window} word pieces after its special tokens)")
        self.params = params
        self._tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def spans(self, text: str) -> list[Span]:
        """The passages of `text`, in order; one span of the whole text when it fits or chunking is off, and for an
        empty text (every document has at least one passage)."""
        if not self.params.enabled:
            return [Span(0, len(text))]
        if self.params.method == "paragraphs":
            spans = self._paragraph_spans(text)
        else:
            spans = self._token_spans(text, self._offsets(text, 0, len(text)))
        return spans or [Span(0, len(text))]

    def _offsets(self, text: str, start: int, end: int) -> list[tuple[int, int]]:
        """Character offsets of the word pieces of `text[start:end]`, in `text`."""
        encoding = self._tokenizer.encode(text[start:end], add_special_tokens=False)
        return [(start + a, start + b) for a, b in encoding.offsets]

    def _token_spans(self, text: str, offsets: list[tuple[int, int]]) -> list[Span]:
        """Passages of the word pieces at `offsets` (their character offsets in `text`)."""
        size, overlap, n = self.params.size, self.params.overlap, len(offsets)
        if n <= size:
            return [Span(offsets[0][0], offsets[-1][1])] if offsets else []
        starts = sentence_starts(text, offsets)
        spans, first = [], 0
        while True:
            last = min(first + size, n)  # one past the passage's last piece
            if last < n:
                # end before the latest sentence start in the window's second half, if there is one
                inside = [s for s in starts if first + size // 2 < s <= last]
                last = inside[-1] if inside else last
            spans.append(Span(offsets[first][0], offsets[last - 1][1]))
            if last == n:
                return spans
            repeat_from = last - overlap
            # repeat from a sentence start within the overlap when there is one (never fewer than 0 pieces, and on)
            sentence = [s for s in starts if repeat_from <= s < last]
            first = max(sentence[0] if sentence else repeat_from, first + 1)

    def _paragraph_spans(self, text: str) -> list[Span]:
        """Paragraphs (split at blank lines), consecutive ones packed while they fit in `size` pieces; a paragraph
        longer than that is cut by tokens, without overlap across paragraphs."""
        bounds, at = [], 0
        for match in PARAGRAPH_BREAK.finditer(text):
            bounds.append((at, match.start()))
            at = match.end()
        bounds.append((at, len(text)))
        spans: list[Span] = []
        packed: Span | None = None
        packed_pieces = 0
        for start, end in bounds:
            offsets = self._offsets(text, start, end)
            if not offsets:
                continue
            if packed is not None and packed_pieces + len(offsets) <= self.params.size:
                packed, packed_pieces = Span(packed.start, offsets[-1][1]), packed_pieces + len(offsets)
                continue
            if packed is not None:
                spans.append(packed)
                packed = None
            if len(offsets) <= self.params.size:
                packed, packed_pieces = Span(offsets[0][0], offsets[-1][1]), len(offsets)
            else:
                spans.extend(self._token_spans(text, offsets))
        if packed is not None:
            spans.append(packed)
        return spans


def sentence_starts(text: str, offsets: list[tuple[int, int]]) -> list[int]:
    """Indexes of the word pieces that begin a sentence: after a line break, or after whitespace that follows a
    sentence's end mark (with any closing quotes or brackets)."""
    starts = []
    for i in range(1, len(offsets)):
        gap = text[offsets[i - 1][1] : offsets[i][0]]
        if not gap:
            continue
        end = offsets[i - 1][1]
        if "\n" in gap or (gap.isspace() and SENTENCE_END.search(text[max(0, end - 4) : end])):
            starts.append(i)
    return starts


PASSAGES_DIR = "passages"  # in a chunked index: spans.npy, rows.npy, embeddings.npy, dense.faiss
PASSAGE_SPANS = "spans.npy"  # int64 (p, 2): each passage's [start, end) in its document's text
PASSAGE_ROWS = "rows.npy"  # int64 (p,): each passage's document, ascending
PASSAGE_EMBEDDINGS = "embeddings.npy"  # float32 (p, dimension) unit vectors
PASSAGE_FAISS = "dense.faiss"
EMBED_PASSAGES = 1024  # passages embedded per step into the memory-mapped file


def write_passages(folder: Path, documents, chunker: Chunker, embed, dimension: int, progress: bool = False) -> np.ndarray:
    """Cut `documents` (stored dicts with title and text, in index order) into passages and write their spans, rows and
    vectors (`embed(texts)`: unit vectors) into folder/passages/; returns each document's first passage vector, the
    vector the document index keeps for it (what an unchunked index would embed: the document's head)."""
    from hybrid_retrieval.indexer.corpus import indexed_text

    spans, rows, titles, texts = [], [], [], []
    for row, doc in enumerate(documents):
        for span in chunker.spans(doc["text"]):
            spans.append((span.start, span.end))
            rows.append(row)
        titles.append(doc["title"])
        texts.append(doc["text"])
    rows_array = np.asarray(rows, dtype=np.int64)
    where = _passage_layout(folder, np.asarray(spans, dtype=np.int64), rows_array)
    vectors = np.lib.format.open_memmap(where / PASSAGE_EMBEDDINGS, mode="w+", dtype=np.float32, shape=(len(spans), dimension))
    with progress_bar(len(spans), "passages", "passages", progress) as bar:
        for first in range(0, len(spans), EMBED_PASSAGES):
            batch = range(first, min(first + EMBED_PASSAGES, len(spans)))
            passage_texts = [indexed_text(titles[rows[i]], texts[rows[i]][spans[i][0] : spans[i][1]]) for i in batch]
            vectors[batch.start : batch.stop] = embed(passage_texts)
            bar.update(len(batch))
    vectors.flush()
    firsts = np.searchsorted(rows_array, np.arange(len(texts)))
    return np.array(vectors[firsts]) if len(texts) else np.empty((0, dimension), dtype=np.float32)


def save_passages(folder: Path, spans: np.ndarray, rows: np.ndarray, vectors: np.ndarray) -> None:
    """Passages made already (a compaction's: the documents' passages as they are) into folder/passages/."""
    where = _passage_layout(folder, spans, rows)
    np.save(where / PASSAGE_EMBEDDINGS, np.asarray(vectors, dtype=np.float32))


def _passage_layout(folder: Path, spans: np.ndarray, rows: np.ndarray) -> Path:
    """folder/passages/ with the passages' spans and rows; the folder."""
    where = folder / PASSAGES_DIR
    where.mkdir()
    np.save(where / PASSAGE_SPANS, np.asarray(spans, dtype=np.int64).reshape(-1, 2))
    np.save(where / PASSAGE_ROWS, np.asarray(rows, dtype=np.int64))
    return where


def float32_text(values: np.ndarray) -> str:
    """Vectors as a log record holds them: little-endian float32, base64."""
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()


def encode_passages(spans: list[Span], vectors: np.ndarray) -> dict:
    """A written document's passages as its log record holds them: spans and vectors (float32_text)."""
    return {"spans": [[span.start, span.end] for span in spans], "vectors": float32_text(vectors)}


def decode_passages(record: object, text: str, dimension: int) -> tuple[np.ndarray, np.ndarray]:
    """(spans (m, 2), vectors (m, dimension)) of a logged document's passages; ValueError saying what is wrong (a log is
    a file: it may have been edited)."""
    if not isinstance(record, dict) or not isinstance(record.get("spans"), list) or not isinstance(record.get("vectors"), str):
        raise ValueError("passages must be an object with spans and vectors")
    spans = np.asarray(record["spans"], dtype=np.int64).reshape(-1, 2)
    raw = base64.b64decode(record["vectors"], validate=True)
    if not len(spans) or len(raw) != 4 * dimension * len(spans):
        raise ValueError(f"passages need at least one span and {dimension} float32 values for each")
    if np.any(spans[:, 0] > spans[:, 1]) or np.any(spans < 0) or np.any(spans[:, 1] > len(text)) or np.any(np.diff(spans[:, 0]) < 0):
        raise ValueError("passage spans must lie in the text, in order")
    return spans, np.frombuffer(raw, dtype="<f4").reshape(len(spans), dimension).astype(np.float32)
