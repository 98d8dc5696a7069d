# SPDX-License-Identifier: Apache-2.0
"""Copy classes (``copy_extent_bounds``): the config records and checks them, a copy's class is its match length
or, for a ``copy_max_match`` match, its extent class (against a brute force), and a drafter keyed by match
length alone warm-starts one with extent classes drafting exactly what it drafted; the copy head's greedy table
(``copy_greedy_bias``) moves greedy rows only."""

from __future__ import annotations

import random

import pytest
import torch

from dspark.decoding.sources import copy_proposal, new_copy_index
from dspark.models.config import DrafterConfig
from dspark.models.drafter import DSparkDrafter
from dspark.training.trainer import load_drafter_weights
from tests.training.test_copy_channel import _drafter, frozen_target


@pytest.fixture(scope="module", name="target")
def _target():
    return frozen_target()


def test_config_records_and_checks_extent_bounds(target):
    d = _drafter(target, copy_head=True, copy_channel=True, copy_extent_bounds=[5, 9])
    c = d.config
    assert c.num_copy_classes == 3 + 1 + 2
    assert d.copy_head.logit_bias.shape == (c.block_size, 6)
    assert d.copy_head.conf_bias.shape == (c.block_size, 2, 6)
    assert d.copy_embed.weight.shape[0] == 6
    raw = c.to_dict()
    assert raw["copy_extent_bounds"] == [5, 9]
    assert DrafterConfig.from_dict(raw).copy_extent_bounds == [5, 9]
    plain = _drafter(target, copy_head=True).config
    assert plain.num_copy_classes == 4 and "copy_extent_bounds" not in plain.to_dict()
    for bad in ([3, 9], [9, 5], [5, 5]):  # not above copy_max_match (3), not increasing
        with pytest.raises(ValueError, match="copy_extent_bounds"):
            DrafterConfig.from_dict({**raw, "copy_extent_bounds": bad})
    no_copies = _drafter(target).config.to_dict()
    with pytest.raises(ValueError, match="copy_extent_bounds.*reads copies"):
        DrafterConfig.from_dict({**no_copies, "copy_extent_bounds": [5]})
    with pytest.raises(ValueError, match="copy_extent_bounds: expected a list of ints"):
        DrafterConfig.from_dict({**raw, "copy_extent_bounds": 5})


def _brute_class(h: list[int], lo: int, hi: int, bounds: tuple[int, ...], gamma: int):
    """The longest n in [lo, hi] whose suffix occurred earlier (most recent end e <= L - 1), its continuation
    and class, with the extent counted by comparing the two prefixes backwards."""
    L = len(h)
    for n in range(hi, lo - 1, -1):
        ends = [e for e in range(n, L) if h[e - n : e] == h[L - n :]]
        if not ends:
            continue
        e = max(ends)
        if n < hi:
            return h[e : e + gamma], n
        x = 0
        while x < e and h[e - 1 - x] == h[L - 1 - x]:
            x += 1
        return h[e : e + gamma], hi + sum(1 for b in bounds if x >= b)
    return [], 0


def test_copy_class_against_a_brute_force(target):
    d = _drafter(target, copy_head=True, copy_extent_bounds=[5, 9])
    rng = random.Random(0)
    seen = set()
    for _ in range(400):
        motif = [rng.randrange(4) for _ in range(rng.randrange(2, 12))]
        h = (motif * 3)[: rng.randrange(2, 30)] + [rng.randrange(4) for _ in range(rng.randrange(0, 6))]
        h += motif[: rng.randrange(0, len(motif) + 1)]
        got = copy_proposal(new_copy_index(d.config, h), d.config.block_size)
        want = _brute_class(h, 2, 3, (5, 9), d.config.block_size)
        assert got == want, h
        seen.add(got[1])
    assert seen == {0, 2, 3, 4, 5}  # every class occurs, so the comparison covers each
    # negative control: a class by match length alone differs from the brute force
    plain = _drafter(target, copy_head=True).config
    h = [1, 2, 0, 1, 2, 3, 1, 2, 0, 1, 2, 3, 1, 2]
    assert copy_proposal(new_copy_index(plain, h), 5)[1] == 3 != _brute_class(h, 2, 3, (5, 9), 5)[1]


