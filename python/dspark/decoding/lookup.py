# SPDX-License-Identifier: Apache-2.0
"""Lookup drafts: propose the tokens that followed the longest recent match of the history's own suffix.

A :class:`LookupIndex` holds one request's history (its prompt, then the tokens each round commits) and an
index over it that is updated incrementally, so that a proposal costs a few dictionary look-ups whatever the
history's length. It draws nothing at random: a proposal is a function of the history alone.

The rule
--------
Let ``h`` be the history, ``L = len(h)``, and ``m, M`` the config's ``min_match, max_match``. An *earlier
occurrence* of the suffix of length ``n`` is an end position ``e`` with ``n <= e <= L - 1`` and
``h[e - n:e] == h[L - n:L]``: the n-gram ends strictly before the history does, so at least one token, ``h[e]``,
follows it. ``propose(k)`` takes the largest ``n`` in ``[m, M]`` that has an earlier occurrence, the largest
such ``e`` (the most recent occurrence), and returns ``h[e:min(e + k, L)]``: up to ``k`` tokens, fewer when the
continuation runs into the end of the history. The occurrence may overlap the suffix itself: in a run
``[5, 5, 5, 5]`` with ``m, M = 2, 4`` the 3-gram ending at ``e = 3`` matches and the proposal is ``[5]`` (the one
token known to follow it), as prompt-lookup implementations do. With no earlier occurrence for any ``n`` the
proposal is ``[]``.

How sure a match is
-------------------
The suffix usually agrees with its occurrence for longer than ``n`` tokens: ``match_extent`` is the length of
their common suffix (``h[e - x:e] == h[L - x:L]``), counted backwards from ``n`` and capped at the last of the
config's ``extent_bounds`` (:data:`EXTENT_BOUNDS` by default). It says whether the text is copying a long
passage (or looping) or merely shares a few tokens with an earlier place, and the chance that deep drafts are right differs by an order of magnitude
between the two (greedy SmolLM2-135M, 4-token matches: 16 drafts all right 0.11–0.19 of the time for extents
4–5, 0.77–1.0 for extents >= 48; docs/lookup.md). :func:`match_class` turns ``(n, extent)`` into the class an
acceptance table keeps its counts under. For ``n < max_match`` the extent is ``n`` itself (a longer common
suffix would have matched a longer n-gram), so only ``max_match`` matches are split further. Like the
proposal, the extent is a function of the history alone.

Lookup without any history: an index with an empty history (or one shorter than ``min_match + 1`` tokens,
which cannot hold an earlier occurrence) proposes nothing — ``propose`` returns ``[]`` and sets
``match_length`` to 0; it is not an error.

The index
---------
One dict maps every n-gram (a tuple; its length is ``n``, so the ``M - m + 1`` tables share one dict) to the
latest end position at which it was followed by a token. The n-grams ending at the history's end ``L`` are
inserted only when token ``L`` arrives, so the dict never holds the suffix's own occurrence and one look-up
answers the rule's "most recent earlier occurrence" directly. ``extend`` costs ``O(M - m + 1)`` tuple inserts per token,
``propose`` ``O(M - m + 1)`` look-ups plus the ``k`` tokens copied; memory is ``O(L * (M - m + 1))`` tuples.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dspark.decoding.lookup_corpus import LookupCorpus

__all__ = [
    "EXTENT_BOUNDS",
    "HYBRID_LOOKUP_TOKENS",
    "LOOKUP_ALONE_TOKENS",
    "LookupConfig",
    "LookupIndex",
    "class_index",
    "extent_bounds",
    "lookup_width",
    "match_class",
    "num_match_classes",
]

# Tokens a lookup block holds when ``LookupConfig.max_tokens`` is None. In hybrid rounds it is wider than the
# drafter's γ: a long match is often right far past it (greedy SmolLM2-135M: 65 % of 4-token-match proposals
# are right for 7 tokens, 52 % for 16; docs/calibration.md), and wider lookup blocks win more rounds before the
# drafter runs. Lookup decoding alone keeps 8: 16 was slower there in 6 of 7 interleaved comparisons on a
# 2-core CPU (docs/benchmarks.md "Lookup blocks wider than γ").
HYBRID_LOOKUP_TOKENS = 16
LOOKUP_ALONE_TOKENS = 8

# Lower bounds of the match extents that get a class of their own past ``max_match`` (those above it apply):
# roughly geometric, since the counts of docs/lookup.md change most between short extents; the last is also
# where the backward comparison stops.
EXTENT_BOUNDS = (6, 8, 12, 16, 24, 32, 48)

# Chunks this long or longer are indexed with zip (a few microseconds to set up per n, then faster per token)
_BULK = 32


def _check_int(name: str, value: object, minimum: int, expected: str) -> None:
    # bool is an int subclass, and a float like 2.0 would slice silently: both are mistakes in a config
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an int {expected}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name}: must be {expected}, got {value}")


@dataclass(frozen=True)
class LookupConfig:
    """How a :class:`LookupIndex` matches and how much it proposes.

    Parameters
    ----------
    min_match : int
        Shortest suffix (in tokens) that may match; >= 1. In a long history almost every token occurred
        before, so a 1-token match says little: hence the default 2.
    max_match : int
        Longest suffix, tried first; >= ``min_match``. Longer suffixes give fewer but surer matches; each
        length costs one look-up per round and one index entry per token.
    max_tokens : int or None
        Tokens one proposal holds at most (>= 1). ``None``: a decoder's default lookup width (16 in hybrid rounds,
        8 for lookup decoding alone; :func:`lookup_width`), and no cap in :meth:`LookupIndex.propose` beyond its
        ``k``.
    extent_bounds : tuple of int
        Match extents at which a ``max_match`` match enters a class of its own in the acceptance tables
        (strictly increasing, >= 1; those at or below ``max_match`` are ignored). ``()`` classes by match
        length alone. Default :data:`EXTENT_BOUNDS`.
    corpus_tokens : int
        Tokens of earlier requests' outputs a decoder keeps as a second source, consulted for each match length
        after the request's own history (:class:`~dspark.decoding.lookup_corpus.LookupCorpus`); >= 0, 0 (the
        default) keeps none. ``DEFAULT_CORPUS_TOKENS`` (262,144, about 90 MB) is a reasonable size.
    """

    min_match: int = 2
    max_match: int = 4
    max_tokens: int | None = None
    extent_bounds: tuple[int, ...] = EXTENT_BOUNDS
    corpus_tokens: int = 0

    def __post_init__(self) -> None:
        _check_int("min_match", self.min_match, 1, ">= 1")
        _check_int("max_match", self.max_match, self.min_match, f">= min_match ({self.min_match})")
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, 1, ">= 1 or None")
        b = self.extent_bounds
        if not isinstance(b, tuple) or not all(
            type(x) is int and x > lo for x, lo in zip(b, (0, *b), strict=False)
        ):
            raise ValueError(f"extent_bounds: must be a tuple of strictly increasing ints >= 1, got {b!r}")
        _check_int("corpus_tokens", self.corpus_tokens, 0, ">= 0 (0: no corpus)")


def _as_token(t: object) -> int:
    # numpy integers are Integral and welcome; bools, floats and 0-d tensors are not token ids
    if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
        # iterating a tensor yields 0-d tensors: say how to pass one
        hint = "; pass a tensor as .tolist()" if hasattr(t, "tolist") and not isinstance(t, int) else ""
        raise ValueError(f"extend: tokens must be non-negative ints, got {t!r} ({type(t).__name__}){hint}")
    return int(t)


class LookupIndex:
    """One request's history with an incremental n-gram index; see the module docstring for the rule.

    Parameters
    ----------
    config : LookupConfig
        Match lengths and the proposal cap.
    corpus : LookupCorpus or None
        Earlier requests' outputs, tried for each match length after this history (None: the history only).

    Attributes
    ----------
    match_length : int
        The ``n`` whose occurrence produced the last proposal; 0 when that proposal was empty (no match,
        ``k = 0``, or no proposal made yet).
    match_extent : int
        How far that occurrence agrees with the history's suffix, in ``[match_length, max(match_length,
        max(config.extent_bounds))]``; 0 with ``match_length``.
    from_corpus : bool
        Whether that occurrence was in the corpus (the extent then compares the corpus output with the history).
    """

    __slots__ = (
        "config",
        "corpus",
        "match_length",
        "match_extent",
        "from_corpus",
        "_history",
        "_ends",
        "_lengths",
        "_extent_cap",
    )

    def __init__(self, config: LookupConfig | None = None, corpus: LookupCorpus | None = None) -> None:
        if config is None:
            config = LookupConfig()
        if not isinstance(config, LookupConfig):
            raise ValueError(f"config: must be a LookupConfig, got {type(config).__name__}")
        self.config = config
        self.corpus = corpus
        self.match_length = 0
        self.match_extent = 0
        self.from_corpus = False
        self._extent_cap = max((config.max_match, *config.extent_bounds))
        self._history: list[int] = []
        # n-gram tuple -> latest end position e (exclusive) with a token h[e] after it
        self._ends: dict[tuple[int, ...], int] = {}
        self._lengths = tuple(range(config.min_match, config.max_match + 1))

    def __len__(self) -> int:
        return len(self._history)

    @property
    def history(self) -> tuple[int, ...]:
        """A copy of the history (prompt and committed tokens), oldest first."""
        return tuple(self._history)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append committed tokens (the prompt first, then each round's) and index the n-grams they close.

        Parameters
        ----------
        tokens : iterable of int
            Non-negative token ids. All are checked before any is appended, so a bad one leaves the index as
            it was.

        Raises
        ------
        ValueError
            A token that is not a non-negative int (bools and floats included), naming it.
        """
        # plain non-negative ints (the usual case) skip the slower abstract-class check
        new = [t if type(t) is int and t >= 0 else _as_token(t) for t in tokens]
        h, ends = self._history, self._ends
        start = len(h)
        h.extend(new)
        stop = len(h)
        # The n-grams ending at start..stop-1 now have a token after them and become earlier occurrences
        # (the one ending at stop, the new suffix, waits for the next token).
        if stop - start < _BULK:
            for e in range(start, stop):
                for n in self._lengths:
                    if n > e:
                        break
                    ends[tuple(h[e - n : e])] = e
            return
        # A prompt: zip builds the n-grams in C, and update() keeps the last end of a repeated n-gram.
        for n in self._lengths:
            first = max(start, n)
            if first >= stop:
                continue
            seg = h[first - n : stop - 1]
            grams = zip(*(seg[i:] for i in range(n)), strict=False)  # the shifted slices stop together
            ends.update(zip(grams, range(first, stop), strict=True))

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens (capped by ``config.max_tokens``) that followed the longest recent match.

        Parameters
        ----------
        k : int
            Most tokens wanted (the round's γ); >= 0.

        Returns
        -------
        list of int
            The proposal, possibly shorter than ``k``; ``[]`` when no suffix of length in
            ``[min_match, max_match]`` occurred earlier (always so for an empty history). Sets
            :attr:`match_length` and :attr:`match_extent`.

        Raises
        ------
        ValueError
            ``k`` not an int >= 0.
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k: must be an int >= 0, got {k!r}")
        cap = self.config.max_tokens
        if cap is not None and k > cap:
            k = cap
        self.match_length = self.match_extent = 0
        self.from_corpus = False
        h = self._history
        L = len(h)
        if k == 0:
            return []
        ends, corpus = self._ends, self.corpus
        for n in reversed(self._lengths):
            if n > L:
                continue  # no occurrence of a suffix longer than the history
            gram = tuple(h[L - n :])
            e = ends.get(gram) if n < L else None  # an earlier occurrence needs n <= e <= L - 1
            src = h
            if e is None and corpus is not None:
                found = corpus.find(gram)
                if found is not None:
                    src, e = found
                    self.from_corpus = True
            if e is not None:
                self.match_length = n
                x, cap = n, self._extent_cap
                if n == self.config.max_match:  # shorter matches cannot extend (module docstring)
                    while x < cap and x < e and x < L and src[e - 1 - x] == h[L - 1 - x]:
                        x += 1
                self.match_extent = x
                return src[e : e + k]
        return []


def extent_bounds(config: LookupConfig) -> tuple[int, ...]:
    """The config's ``extent_bounds`` above its ``max_match``: each starts a class of longer extents."""
    return tuple(b for b in config.extent_bounds if b > config.max_match)


def num_match_classes(config: LookupConfig) -> int:
    """Classes of :func:`match_class`: 0 (no match), the match lengths ``1 .. max_match``, then one per
    bound of :func:`extent_bounds`."""
    return config.max_match + 1 + len(extent_bounds(config))


def match_class(config: LookupConfig, match_length: int, match_extent: int) -> int:
    """The acceptance class of a proposal: its match length below ``max_match``; for a ``max_match`` match,
    ``max_match`` plus the number of :func:`extent_bounds` that its extent reaches."""
    return class_index(config.max_match, extent_bounds(config), match_length, match_extent)


def class_index(max_match: int, bounds: Sequence[int], match_length: int, match_extent: int) -> int:
    """:func:`match_class` for a class layout given by ``max_match`` and its extent ``bounds`` (all above it),
    as an acceptance file records it."""
    if match_length < max_match:
        return match_length
    return max_match + sum(1 for b in bounds if match_extent >= b)


def lookup_width(config: LookupConfig, gamma: int, with_drafter: bool) -> int:
    """Tokens a decoder's lookup block holds at most: ``max_tokens``, by default :data:`HYBRID_LOOKUP_TOKENS`
    with a drafter (never fewer than its ``gamma``; 0 when ``gamma`` is 0: no drafts) and
    :data:`LOOKUP_ALONE_TOKENS` for lookup decoding alone (its γ)."""
    if not with_drafter:
        return config.max_tokens or LOOKUP_ALONE_TOKENS
    return max(gamma, config.max_tokens or HYBRID_LOOKUP_TOKENS) if gamma > 0 else 0
