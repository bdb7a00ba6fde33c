"""BM25 top-k without scoring every posting: block-max pruning over document windows, exact.

A query's score is a sum over its terms' posting lists. The documents are cut into windows of 2^WINDOW_SHIFT (64)
consecutive numbers, and each list keeps, per window, an upper bound of its entries there (`WindowBounds`: a byte,
the window's largest entry rounded up to 1/255 of the list's largest) and where its entries of that window start.
A window's bounds summed over the query's lists cap every score inside it. The windows are visited by that cap,
highest first (bucketed, Block-Max Pruning: Mallia, Suel & Tonellotto, SIGIR 2024), so the heap fills with the best
documents early and its lowest score, theta, rises fast; a window whose cap is below theta is never opened, and
once the next bucket's cap is below theta the search stops. Inside a window, the lists split as in MaxScore
(Turtle & Flood, IP&M 1995; Lucene's MaxScoreBulkScorer, which also bounds windows): the lists whose global bounds
sum below theta are only looked up, for documents that the others (the essential ones) hold and whose score so far
plus the window's bounds of the lists left can still reach theta.

Exactness: a document that passes is scored by adding its contributions in query order, in the scorer's dtype, from
zero: the additions of the exhaustive scorer (`exhaustive_scores`), so scores are bit-identical to it. Windows come
out of document order, so the heap keeps, among equal scores, the lower document (search.ranking.top_k's order)
explicitly. Bounds are compared with a relative margin, so float rounding can keep a document needlessly, never drop
one that belongs. Entries must be non-negative (every BM25 variant but Robertson's idf). A query whose windows mostly
stay open (many frequent terms, theta low against their bounds) stops after GIVE_UP of them and is summed instead.

The exhaustive reference runs compiled too (every list added into one array, then one pass that keeps the top k),
and is the faster of the two on small collections (search.bm25.worth_pruning). The loops run compiled (numba;
`cache=True` keeps the machine code beside this module after the first call).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numba
import numpy as np

from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.ranking import Ranking, top_k

# 64 documents a window: on a million documents (1,300 queries, an ad hoc run) 128 left most windows open, and 32 was
# slower (0.40 against 0.37 ms at p50)
WINDOW_SHIFT = 6
BUCKETS = 256  # windows are visited bucket by bucket of their caps, highest first (a counting sort)
# a query that opened this share of the windows is summed instead: on a million documents its p99 was 9 times the
# sum's without it (the walk's cost per window opened against the sum's per posting), 1.6 times with it
GIVE_UP = 0.1
MARGIN = 1e-5  # relative: bounds summed in float64 against scores summed in the scorer's dtype
# a filter that admits fewer documents than this share: their scores gathered and ranked (numpy) beat one compiled
# pass over every score (1.0 vs 0.95 ms at 10% of 1M random scores, 0.27 vs 2.2 ms at 1%; an ad hoc run)
GATHER_BELOW = 0.1
_NO_FILTER = np.ones(0, dtype=np.bool_)
ScoreOf = Callable[[np.ndarray], np.ndarray]  # a query's scores of given (ascending) documents


@dataclass(frozen=True)
class WindowBounds:
    """A posting list's entries by window of 2^`shift` documents: `codes[w]` * `top` / 255 bounds its entries in
    window w from above (0: it has none there), and its first entry at or past the window's first document is at
    `bases[w >> 8] + firsts[w]` in the list (a window of 2^shift documents holds at most as many entries, so 256 of
    them fit the 16 bits of `firsts`: 3 bytes a window in all)."""

    codes: np.ndarray  # uint8, a window each
    firsts: np.ndarray  # uint16, a window each: past its block's base
    bases: np.ndarray  # int64, a block of 256 windows each
    top: float  # the list's largest entry
    shift: int
    pool: WindowPool | None = None  # the pool whose `row` these arrays are
    row: int = 0

    @classmethod
    def of(cls, docs: np.ndarray, values: np.ndarray, num_docs: int) -> WindowBounds:
        windows = (num_docs + (1 << WINDOW_SHIFT) - 1) >> WINDOW_SHIFT
        codes, firsts = np.zeros(windows, dtype=np.uint8), np.zeros(windows, dtype=np.uint16)
        bases = np.zeros((windows + 255) >> 8, dtype=np.int64)
        top = _window_bounds(docs, values, WINDOW_SHIFT, codes, firsts, bases)
        return cls(codes, firsts, bases, top, WINDOW_SHIFT)


class WindowPool:
    """Many lists' WindowBounds as rows of shared arrays, so that a search hands the kernel row numbers instead of
    copying its lists' bounds together (a tenth of a pruned search's time at a million documents). Rows are only
    added, never rewritten: a full pool is replaced by a new one (`full`), and a search that holds rows of the old one
    reads them unchanged. Its arrays are zeros until rows are written (untouched pages take no memory)."""

    def __init__(self, num_docs: int, capacity: int):
        windows = (num_docs + (1 << WINDOW_SHIFT) - 1) >> WINDOW_SHIFT
        self.codes = np.zeros((capacity, windows), dtype=np.uint8)
        self.firsts = np.zeros((capacity, windows), dtype=np.uint16)
        self.bases = np.zeros((capacity, (windows + 255) >> 8), dtype=np.int64)
        self.size = 0

    @property
    def full(self) -> bool:
        return self.size == len(self.codes)

    def add(self, docs: np.ndarray, values: np.ndarray) -> WindowBounds:
        """A list's bounds written to the next row (the caller serialises adds and checks `full` first)."""
        row = self.size
        top = _window_bounds(docs, values, WINDOW_SHIFT, self.codes[row], self.firsts[row], self.bases[row])
        self.size += 1
        return WindowBounds(self.codes[row], self.firsts[row], self.bases[row], top, WINDOW_SHIFT, self, row)