def _random_heads(d: DSparkDrafter, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in [*d.copy_head.parameters(), d.copy_embed.weight]:
            p.copy_(torch.randn(p.shape, generator=g))


def test_warm_start_widens_the_classes_and_drafts_as_before(target, tmp_path):
    plain = _drafter(target, copy_head=True, copy_channel=True)
    _random_heads(plain, 5)
    plain.save_pretrained(tmp_path / "plain", include_embeddings=False)
    wide = _drafter(target, seed=9, copy_head=True, copy_channel=True, copy_extent_bounds=[5, 9])
    load_drafter_weights(wide, tmp_path / "plain", allow_missing_inputs=True)
    from dspark.training.features import target_features

    ids = torch.arange(3, 15) % 90
    feats, _ = target_features(target, ids, plain.config.target_layer_ids)
    conts = [[11, 12, 13, 14, 15], [40, 41], [7, 8, 9]]

    def draft(d, matches):
        d.finish_all()
        d.append_context([1, 2, 3], [feats] * 3)
        return d.draft([1, 2, 3], ids[-3:], 1.0, seed=4, copy_continuations=conts, copy_matches=matches)

    want = draft(plain, [3, 2, 3])
    got = draft(wide, [4, 2, 5])  # the extent classes of a 3-token match start as the 3-token class
    assert torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.conf_logit, want.conf_logit, atol=1e-6, rtol=1e-6)
    # negative control: the new classes are read (a change there moves the drafts' confidence)
    with torch.no_grad():
        wide.copy_head.conf_bias[:, :, 4:] += 1.0
    assert not torch.allclose(draft(wide, [4, 2, 5]).conf_logit, want.conf_logit)
    # a folder of other extent classes is not widened: its shape is named
    other = _drafter(target, copy_head=True, copy_channel=True, copy_extent_bounds=[7])
    other.save_pretrained(tmp_path / "other", include_embeddings=False)
    with pytest.raises(ValueError, match=r"copy_embed.weight' has shape \[5, 64\], expected \[6, 64\]"):
        load_drafter_weights(wide, tmp_path / "other", allow_missing_inputs=True)


def test_greedy_table_moves_greedy_rows_only(target):
    """``greedy_bias`` is added to the rows sampled at temperature 0 (a float or per row) and to no other."""
    d = _drafter(target, copy_head=True, copy_extent_bounds=[5], copy_greedy_bias=True)
    assert d.config.to_dict()["copy_greedy_bias"] is True
    assert d.copy_head.greedy_bias.shape == (d.config.block_size, d.config.num_copy_classes)
    from dspark.training.features import target_features

    ids = torch.arange(3, 15) % 90
    feats, _ = target_features(target, ids, d.config.target_layer_ids)
    conts = [[11, 12, 13, 14, 15], [40, 41, 42, 43, 44]]

    def draft(temperature):
        d.finish_all()
        d.append_context([1, 2], [feats] * 2)
        kw = dict(copy_continuations=conts, copy_matches=[4, 4])
        return d.draft([1, 2], ids[-2:], temperature, seed=4, **kw).tokens

    plain = {t: draft(t) for t in (0.0, 1.0)}
    assert not torch.equal(plain[0.0], torch.tensor(conts))  # the drafter alone does not copy
    with torch.no_grad():
        d.copy_head.greedy_bias.fill_(1e3)
    try:
        assert torch.equal(draft(0.0), torch.tensor(conts))  # greedy rows copy
        assert torch.equal(draft(1.0), plain[1.0])  # sampled rows are untouched
        mixed = draft(torch.tensor([0.0, 1.0]))  # per row
        assert mixed[0].tolist() == conts[0] and torch.equal(mixed[1], plain[1.0][1])
    finally:
        with torch.no_grad():
            d.copy_head.greedy_bias.zero_()
    with pytest.raises(ValueError, match="copy_greedy_bias needs the copy head"):
        DrafterConfig.from_dict({**_drafter(target).config.to_dict(), "copy_greedy_bias": True})
