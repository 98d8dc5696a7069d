# SPDX-License-Identifier: Apache-2.0
"""The copy head in training: the training logits equal the serving ones, the loss reads the bonus (on a
repetitive sequence a positive bonus lowers it, with a gradient on the bonus), and ``train_only`` trains the
named modules alone and leaves ``requires_grad`` as it found it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dspark.decoding.lookup import LookupConfig, LookupIndex, match_class
from dspark.training.features import FeatureCache, Sample, loss_mask_for, target_features
from dspark.training.objective import LossWeights, block_hidden, packed_block_loss, packed_copy_inputs
from dspark.training.trainer import TrainConfig, train, training_only
from tests.training.test_copy_channel import _drafter, _repetitive, frozen_target
from tests.training.test_trainer import _rows


@pytest.fixture(scope="module", name="target")
def _target():
    return frozen_target()


def _nonzero_head(d, seed: int = 3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in d.copy_head.parameters():
            p.copy_(torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("channel, bounds", [(False, ()), (True, ()), (True, (4, 6))])
def test_training_logits_equal_serving_logits(target, channel, bounds):
    d = _drafter(target, copy_head=True, copy_channel=channel, copy_extent_bounds=bounds)
    _nonzero_head(d)
    ids = _repetitive(48)
    feats, _ = target_features(target, ids, d.config.target_layer_ids)
    anchors = torch.tensor([0, 3, 11, 20, 29, 40, 47])
    copy = packed_copy_inputs(d.config, [ids], [anchors], d.device)
    h = block_hidden(d, feats, ids, anchors)
    U_train = d.copy_head.add_to_logits(F.linear(h, d.lm_head_weight), h, *copy)
    copied, classes = 0, set()
    lookup = LookupConfig(d.config.copy_min_match, d.config.copy_max_match, extent_bounds=bounds)
    for i, a in enumerate(anchors.tolist()):
        d.finish_all()
        d.append_context([50 + i], [feats[:a]])
        index = LookupIndex(lookup)
        index.extend(ids[: a + 1].tolist())
        cont = index.propose(d.config.block_size)
        copied += bool(cont)
        cls = match_class(lookup, index.match_length, index.match_extent) if cont else 0
        classes.add(cls)
        out = d.draft(
            [50 + i],
            ids[a : a + 1],
            copy_continuations=[cont],
            copy_matches=[cls],
            return_base_logits=True,
        )
        torch.testing.assert_close(U_train[i], out.base_logits[0], atol=5e-5, rtol=1e-5)
    d.finish_all()
    assert copied >= 3
    assert max(classes) > d.config.copy_max_match or not bounds  # an extent class was served
    # negative control: without the bonus the logits differ where there are copies
    assert not torch.allclose(U_train, F.linear(h, d.lm_head_weight))


def test_loss_reads_the_bonus_and_sends_it_a_gradient(target):
    d = _drafter(target, copy_head=True)
    ids = _repetitive(64)
    feats, last = target_features(target, ids, d.config.target_layer_ids)
    mask = loss_mask_for(4, ids.numel())
    anchors = torch.arange(8, 58, 3)
    seq = Sample(ids, mask, feats, last)
    w = LossWeights(ce=1.0, l1=0.0, conf=0.0)
    zero = packed_block_loss(d, [seq], [anchors], w)
    zero.loss.backward()
    grad = d.copy_head.logit_bias.grad.clone()
    assert grad.abs().sum() > 0
    # the tiny random target continues its own repeats: copying the history lowers the hard CE
    with torch.no_grad():
        d.copy_head.logit_bias.fill_(4.0)
    assert packed_block_loss(d, [seq], [anchors], w).ce < zero.ce


def test_train_only_trains_the_named_modules_alone(target, tmp_path):
    d = _drafter(target, copy_head=True)
    cache = FeatureCache.build(
        target, _rows(6), d.config.target_layer_ids, tmp_path / "feats", progress=False
    )
    before = {n: p.detach().clone() for n, p in d.named_parameters()}
    flags = {n: p.requires_grad for n, p in d.named_parameters()}
    cfg = TrainConfig(steps=3, batch_seqs=2, num_anchors=4, lr=1e-2, log_every=1, save_every=100)
    cfg.train_only = ["copy_head", "confidence_head"]
    train(d, cache, cfg, tmp_path / "run", progress=False)
    moved = {n for n, p in d.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved and all(n.split(".")[0] in cfg.train_only for n in moved), moved
    assert "copy_head.logit_bias" in moved
    assert {n: p.requires_grad for n, p in d.named_parameters()} == flags


def test_train_only_rejects_unknown_modules(target):
    d = _drafter(target)
    with pytest.raises(ValueError, match="train_only: \\['copy_head'\\] are not modules"):
        with training_only(d, ["copy_head"]):
            pass
    assert all(p.requires_grad for p in d.parameters())


def test_train_refuses_a_drafter_in_dflash_block_layout(target, tmp_path):
    d = _drafter(target)
    d.config.sample_from_anchor = False  # what a z-lab / SpecForge checkpoint loads as
    with pytest.raises(ValueError, match="sample_from_anchor=false"):
        train(d, None, TrainConfig(steps=1), tmp_path)  # refused before the cache is read
    assert not any(tmp_path.iterdir())