@dataclass(frozen=True)
class PostingList:
    """One query term's entries in one segment: ascending document numbers, each one's contribution (`values`, times
    `scale` when given: an idf applied lazily, as the exhaustive scorer applies it), and the largest contribution."""

    docs: np.ndarray
    values: np.ndarray
    bound: float
    scale: float | None = None
    # when docs and values are slices of larger arrays (an index's whole score matrix): those, and where they start;
    # lists of one such pair go to the kernel without being copied
    within: tuple[np.ndarray, np.ndarray] | None = None
    start: int = 0
    # lists of one group (adjacent in a query's lists) are a query term's typo variants (search.typo): a document
    # counts the best of its contributions among them, not their sum; None: the list counts on its own
    group: int | None = None
    windows: WindowBounds | None = None  # the list's bounds by window (made by top_k_pruned when not given)

    def contributions(self, positions: np.ndarray | None = None) -> np.ndarray:
        values = self.values if positions is None else self.values[positions]
        return values if self.scale is None else self.scale * values


def exhaustive_scores(lists: list[PostingList], num_docs: int, dtype: np.dtype) -> np.ndarray:
    """Every document's score: the reference the pruned path equals (each list's contributions added in query order,
    a group's best contribution once where the group is)."""
    out = np.zeros(num_docs, dtype=dtype)
    best = held = None  # a group's best contribution to each document, while the group is read
    for k, posting in enumerate(lists):
        values, scale = np.asarray(posting.values, dtype=dtype), dtype.type(1.0 if posting.scale is None else posting.scale)
        if posting.group is None:
            _add_list(posting.docs, values, scale, out)
            continue
        if best is None:
            best, held = np.zeros(num_docs, dtype=dtype), np.zeros(num_docs, dtype=np.bool_)
        _keep_best(posting.docs, values, scale, best, held)
        if k + 1 == len(lists) or lists[k + 1].group != posting.group:  # the group ends: its best counts once
            for member in lists[k::-1]:
                if member.group != posting.group:
                    break
                _add_best(member.docs, best, held, out)
    return out


