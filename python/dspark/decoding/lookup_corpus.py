# SPDX-License-Identifier: Apache-2.0
"""Earlier requests' outputs as a second lookup source, shared by one decoder's requests.

A request whose own history (prompt + output) holds no earlier occurrence of its suffix may still be repeating
what an earlier request wrote: a template, a code idiom, a passage both answers quote. :class:`LookupCorpus`
keeps the outputs of finished requests with the same n-gram rule as :class:`~dspark.decoding.lookup.LookupIndex`
(which consults it for each match length after the request's own history; docs/lookup.md, "Earlier requests'
outputs").

Exactness (DESIGN §4.5): what the corpus holds was committed by requests that finished before the round, so a
proposal from it is a function of tokens fixed before the round's draws, like one from the request's own
history: q is one-hot at a token chosen without looking at anything the round samples.

Memory: each stored token indexes ``max_match - min_match + 1`` n-grams (about 120 bytes each in CPython), so
the default capacity of 262,144 tokens takes about 90 MB with the default match lengths. Past the capacity the
oldest outputs are dropped with their index entries (an entry that still points into a dropped output is the
latest occurrence of its n-gram, so no kept output holds it: removing it is exact and needs no rebuild).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

__all__ = ["DEFAULT_CORPUS_TOKENS", "LookupCorpus"]

DEFAULT_CORPUS_TOKENS = 262_144  # a reasonable LookupConfig.corpus_tokens: about 1,000 answers of 256 tokens


def _grams(doc: list[int], n: int):
    """``(n-gram, e)`` for the n-grams of ``doc`` ending at ``e = n .. len - 1`` (a token follows each)."""
    grams = zip(*(doc[i:] for i in range(n)), strict=False)
    return zip(grams, range(n, len(doc)), strict=False)


class LookupCorpus:
    """Finished requests' outputs with an n-gram index over them.

    Parameters
    ----------
    min_match, max_match : int
        The n-gram lengths indexed (a :class:`~dspark.decoding.lookup.LookupConfig`'s).
    capacity : int
        Most tokens kept (>= 1); the oldest outputs go first.
    """

    __slots__ = ("capacity", "_lengths", "_docs", "_ends", "_size")

    def __init__(self, min_match: int, max_match: int, capacity: int = DEFAULT_CORPUS_TOKENS) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity: must be an int >= 1 (tokens kept), got {capacity!r}")
        self.capacity = capacity
        self._lengths = tuple(range(min_match, max_match + 1))
        self._docs: deque[list[int]] = deque()  # oldest first
        self._ends: dict[tuple[int, ...], tuple[list[int], int]] = {}  # n-gram -> (output, end e), the latest
        self._size = 0

    def __len__(self) -> int:
        """Tokens held."""
        return self._size

    @property
    def outputs(self) -> int:
        """Outputs held."""
        return len(self._docs)

    def add(self, tokens: Iterable[int]) -> None:
        """Keep one finished request's output (a copy); outputs shorter than ``min_match + 1`` tokens propose
        nothing and are not kept. An output longer than the capacity keeps its last ``capacity`` tokens."""
        doc = [int(t) for t in tokens][-self.capacity :]
        if len(doc) <= self._lengths[0]:
            return
        self._docs.append(doc)
        self._size += len(doc)
        self._index(doc)
        while self._size > self.capacity and len(self._docs) > 1:
            self._drop_oldest()

    def clear(self) -> None:
        """Forget every output."""
        self._docs.clear()
        self._ends.clear()
        self._size = 0

    def find(self, gram: tuple[int, ...]) -> tuple[list[int], int] | None:
        """``(output, e)``: the latest kept output holding ``gram`` followed by a token, with ``output[e - n:e]
        == gram``; None when none does."""
        return self._ends.get(gram)

    def _index(self, doc: list[int]) -> None:
        ends = self._ends
        for n in self._lengths:  # later places (and later outputs) overwrite earlier ones
            ends.update((g, (doc, e)) for g, e in _grams(doc, n))

    def _drop_oldest(self) -> None:
        """Forget the oldest output and the index entries that point into it."""
        old = self._docs.popleft()
        self._size -= len(old)
        ends = self._ends
        for n in self._lengths:
            for g, _ in _grams(old, n):
                hit = ends.get(g)
                if hit is not None and hit[0] is old:
                    del ends[g]
