# SPDX-License-Identifier: Apache-2.0
"""LookupIndex against a brute-force longest-match search written from the rule, built incrementally."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark.decoding.lookup import (
    _BULK,
    EXTENT_BOUNDS,
    LookupConfig,
    LookupIndex,
    extent_bounds,
    match_class,
    num_match_classes,
)


def brute_force(history: list[int], cfg: LookupConfig, k: int) -> tuple[list[int], int, int]:
    """The rule read literally: longest n first, then the latest end e in [n, L - 1] whose n-gram matches;
    the extent is the longest x up to the cap with history[e - x:e] == history[L - x:L], tried from the cap
    down (no use of the argument that only max_match matches can extend)."""
    if cfg.max_tokens is not None:
        k = min(k, cfg.max_tokens)
    if k == 0:
        return [], 0, 0
    L = len(history)
    cap = max((cfg.max_match, *cfg.extent_bounds))
    for n in range(cfg.max_match, cfg.min_match - 1, -1):
        if n > L:
            continue
        suffix = history[L - n :]
        for e in range(L - 1, n - 1, -1):
            if history[e - n : e] == suffix:
                x = next(x for x in range(min(cap, e), n - 1, -1) if history[e - x : e] == history[L - x :])
                return history[e : min(e + k, L)], n, x
    return [], 0, 0


def first_disagreement(
    index_cls: type[LookupIndex], cfg: LookupConfig, chunks: list[list[int]], ks: list[int]
) -> tuple | None:
    """Extend chunk by chunk; after every extend compare propose(k), match_length and match_extent with the
    brute force."""
    index = index_cls(cfg)
    history: list[int] = []
    for chunk in [[], *chunks]:
        index.extend(chunk)
        history += chunk
        if len(index) != len(history):
            return ("len", history, len(index))
        for k in ks:
            got = (index.propose(k), index.match_length, index.match_extent)
            want = brute_force(history, cfg, k)
            if got != want:
                return (history, k, got, want)
    return None


@st.composite
def cases(draw):
    lo = draw(st.integers(1, 4))
    hi = draw(st.integers(lo, lo + 3))
    cap = draw(st.none() | st.integers(1, 6))
    vocab = draw(st.integers(1, 4))  # small vocabularies, so that matches of every length happen
    token = st.integers(0, vocab - 1)
    # short chunks (a round's commits) and long ones (a prompt: extend indexes those in bulk)
    chunk = st.lists(token, max_size=6) | st.lists(token, min_size=_BULK - 1, max_size=_BULK + 24)
    chunks = draw(st.lists(chunk, min_size=1, max_size=8))
    ks = draw(st.lists(st.integers(0, 12), min_size=1, max_size=3))
    bounds = draw(st.sampled_from([EXTENT_BOUNDS, (), (3, 5), (9,)]))
    return LookupConfig(lo, hi, cap, bounds), chunks, ks


@settings(max_examples=400, deadline=None)
@given(cases())
def test_index_equals_brute_force_after_every_extend(case):
    cfg, chunks, ks = case
    assert first_disagreement(LookupIndex, cfg, chunks, ks) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2), max_size=80), st.integers(1, 80))
def test_chunking_does_not_matter_and_propose_is_pure(tokens, step):
    whole, pieces = LookupIndex(), LookupIndex()
    whole.extend(tokens)
    for i in range(0, len(tokens), step):
        pieces.extend(tokens[i : i + step])
    assert whole.history == pieces.history == tuple(tokens)
    first = whole.propose(7)
    assert first == whole.propose(7) == pieces.propose(7)  # proposing twice changes nothing
    assert whole.match_length == pieces.match_length


# --- edge cases -----------------------------------------------------------------------------------------


def test_empty_history_proposes_nothing():
    index = LookupIndex()
    assert len(index) == 0
    assert index.propose(7) == [] and index.match_length == 0
    index.extend([])
    assert index.propose(7) == [] and len(index) == 0


def test_history_shorter_than_min_match_plus_one():
    index = LookupIndex(LookupConfig(min_match=3, max_match=4))
    index.extend([1, 1, 1])  # the 3-gram has no earlier occurrence: it would need a 4th token after it
    assert index.propose(5) == [] and index.match_length == 0
    index.extend([1])
    assert index.propose(5) == [1] and index.match_length == 3


def test_run_of_one_token_proposes_it():
    index = LookupIndex(LookupConfig(min_match=2, max_match=4))
    index.extend([5, 5, 5, 5])
    # the 3-gram ending at e = 3 overlaps the suffix and is followed by one known 5
    assert index.propose(7) == [5] and index.match_length == 3
    index.extend([5] * 6)
    assert index.propose(7) == [5] and index.match_length == 4


def test_longest_match_wins_over_a_more_recent_shorter_one():
    index = LookupIndex(LookupConfig(min_match=1, max_match=3))
    index.extend([1, 2, 3, 9, 8, 2, 3, 7, 1, 2, 3])
    # (2, 3) last occurred before 7, but (1, 2, 3) occurred at the start, before 9
    assert index.propose(3) == [9, 8, 2] and index.match_length == 3


def test_match_at_the_very_end_and_k_larger_than_what_follows():
    index = LookupIndex(LookupConfig(min_match=2, max_match=2))
    index.extend([4, 6, 1, 2, 3, 1, 2])
    assert index.propose(2) == [3, 1]
    assert index.propose(100) == [3, 1, 2]  # runs into the end of the history
    index.extend([8, 0, 1, 2])
    assert index.propose(100) == [8, 0, 1, 2]  # the most recent (1, 2) now is the one before 8


def test_k_zero_and_the_cap():
    index = LookupIndex(LookupConfig(min_match=1, max_match=2, max_tokens=2))
    index.extend([1, 2, 3, 4, 1])
    assert index.propose(0) == [] and index.match_length == 0
    assert index.propose(7) == [2, 3] and index.match_length == 1
    assert index.propose(1) == [2]


def test_extent_counts_how_far_the_occurrence_agrees():
    index = LookupIndex(LookupConfig(2, 4))
    index.extend(list(range(10)) + [7] + list(range(6)))  # ... 0 1 2 3 4 5 | the suffix 2 3 4 5
    assert index.propose(3) == [6, 7, 8]
    assert (index.match_length, index.match_extent) == (4, 6)  # 0..5 agree, then 7 against the start
    index.extend([6, 7, 8, 9])
    assert index.propose(2) == [7, 0] and (index.match_length, index.match_extent) == (4, 10)
    short = LookupIndex(LookupConfig(2, 4))
    short.extend([5, 1, 2, 6, 1, 2])  # only a 2-gram matches: its extent is its length
    assert short.propose(2) == [6, 1] and (short.match_length, short.match_extent) == (2, 2)
    run = LookupIndex(LookupConfig(2, 4))
    run.extend([3] * 200)
    assert run.propose(1) == [3] and run.match_extent == EXTENT_BOUNDS[-1]  # capped


def test_match_classes():
    cfg = LookupConfig(2, 4)
    assert extent_bounds(cfg) == EXTENT_BOUNDS == (6, 8, 12, 16, 24, 32, 48)
    assert num_match_classes(cfg) == 5 + len(EXTENT_BOUNDS)
    want = {(0, 0): 0, (2, 2): 2, (3, 3): 3, (4, 4): 4, (4, 5): 4, (4, 6): 5, (4, 7): 5, (4, 8): 6}
    want |= {(4, 11): 6, (4, 12): 7, (4, 16): 8, (4, 24): 9, (4, 32): 10, (4, 47): 10, (4, 48): 11}
    for (n, x), c in want.items():
        assert match_class(cfg, n, x) == c, (n, x)
    wide = LookupConfig(2, 10)  # bounds at or below max_match are dropped
    assert extent_bounds(wide) == (12, 16, 24, 32, 48) and num_match_classes(wide) == 16
    assert [match_class(wide, 10, x) for x in (10, 11, 12, 100)] == [10, 10, 11, 15]


def test_extent_bounds_are_a_config_field():
    assert (
        extent_bounds(LookupConfig(2, 4, extent_bounds=())) == ()
        and num_match_classes(LookupConfig(2, 4, extent_bounds=())) == 5
    )
    index = LookupIndex(LookupConfig(2, 4, extent_bounds=(5,)))
    index.extend([7] * 30)
    assert index.propose(2) == [7] and index.match_extent == 5  # capped at the config's last bound
    bare = LookupIndex(LookupConfig(2, 4, extent_bounds=()))
    bare.extend([7] * 30)
    assert bare.propose(2) == [7] and bare.match_extent == 4


def test_numpy_ints_are_tokens():
    index = LookupIndex()
    index.extend(np.array([3, 4, 3, 4], dtype=np.int64))
    assert index.history == (3, 4, 3, 4) and all(type(t) is int for t in index.history)
    assert index.propose(4) == [3, 4]


# --- bad config and bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_match": 0}, "min_match: must be >= 1, got 0"),
        ({"min_match": -3, "max_match": 1}, "min_match: must be >= 1, got -3"),
        ({"min_match": 2, "max_match": 1}, r"max_match: must be >= min_match \(2\), got 1"),
        ({"min_match": 2.0}, r"min_match: must be an int >= 1, got 2.0 \(float\)"),
        ({"max_match": True}, r"max_match: must be an int >= min_match \(2\), got True \(bool\)"),
        ({"max_tokens": 0}, "max_tokens: must be >= 1 or None, got 0"),
        ({"max_tokens": "3"}, "max_tokens: must be an int >= 1 or None, got '3'"),
        (
            {"extent_bounds": (8, 6)},
            r"extent_bounds: must be a tuple of strictly increasing ints >= 1, got \(8, 6\)",
        ),
        ({"extent_bounds": [6, 8]}, r"extent_bounds: must be a tuple"),
        ({"extent_bounds": (0,)}, r"extent_bounds: must be a tuple"),
        ({"extent_bounds": (6.0,)}, r"extent_bounds: must be a tuple"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LookupConfig(**kwargs)


def test_bad_config_object():
    with pytest.raises(ValueError, match="config: must be a LookupConfig, got dict"):
        LookupIndex({"min_match": 2})


@pytest.mark.parametrize("k", [-1, 1.5, True, None])
def test_bad_k(k):
    index = LookupIndex()
    index.extend([1, 2, 1, 2])
    with pytest.raises(ValueError, match="k: must be an int >= 0"):
        index.propose(k)


@pytest.mark.parametrize(("token", "shown"), [(2.0, "2.0 (float)"), (True, "True (bool)"), (-1, "-1 (int)")])
def test_bad_token_is_named_and_leaves_the_index_as_it_was(token, shown):
    index = LookupIndex()
    index.extend([1, 2, 1, 2])
    with pytest.raises(ValueError, match=re.escape(f"extend: tokens must be non-negative ints, got {shown}")):
        index.extend([2, token, 3])
    assert index.history == (1, 2, 1, 2)
    assert index.propose(3) == brute_force([1, 2, 1, 2], index.config, 3)[0] == [1, 2]


def test_zero_dim_tensor_tokens_are_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"got tensor\(3\) \(Tensor\); pass a tensor as .tolist\(\)"):
        LookupIndex().extend(torch.tensor([3, 4]))


# --- negative controls: the checker catches wrong indexes -------------------------------------------------


class OldestOccurrence(LookupIndex):
    """Wrong: keeps the first end position of each n-gram instead of the latest."""

    def extend(self, tokens):
        for t in tokens:
            h = self._history
            L = len(h)
            for n in self._lengths:
                if n <= L:
                    self._ends.setdefault(tuple(h[L - n :]), L)
            h.append(int(t))


class ShortestFirst(LookupIndex):
    """Wrong: tries the shortest suffix first."""

    def __init__(self, config=None):
        super().__init__(config)
        self._lengths = tuple(reversed(self._lengths))

    def extend(self, tokens):  # the parent's loops stop at the first n too long: they need ascending n
        for t in tokens:
            h = self._history
            L = len(h)
            for n in self._lengths:
                if n <= L:
                    self._ends[tuple(h[L - n :])] = L
            h.append(int(t))


class ExtentStopsShortOfTheStart(LookupIndex):
    """Wrong: never lets the extent reach the history's first token (an off-by-one in the backward scan)."""

    def propose(self, k):
        out = super().propose(k)
        if out and self.match_length == self.config.max_match:
            h, n = self._history, self.match_length
            L = len(h)
            e = self._ends[tuple(h[L - n :])]
            x = n
            while x < self._extent_cap and x < e - 1 and h[e - 1 - x] == h[L - 1 - x]:  # e - 1: the bug
                x += 1
            self.match_extent = x
        return out


