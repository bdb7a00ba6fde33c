"""BM25 top-k without scoring every posting: MaxScore dynamic pruning, document at a time, exact.

A query's score is a sum over its terms' posting lists, and a list's entries never exceed its `bound`. MaxScore
(Turtle & Flood, "Query evaluation: strategies and optimizations", IP&M 1995; the algorithm of Lucene's
MaxScoreBulkScorer and PISA's `maxscore`) keeps the lists sorted by bound and splits them into the non-essential
ones, whose bounds sum to less than theta, a score k documents are known to reach, and the essential rest. Theta
starts from a seed (the exact scores of the rarest lists' best entries, the likeliest top documents) and rises
with the heap's lowest score. A document in none of the essential lists cannot enter the top k, so only the essential lists are
walked; each document found there is looked up in the non-essential lists, highest bound first (galloping search),
and dropped as soon as its score so far plus the bounds left cannot reach theta. As theta rises, more lists become
non-essential: the frequent terms (low idf, long lists) are the ones only looked up, where scoring every posting
costs most.

Exactness: a document that passes is scored by adding its contributions in query order, in the scorer's dtype, from
zero: the additions of the exhaustive scorer (`exhaustive_scores`), so scores are bit-identical to it. Documents
come in ascending order and a newcomer must beat the heap's lowest score strictly, so among equal scores the lower
document stays, the tie order of search.ranking.top_k. Bounds are compared with a relative margin, so float
rounding can keep a document needlessly, never drop one that belongs. Entries must be non-negative (every BM25
variant but Robertson's idf).

The exhaustive reference runs compiled too (every list added into one array, then one pass that keeps the top k),
and is the faster of the two up to a million documents (search.bm25.worth_pruning). The loops run compiled (numba;
`cache=True` keeps the machine code beside this module after the first call).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numba
import numpy as np

from hybrid_retrieval.search.filters.language import Allowed
from hybrid_retrieval.search.ranking import Ranking, top_k

SEED_POOL = 16  # theta's first value: the exact scores of this many times k of the rarest lists' best entries
WALK_LIMIT = 0.5  # above this share of the postings essential at the seed, the exhaustive sum runs instead
MARGIN = 1e-5  # relative: bounds summed in float64 against scores summed in the scorer's dtype
# a filter that admits fewer documents than this share: their scores gathered and ranked (numpy) beat one compiled
# pass over every score (1.0 vs 0.95 ms at 10% of 1M random scores, 0.27 vs 2.2 ms at 1%; an ad hoc run)
GATHER_BELOW = 0.1
_NO_FILTER = np.ones(0, dtype=np.bool_)
ScoreOf = Callable[[np.ndarray], np.ndarray]  # a query's scores of given (ascending) documents


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
    if any(p.group is not None for p in lists):  # a best-of-group has no bound MaxScore can split: summed instead
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
    ends = starts + lengths
    scales = np.array([1.0 if p.scale is None else p.scale for p in lists], dtype=dtype)
    bounds = np.array([p.bound for p in lists], dtype=np.float64)
    mask = _NO_FILTER if allowed is None else allowed.mask
    theta = _theta_seed(lists, depth, dtype, allowed)
    if _essential_share(lists, theta) > WALK_LIMIT:  # the walk would read most postings: the vectorised sum is faster
        return top_matches(exhaustive_scores(lists, num_docs, dtype), depth, allowed)
    found, scores = _maxscore((docs, values, starts, ends), scales, bounds, depth, mask, np.zeros(1, dtype=dtype), theta, MARGIN)
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


def _essential_share(lists: list[PostingList], theta: float) -> float:
    """The share of the postings in the lists theta leaves essential (the walk reads them whole)."""
    by_bound = sorted(lists, key=lambda p: p.bound)
    floor, summed, total = theta - MARGIN * abs(theta), 0.0, sum(len(p.docs) for p in lists)
    for k, posting in enumerate(by_bound):
        summed += posting.bound
        if summed >= floor:
            return sum(len(p.docs) for p in by_bound[k:]) / max(1, total)
    return 0.0


def warm(pruning: bool = True) -> None:
    """Compile (or load from numba's cache) the kernels an index serves with, so that no search waits for them: the
    sums and top-k of scores (float32 from an index's score matrix, float64 from a live collection's lists), with
    typo variants' groups, and, when `pruning`, MaxScore over either's lists (int32 documents and float32 scores,
    int64 and float64 end to end)."""
    docs, values = np.array([0], np.int32), np.array([1.0], np.float32)
    for scores in (values, np.array([1.0])):
        top_matches(scores, 1)
    for doc_type, value_type in ((np.int32, np.float32), (np.int32, np.float64), (np.int64, np.float64)):  # live: both
        alone = PostingList(np.array([0], doc_type), np.array([1.0], value_type), 1.0)
        variant = replace(alone, group=0)  # a typo's variants (search.typo)
        exhaustive_scores([alone, variant, variant], 1, alone.values.dtype)
    if pruning:
        top_k_pruned([PostingList(docs, values, 1.0, within=(docs, values))], 1, 1, values.dtype)
        top_k_pruned([PostingList(docs, np.array([1.0]), 1.0)], 1, 1, np.dtype(np.float64))


def exhaustive_leg(scores: np.ndarray, depth: int, allowed: Allowed | None) -> tuple[Ranking, ScoreOf]:
    """A BM25 leg from every document's scores: the top `depth` matches, and the score of any documents."""
    return top_matches(scores, depth, allowed), scores.__getitem__


def _theta_seed(lists: list[PostingList], depth: int, dtype: np.dtype, allowed: Allowed | None) -> float:
    """A score `depth` documents are known to reach (-inf: none known), so that pruning starts at the first document
    instead of once the heap is full of whatever came first: the exact scores of the best SEED_POOL * depth entries
    of the rarest lists (the highest bounds), the documents most likely to rank first."""
    pool: list[np.ndarray] = []
    for posting in sorted(lists, key=lambda p: -p.bound):
        docs, values = posting.docs, posting.values
        if allowed is not None:
            admitted = allowed.mask[docs]
            docs, values = docs[admitted], values[admitted]
        if len(docs) > SEED_POOL * depth:
            docs = docs[np.argpartition(-values, SEED_POOL * depth - 1)[: SEED_POOL * depth]]
        pool.append(docs)
        if sum(map(len, pool)) >= depth:
            break
    seeds = np.unique(np.concatenate(pool)) if pool else np.empty(0, dtype=np.int64)
    if len(seeds) < depth:
        return -np.inf
    exact = score_documents(lists, seeds.astype(np.int64), dtype)
    return float(np.partition(exact, len(exact) - depth)[len(exact) - depth])


@numba.njit(cache=True, nogil=True)
def _maxscore(source, scales, bounds, depth, allowed, zero, theta, margin):
    """`source`: every list's entries end to end (documents, values) and each list's [start, end) there."""
    starts = source[2]
    n = len(starts)
    order = np.argsort(bounds)  # ascending bound: order[:essential] are the non-essential lists
    prefix = np.zeros(n + 1)  # prefix[k]: the bounds of order[:k] summed
    for k in range(n):
        prefix[k + 1] = prefix[k] + bounds[order[k]]
    cursor = starts.copy()
    contribution = np.zeros(n, dtype=zero.dtype)  # the current document's, list by list
    heap_docs, heap_scores = np.empty(depth, dtype=np.int64), np.empty(depth, dtype=zero.dtype)
    size, last, floor, essential = 0, 0, theta - margin * abs(theta), 0
    while essential < n and prefix[essential + 1] < floor:
        essential += 1
    while True:
        doc, partial = _read_essential(source, scales, order, essential, cursor, contribution)
        if doc < 0:
            break
        if len(allowed) and not allowed[doc]:
            continue
        if floor > -np.inf and not _probe_rest(source, scales, order, essential, prefix, cursor, contribution, doc, partial, floor):
            continue
        score = zero[0]
        for i in range(n):  # in query order, as the exhaustive scorer adds
            score += contribution[i]
        if score == 0 or not _offer(heap_docs, heap_scores, size, last, doc, score):
            continue
        size = min(size + 1, depth)
        if size == depth:  # the entry that ranks last moves only when one comes in
            last = _last(heap_docs, heap_scores, size)
        if size == depth and heap_scores[last] > theta:
            theta = heap_scores[last]
            floor = theta - margin * abs(theta)
            while essential < n and prefix[essential + 1] < floor:
                essential += 1
    return heap_docs[:size], heap_scores[:size]


@numba.njit(cache=True, nogil=True)
def _read_essential(source, scales, order, essential, cursor, contribution):
    """(the next document of the essential lists, or -1; the sum of its contributions there), their cursors moved
    past it and `contribution` holding each list's (0 elsewhere)."""
    docs, values, _, ends = source
    doc = -1
    for k in range(essential, len(order)):
        i = order[k]
        if cursor[i] < ends[i] and (doc < 0 or docs[cursor[i]] < doc):
            doc = docs[cursor[i]]
    contribution[:] = 0
    partial = 0.0
    if doc < 0:
        return doc, partial
    for k in range(essential, len(order)):
        i = order[k]
        if cursor[i] < ends[i] and docs[cursor[i]] == doc:
            contribution[i] = scales[i] * values[cursor[i]]
            partial += contribution[i]
            cursor[i] += 1
    return doc, partial


@numba.njit(cache=True, nogil=True)
def _probe_rest(source, scales, order, essential, prefix, cursor, contribution, doc, partial, floor):  # noqa: PLR0913  # arrays: what a compiled kernel takes
    """Whether `doc` can still reach `floor`: looked up in the non-essential lists, highest bound first, until its
    score so far plus the bounds left falls short (its contributions found go to `contribution`)."""
    docs, values, _, ends = source
    if partial + prefix[essential] < floor:
        return False
    for k in range(essential - 1, -1, -1):
        i = order[k]
        cursor[i] = _seek(docs, cursor[i], ends[i], doc)
        if cursor[i] < ends[i] and docs[cursor[i]] == doc:
            contribution[i] = scales[i] * values[cursor[i]]
            partial += contribution[i]
        if partial + prefix[k] < floor:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def _offer(heap_docs, heap_scores, size, last, doc, score):
    """Put `doc` in the heap (of `size` entries, room for len(heap_docs); `last`: the one that ranks last when it is
    full) if it ranks in: whether it did."""
    if size < len(heap_docs):
        heap_docs[size], heap_scores[size] = doc, score
        return True
    if score <= heap_scores[last]:  # equal: the lower document, already in, stays
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
