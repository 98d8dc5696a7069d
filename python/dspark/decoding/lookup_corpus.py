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

Memory: each stored token indexes ``max_match - min_match + 1`` n-grams (about 100 bytes each in CPython), so
the default capacity of 262,144 tokens takes about 80 MB with the default match lengths. Past the capacity the
oldest outputs are dropped (the index is rebuilt from the newer half).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

__all__ = ["DEFAULT_CORPUS_TOKENS", "LookupCorpus"]

DEFAULT_CORPUS_TOKENS = 262_144  # a reasonable LookupConfig.corpus_tokens: about 1,000 answers of 256 tokens


class LookupCorpus:
    """Finished requests' outputs with an n-gram index over them.

    Parameters
    ----------
    min_match, max_match : int
        The n-gram lengths indexed (a :class:`~dspark.decoding.lookup.LookupConfig`'s).
    capacity : int
        Most tokens kept (>= 1); the oldest outputs go first.
    """

    __slots__ = ("capacity", "_lengths", "_docs", "_ends", "_size", "_next_id")

    def __init__(self, min_match: int, max_match: int, capacity: int = DEFAULT_CORPUS_TOKENS) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity: must be an int >= 1 (tokens kept), got {capacity!r}")
        self.capacity = capacity
        self._lengths = tuple(range(min_match, max_match + 1))
        self._docs: deque[tuple[int, list[int]]] = deque()  # (id, tokens), oldest first
        self._ends: dict[tuple[int, ...], tuple[list[int], int]] = {}  # n-gram -> (tokens, end e)
        self._size = 0
        self._next_id = 0

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
        self._docs.append((self._next_id, doc))
        self._next_id += 1
        self._size += len(doc)
        if self._size > self.capacity:
            self._evict()
        else:
            self._index(doc)

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
        for n in self._lengths:
            # n-grams ending at e = n .. len - 1 (each has a token after it); later ones win
            grams = zip(*(doc[i:] for i in range(n)), strict=False)
            ends.update((g, (doc, e)) for g, e in zip(grams, range(n, len(doc)), strict=False))

    def _evict(self) -> None:
        """Drop the oldest outputs down to half the capacity and index the rest again."""
        while self._size > self.capacity // 2 and len(self._docs) > 1:
            _, old = self._docs.popleft()
            self._size -= len(old)
        self._ends.clear()
        for _, doc in self._docs:
            self._index(doc)