@pytest.mark.parametrize(
    ("wrong", "cfg", "history"),
    [
        (OldestOccurrence, LookupConfig(2, 2), [1, 2, 3, 1, 2, 4, 1, 2]),
        (ShortestFirst, LookupConfig(1, 3), [1, 2, 3, 9, 8, 2, 3, 7, 1, 2, 3]),
        (ExtentStopsShortOfTheStart, LookupConfig(2, 2), [1, 2, 3, 1, 2, 3, 1, 2, 3]),
    ],
)
def test_checker_catches_a_wrong_index(wrong, cfg, history):
    assert first_disagreement(LookupIndex, cfg, [history], [4]) is None
    found = first_disagreement(wrong, cfg, [history], [4])
    assert found is not None
    _, _, got, want = found
    assert got != want


@pytest.mark.parametrize("wrong", [OldestOccurrence, ShortestFirst, ExtentStopsShortOfTheStart])
def test_random_histories_find_the_wrong_indexes_too(wrong):
    # the property test's generator has the power to find these bugs, not only the hand-picked histories
    rng = random.Random(0)
    for _ in range(200):
        lo = rng.randint(1, 3)
        cfg = LookupConfig(lo, rng.randint(lo, lo + 2))
        history = [rng.randrange(3) for _ in range(rng.randint(0, 40))]
        if first_disagreement(wrong, cfg, [history], [rng.randint(1, 8)]) is not None:
            return
    pytest.fail(f"{wrong.__name__} agreed with the brute force on 200 random histories")