def score_documents(lists: list[PostingList], ids: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The scores of the ascending documents `ids`, bit-identical to exhaustive_scores's (same order of additions)."""
    out = np.zeros(len(ids), dtype=dtype)
    best, held = np.zeros(len(ids), dtype=dtype), np.zeros(len(ids), dtype=bool)  # the current group's
    for k, posting in enumerate(lists):
        positions = np.searchsorted(posting.docs, ids.astype(posting.docs.dtype, copy=False))  # same dtype: no copy
        found = positions < len(posting.docs)
        found[found] = posting.docs[positions[found]] == ids[found]
        contributions = posting.contributions(positions[found]).astype(dtype, copy=False)
        if posting.group is None:
            out[found] += contributions
            continue
        better = ~held[found] | (contributions > best[found])
        best[np.flatnonzero(found)[better]] = contributions[better]
        held |= found
        if k + 1 == len(lists) or lists[k + 1].group != posting.group:  # the group ends: its best counts once
            out[held] += best[held]
            best[:], held[:] = 0, False
    return out


def top_k_pruned(lists: list[PostingList], depth: int, num_docs: int, dtype: np.dtype, allowed: Allowed | None = None) -> Ranking:
    """The top `depth` documents by the sum of `lists` (among `allowed`), exactly those of exhaustive_scores with
    search.ranking.top_k over the matching (non-zero) ones."""
    if not lists:
        return Ranking(np.empty(0, dtype=np.int64), np.empty(0, dtype=dtype))
    if depth <= 0 or any(p.group is not None for p in lists):  # a best-of-group has no bound to split: summed instead
        return top_matches(exhaustive_scores(lists, num_docs, dtype), depth, allowed)
    lengths = np.array([len(p.docs) for p in lists], dtype=np.int64)
    whole = lists[0].within
    if whole is not None and whole[1].dtype == dtype and all(p.within is whole for p in lists):
        docs, values = whole
        starts = np.array([p.start for p in lists], dtype=np.int64)
    else:  # the lists end to end (a live collection's: cached weights and the live segment's)
        docs = np.concatenate([p.docs.astype(np.int64, copy=False) for p in lists])
        values = np.concatenate([np.asarray(p.values, dtype=dtype) for p in lists])
        starts = np.cumsum(lengths) - lengths
    windows = [p.windows or WindowBounds.of(p.docs, np.asarray(p.values), num_docs) for p in lists]
    scales = np.array([1.0 if p.scale is None else p.scale for p in lists], dtype=dtype)
    bounds = np.array([p.bound for p in lists], dtype=np.float64)
    tops = np.array([w.top for w in windows], dtype=np.float64)
    pool = windows[0].pool
    if pool is not None and all(w.pool is pool for w in windows):  # rows of one pool: read where they are
        codes, firsts, bases, rows = pool.codes, pool.firsts, pool.bases, np.array([w.row for w in windows], dtype=np.int64)
    else:
        codes, firsts, bases = (np.stack([getattr(w, part) for w in windows]) for part in ("codes", "firsts", "bases"))
        rows = np.arange(len(windows), dtype=np.int64)
    found, scores, finished = _block_max(
        (docs, values, starts, starts + lengths),
        (scales, bounds, tops),
        (codes, firsts, bases, rows, windows[0].shift),
        depth,
        _NO_FILTER if allowed is None else allowed.mask,
        np.zeros(1, dtype=dtype),
        (MARGIN, int(GIVE_UP * codes.shape[1])),
    )
    if not finished:  # most windows stayed open: the compiled sum is faster
        return top_matches(exhaustive_scores(lists, num_docs, dtype), depth, allowed)
    ranked = np.lexsort((found, -scores))
    return Ranking(found[ranked], scores[ranked])


def top_matches(scores: np.ndarray, depth: int, allowed: Allowed | None = None) -> Ranking:
    """The top `depth` of the documents that match (a non-zero score) and are allowed, ties to the lower document
    (search.ranking.top_k's order)."""
    if allowed is not None and allowed.fraction < GATHER_BELOW:
        return top_k(scores, depth, candidates=allowed.ids[scores[allowed.ids] != 0])
    if depth <= 0:
        return Ranking(np.empty(0, dtype=np.int64), scores[:0])
    found, values = _top_nonzero(scores, depth, _NO_FILTER if allowed is None else allowed.mask)
    ranked = np.lexsort((found, -values))
    return Ranking(found[ranked], values[ranked])


def warm(pruning: bool = True) -> None:
    """Compile (or load from numba's cache) the kernels an index serves with, so that no search waits for them: the
    sums and top-k of scores (float32 from an index's score matrix, float64 from a live collection's lists), with
    typo variants' groups, and, when `pruning`, block-max pruning over either's lists (int32 documents and float32
    scores, int64 and float64 end to end) and their window bounds."""
    docs, values = np.array([0], np.int32), np.array([1.0], np.float32)
    for scores in (values, np.array([1.0])):
        top_matches(scores, 1)
    for doc_type, value_type in ((np.int32, np.float32), (np.int32, np.float64), (np.int64, np.float64)):  # live: both
        alone = PostingList(np.array([0], doc_type), np.array([1.0], value_type), 1.0)
        variant = replace(alone, group=0)  # a typo's variants (search.typo)
        exhaustive_scores([alone, variant, variant], 1, alone.values.dtype)
    if pruning:
        top_k_pruned([PostingList(docs, values, 1.0, within=(docs, values))], 1, 1, values.dtype)
        for doc_type in (np.int32, np.int64):  # a live collection's base and live lists
            top_k_pruned([PostingList(np.array([0], doc_type), np.array([1.0]), 1.0)], 1, 1, np.dtype(np.float64))


def exhaustive_leg(scores: np.ndarray, depth: int, allowed: Allowed | None) -> tuple[Ranking, ScoreOf]:
    """A BM25 leg from every document's scores: the top `depth` matches, and the score of any documents."""
    return top_matches(scores, depth, allowed), scores.__getitem__


@numba.njit(cache=True, nogil=True)
def _window_bounds(docs, values, shift, codes, firsts, bases):
    """Fill a list's WindowBounds arrays (zeros); return its largest entry."""
    top = 0.0
    for p in range(len(values)):
        top = max(top, values[p])
    best = np.zeros(len(codes))
    at = 0  # the first entry at or past window w's first document
    for w in range(len(codes)):
        while at < len(docs) and docs[at] < w << shift:
            at += 1
        if w & 255 == 0:
            bases[w >> 8] = at
        firsts[w] = at - bases[w >> 8]
    for p in range(len(docs)):
        best[docs[p] >> shift] = max(best[docs[p] >> shift], values[p])
    if top > 0:
        for w in range(len(codes)):
            if best[w] > 0:  # rounded up: a bound, never below the entry
                codes[w] = min(255, int(np.ceil(255.0 * best[w] / top)))
    return top


@numba.njit(cache=True, nogil=True)
def _block_max(source, weights, windows, depth, allowed, zero, stops):  # noqa: C901  # one compiled loop: its state cannot leave it cheaply
    """(documents, scores, whether it finished): the top `depth`, or finished False once `limit` windows were opened
    with more to go. `source`: every list's entries (documents, values) and each list's [start, end) there; `weights`:
    each list's (scale, bound, largest entry); `windows`: (codes, firsts, bases, each list's row there, the windows'
    shift); `stops`: (the bounds' relative margin, limit)."""
    docs, values, _, ends = source
    scales, bounds, tops = weights
    codes, _, _, rows, shift = windows
    margin, limit = stops
    n = len(rows)
    unit = scales * tops / 255.0 * (1.0 + 1e-6)  # a code's worth in each list, a little over
    order = np.argsort(bounds)  # ascending bound: order[:essential] are the lists only looked up
    prefix = np.zeros(n + 1)
    for k in range(n):
        prefix[k + 1] = prefix[k] + bounds[order[k]]
    caps = _window_caps(codes, rows, unit)
    heap_docs, heap_scores = np.empty(depth, dtype=np.int64), np.empty(depth, dtype=zero.dtype)
    if caps.max() <= 0:
        return heap_docs[:0], heap_scores[:0], True
    ranked, begins, per_bucket = _by_cap(caps)
    floor, essential, size, last, opened = -np.inf, 0, 0, 0, 0
    first, cursor = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    for b in range(BUCKETS):
        if (BUCKETS - b) / per_bucket < floor:  # every window left is capped below theta
            break
        if opened > limit or (4 * opened > limit and opened + _still_open(begins, b, per_bucket, floor) > limit):
            return heap_docs[:0], heap_scores[:0], False
        for r in range(begins[b], begins[b + 1]):
            w = ranked[r]
            if caps[w] < floor:
                continue
            opened += 1
            high = (w + 1) << shift
            _enter(windows, w, source, first, cursor)
            rest = 0.0  # the window's bounds of the lists only looked up
            for k in range(essential):
                rest += codes[rows[order[k]], w] * unit[order[k]]
            while True:
                doc = high  # the next document of the essential lists here
                for k in range(essential, n):
                    i = order[k]
                    if cursor[i] < ends[i] and docs[cursor[i]] < doc:
                        doc = docs[cursor[i]]
                if doc >= high:
                    break
                partial = 0.0
                for k in range(essential, n):
                    i = order[k]
                    if cursor[i] < ends[i] and docs[cursor[i]] == doc:
                        partial += scales[i] * values[cursor[i]]
                        cursor[i] += 1
                if (len(allowed) and not allowed[doc]) or partial + rest < floor:  # most documents stop here
                    continue
                if not _reaches(source, scales, (codes, rows, unit, w), (order, essential), cursor, doc, partial + rest, floor):
                    continue
                score = _score(source, scales, first, doc, zero)
                if score == 0 or not _offer(heap_docs, heap_scores, size, last, doc, score):
                    continue
                size = min(size + 1, depth)
                if size == depth:  # the entry that ranks last moves only when one comes in
                    last = _last(heap_docs, heap_scores, size)
                    if heap_scores[last] - margin * abs(heap_scores[last]) > floor:
                        floor = heap_scores[last] - margin * abs(heap_scores[last])
                        while essential < n and prefix[essential + 1] < floor:
                            rest += codes[rows[order[essential]], w] * unit[order[essential]]
                            essential += 1
    return heap_docs[:size], heap_scores[:size], True


@numba.njit(cache=True, nogil=True)
def _window_caps(codes, rows, unit):
    """Each window's bounds summed over the lists (`rows` of `codes`, a code worth `unit` in each)."""
    caps = np.zeros(codes.shape[1])
    for i in range(len(rows)):
        for w in range(codes.shape[1]):
            caps[w] += codes[rows[i], w] * unit[i]
    return caps


@numba.njit(cache=True, nogil=True)
def _by_cap(caps):
    """(the windows of a non-zero cap, by bucket of cap, highest first, ascending within a bucket (a counting sort);
    where each bucket starts there, BUCKETS + 1 of them; buckets per unit of cap: bucket b holds caps below
    (BUCKETS - b) / it)."""
    per_bucket = BUCKETS / (caps.max() * (1.0 + 1e-9))
    begins = np.zeros(BUCKETS + 1, dtype=np.int64)
    for w in range(len(caps)):  # loops, not array expressions: no temporary the size of the windows
        if caps[w] > 0:
            begins[BUCKETS - int(caps[w] * per_bucket)] += 1
    for b in range(BUCKETS):
        begins[b + 1] += begins[b]
    ranked, filled = np.empty(begins[BUCKETS], dtype=np.int64), begins.copy()
    for w in range(len(caps)):
        if caps[w] > 0:
            b = BUCKETS - 1 - int(caps[w] * per_bucket)
            ranked[filled[b]] = w
            filled[b] += 1
    return ranked, begins, per_bucket


@numba.njit(cache=True, nogil=True)
def _still_open(begins, b, per_bucket, floor):
    """The windows of bucket b and after whose bucket's cap still reaches `floor`."""
    c = b
    while c < BUCKETS and (BUCKETS - c) / per_bucket >= floor:
        c += 1
    return begins[c] - begins[b]


@numba.njit(cache=True, nogil=True)
def _score(source, scales, first, doc, zero):
    """`doc`'s exact score: its contributions added in query order from zero, as the exhaustive scorer adds them
    (`first`: each list's first entry in the window, its end when it has none there)."""
    docs, values, _, ends = source
    score = zero[0]
    for i in range(len(first)):
        at = _seek(docs, first[i], ends[i], doc)
        if at < ends[i] and docs[at] == doc:
            score += scales[i] * values[at]
    return score


@numba.njit(cache=True, nogil=True)
def _enter(windows, w, source, first, cursor):
    """Where each list's entries of window w start in `source` (`first`, and `cursor` there; its end when it has
    none)."""
    codes, firsts, bases, rows, _ = windows
    _, _, starts, ends = source
    for i in range(len(rows)):
        first[i] = cursor[i] = starts[i] + bases[rows[i], w >> 8] + firsts[rows[i], w] if codes[rows[i], w] > 0 else ends[i]


@numba.njit(cache=True, nogil=True)
def _reaches(source, scales, window, looked_up, cursor, doc, reach, floor):
    """Whether `doc` can reach `floor`, `reach` (>= floor) being its score in the essential lists plus the bounds in `window`
    ((codes, rows, each code's worth, w)) of the lists only looked up (`looked_up`: (order, essential):
    order[:essential]): looked up in those, highest bound first, each bound replaced by what the list holds, until the
    sum falls short."""
    docs, values, _, ends = source
    codes, rows, unit, w = window
    order, essential = looked_up
    for k in range(essential - 1, -1, -1):
        i = order[k]
        if codes[rows[i], w] == 0:
            continue
        reach -= codes[rows[i], w] * unit[i]
        cursor[i] = _seek(docs, cursor[i], ends[i], doc)
        if cursor[i] < ends[i] and docs[cursor[i]] == doc:
            reach += scales[i] * values[cursor[i]]
        if reach < floor:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def _offer(heap_docs, heap_scores, size, last, doc, score):
    """Put `doc` in the heap (of `size` entries, room for len(heap_docs); `last`: the one that ranks last when it is
    full) if it ranks in, a lower document before a higher one of equal score whatever the order they come in:
    whether it did."""
    if size < len(heap_docs):
        heap_docs[size], heap_scores[size] = doc, score
        return True
    if score < heap_scores[last] or (score == heap_scores[last] and doc > heap_docs[last]):
        return False
    heap_docs[last], heap_scores[last] = doc, score
    return True


@numba.njit(cache=True, nogil=True)
def _last(heap_docs, heap_scores, size):
    """The heap entry that ranks last: the lowest score, the highest document among equal ones."""
    last = 0
    for j in range(1, size):
        if heap_scores[j] < heap_scores[last] or (heap_scores[j] == heap_scores[last] and heap_docs[j] > heap_docs[last]):
            last = j
    return last


@numba.njit(cache=True, nogil=True)
def _seek(docs, start, end, doc):
    """The first position in [start, end) whose document is >= `doc`, else `end` (galloping, then binary search)."""
    step, low, high = 1, start, start
    while high < end and docs[high] < doc:
        low = high + 1
        high = start + step
        step *= 2
    high = min(high, end)
    while low < high:
        middle = (low + high) // 2
        if docs[middle] < doc:
            low = middle + 1
        else:
            high = middle
    return low


@numba.njit(cache=True, nogil=True)
def _top_nonzero(scores, depth, allowed):
    """The `depth` best non-zero scores among `allowed` (empty: all), unordered: one pass, a newcomer kept only when
    it beats the lowest kept strictly (so among equal scores the lower document stays)."""
    docs, values = np.empty(depth, dtype=np.int64), np.empty(depth, dtype=scores.dtype)
    masked, size, i = len(allowed) > 0, 0, 0
    while i < len(scores) and size < depth:
        if scores[i] != 0 and (not masked or allowed[i]):
            docs[size], values[size] = i, scores[i]
            size += 1
        i += 1
    if size < depth:
        return docs[:size], values[:size]
    last = _last(docs, values, size)
    lowest = values[last]  # a local: read from the array each time, the loop ran 4 times slower
    for j in range(i, len(scores)):
        if scores[j] > lowest and scores[j] != 0 and (not masked or allowed[j]):  # the first test fails most often
            docs[last], values[last] = j, scores[j]
            last = _last(docs, values, size)
            lowest = values[last]
    return docs, values


@numba.njit(cache=True, nogil=True)
def _add_list(docs, values, scale, out):
    """out[d] += the list's contribution to d (the addition of numpy's out[docs] += scale * values)."""
    for p in range(len(docs)):
        out[docs[p]] += scale * values[p]


@numba.njit(cache=True, nogil=True)
def _keep_best(docs, values, scale, best, held):
    """A group's list read: each document's best contribution so far in `best` (`held`: it has one)."""
    for p in range(len(docs)):
        contribution = scale * values[p]
        if not held[docs[p]] or contribution > best[docs[p]]:
            best[docs[p]], held[docs[p]] = contribution, True


@numba.njit(cache=True, nogil=True)
def _add_best(docs, best, held, out):
    """A group read whole: each of this list's documents adds its best once, and `best`/`held` are left zero."""
    for p in range(len(docs)):
        if held[docs[p]]:
            out[docs[p]] += best[docs[p]]
            best[docs[p]], held[docs[p]] = 0, False
