# SPDX-License-Identifier: Apache-2.0
"""The lookup prior from finished sequences, against hand counts and a brute-force longest-match search."""

import random

import pytest

from dspark import DSparkDecoder
from dspark.calibration import collect_calibration_data
from dspark.calibration.lookup_prior import lookup_prior_from_sequences
from dspark.decoding.lookup import EXTENT_BOUNDS, LookupConfig
from tests.decoding.toy_models import random_drafter, tiny_target


def counts(t):
    a, n = t.counts
    return a.tolist(), n.tolist()


def brute_proposal(h: list[int], m: int, M: int, k: int) -> tuple[list[int], int]:
    """Longest n in [m, M] whose suffix occurs ending at some e in [n, len(h) - 1]; the latest such e; the
    class is n below M, else M plus the extent bounds reached by the longest common suffix of h[:e] and h."""
    L = len(h)
    for n in range(M, m - 1, -1):
        for e in range(L - 1, n - 1, -1):
            if h[e - n : e] == h[L - n :]:
                cap = min(e, max(M, EXTENT_BOUNDS[-1]))
                x = max(x for x in range(n, cap + 1) if h[e - x : e] == h[L - x :])
                bounds = [b for b in EXTENT_BOUNDS if b > M]
                return h[e : e + k], (n if n < M else M + sum(x >= b for b in bounds))
    return [], 0


def brute_counts(sequences, starts, m, M, gamma):
    classes = M + 1 + sum(b > M for b in EXTENT_BOUNDS)
    acc = [[0] * gamma for _ in range(classes)]
    tri = [[0] * gamma for _ in range(classes)]
    for seq, start in zip(sequences, starts, strict=True):
        for t in range(start, len(seq)):
            proposal, c = brute_proposal(seq[:t], m, M, gamma)
            for j, tok in enumerate(proposal):
                if t + j >= len(seq):
                    break  # not committed: censored
                tri[c][j] += 1
                if seq[t + j] != tok:
                    break
                acc[c][j] += 1
    return acc, tri


@pytest.mark.parametrize(
    "seq, want",
    [
        # t=5: [1,2] matched at e=2, proposes [3,1,2] = seq[5:8]; t=6: [1,2,3] at e=3 proposes [1,2,3] against
        # [1,2] (then censored); t=7: [1,2,3,1] at e=4 proposes [2,3,1] against [2]; t=3, 4: no match
        (
            [1, 2, 3, 1, 2, 3, 1, 2],
            (
                [[0] * 3, [0] * 3, [1, 1, 1], [1, 1, 0], [1, 0, 0]],
                [[0] * 3, [0] * 3, [1, 1, 1], [1, 1, 0], [1, 0, 0]],
            ),
        ),
        # the same proposals against a last token 9: rejects at positions 2, 1 and 0
        (
            [1, 2, 3, 1, 2, 3, 1, 9],
            (
                [[0] * 3, [0] * 3, [1, 1, 0], [1, 0, 0], [0, 0, 0]],
                [[0] * 3, [0] * 3, [1, 1, 1], [1, 1, 0], [1, 0, 0]],
            ),
        ),
    ],
)
def test_prior_counts_by_hand(seq, want):
    t = lookup_prior_from_sequences([seq], [3], LookupConfig(min_match=2, max_match=4), gamma=3)
    longer = [[0] * 3] * len(EXTENT_BOUNDS)  # the extents here stay below 6: no longer-extent counts
    want = (want[0] + longer, want[1] + longer)
    assert counts(t) == want
    d = t.to_dict()
    assert (d["kind"], d["min_match"], d["max_match"], d["gamma"]) == ("lookup", 2, 4, 3)
    assert d["extent_bounds"] == list(EXTENT_BOUNDS)
    assert d["accepts"] == want[0] and d["trials"] == want[1]  # raw counts, no rescaling


@pytest.mark.parametrize("m, M, gamma", [(2, 4, 4), (1, 3, 7), (3, 3, 2)])
def test_prior_matches_a_brute_force_count(m, M, gamma):
    rng = random.Random(m * 100 + M * 10 + gamma)
    seqs, starts = [], []
    for i in range(12):
        vocab = 3 + i % 4  # small vocabularies repeat n-grams often
        seq = [rng.randrange(vocab) for _ in range(rng.randrange(0, 60))]
        if i % 3 == 0 and len(seq) > 10:
            seq += seq[2:9]  # a copied span: long matches that run to the end
        seqs.append(seq)
        starts.append(rng.randrange(0, len(seq) + 1))
    t = lookup_prior_from_sequences(seqs, starts, LookupConfig(min_match=m, max_match=M), gamma)
    want = brute_counts(seqs, starts, m, M, gamma)
    assert counts(t) == want
    assert sum(want[1][n][0] for n in range(M + 1)) > 20  # enough proposals to mean something
    assert sum(want[0][n][1] for n in range(M + 1)) > 0  # and accepts past the first position
    assert want[1][0] == [0] * gamma  # class 0 never proposes
    assert sum(want[1][c][0] for c in range(M + 1, len(want[1]))) > 0  # long extents are classed apart


def test_max_tokens_caps_the_proposals():
    seq = [1, 2, 3, 1, 2, 3, 1, 2]
    t = lookup_prior_from_sequences([seq], [3], LookupConfig(2, 4, max_tokens=1), gamma=3)
    assert counts(t)[1] == [[0] * 3, [0] * 3, [1, 0, 0], [1, 0, 0], [1, 0, 0]] + [[0] * 3] * 7


def test_bad_arguments_are_named():
    cfg = LookupConfig()
    with pytest.raises(ValueError, match="^starts:"):
        lookup_prior_from_sequences([[1, 2]], [0, 1], cfg, 2)
    with pytest.raises(ValueError, match=r"^starts\[0\]:"):
        lookup_prior_from_sequences([[1, 2]], [3], cfg, 2)
    with pytest.raises(ValueError, match="^gamma:"):
        lookup_prior_from_sequences([[1, 2]], [0], cfg, 0)
    with pytest.raises(ValueError, match="^config:"):
        lookup_prior_from_sequences([[1, 2]], [0], (2, 4), 2)


def test_collection_keeps_the_prompts_and_the_generated_sequences():
    target = tiny_target("llama", seed=0)
    dec = DSparkDecoder(target, random_drafter(target, block_size=3), max_batch_size=2)
    prompts = [[1, 2, 3, 1, 2], [4, 5, 6], [7, 8, 7, 8, 7]]
    try:
        want = dec.generate(prompts, max_new_tokens=9, temperature=0.0, eos_token_id=[])
        data = collect_calibration_data(dec, prompts, max_new_tokens=9, temperature=0.0)
    finally:
        dec.close()
    assert data.prompt_ids == prompts
    assert data.sequences == want.sequences  # greedy: the full planner commits the same tokens
    assert all(len(s) == 9 for s in data.sequences)
