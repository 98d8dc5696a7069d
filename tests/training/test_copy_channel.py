# SPDX-License-Identifier: Apache-2.0
"""The drafter v2 inputs (copy channel, context projection, learned MASK, tap norm): training forward equals
serving forward, the copy continuation is the longest recent match, a warm start computes what the DeepSpec
drafter did, and checkpoints keep the flags."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.decoding.lookup import LookupConfig, LookupIndex
from dspark.models.block_inputs import init_input_modules
from dspark.models.drafter import DSparkDrafter
from dspark.training.copy_inputs import anchor_continuations
from dspark.training.features import target_features
from dspark.training.objective import block_hidden
from tests.decoding.toy_models import tiny_target

V2 = dict(copy_channel=True, context_projection=True, learned_mask=True, tap_norm=True)


def _drafter(t, seed: int = 1, **inputs) -> DSparkDrafter:
    torch.manual_seed(seed)
    L = t.config.num_hidden_layers
    return DSparkDrafter.from_config(
        t,
        block_size=5,
        num_layers=1,
        target_layer_ids=[0, L - 2],
        markov_rank=8,
        initializer_range=0.2,
        **inputs,
    ).eval()


def _perturb_inputs(d: DSparkDrafter, seed: int = 7) -> None:
    """Non-neutral v2 weights, so that each input actually changes the hidden states."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in ("copy_proj", "copy_embed", "context_proj"):
            w = getattr(d, name).weight
            w.copy_(0.3 * torch.randn(w.shape, generator=g))
        d.mask_embed.copy_(torch.randn(d.mask_embed.shape, generator=g))
        d.tap_norm.weight.copy_(1 + 0.5 * torch.randn(d.tap_norm.weight.shape, generator=g))


def frozen_target():
    """The tiny target of the copy tests, its parameters frozen."""
    t = tiny_target("llama", vocab=96, layers=4)
    for p in t.parameters():
        p.requires_grad_(False)
    return t


@pytest.fixture(scope="module")
def target():
    return frozen_target()


def _repetitive(n: int, seed: int = 0) -> torch.Tensor:
    """A sequence that repeats its own phrases, so that most anchors have a lookup match."""
    g = torch.Generator().manual_seed(seed)
    phrases = [torch.randint(0, 90, (int(k),), generator=g) for k in torch.randint(3, 7, (5,), generator=g)]
    out = []
    while sum(len(p) for p in out) < n:
        out.append(phrases[int(torch.randint(0, 5, (1,), generator=g))])
    return torch.cat(out)[:n]


def _serve(d, feats, ids, a: int, rid: int):
    d.finish_all()
    d.append_context([rid], [feats[:a]])
    index = LookupIndex(LookupConfig(d.config.copy_min_match, d.config.copy_max_match))
    index.extend(ids[: a + 1].tolist())
    cont = index.propose(d.config.block_size)
    return d.draft(
        [rid],
        ids[a : a + 1],
        copy_continuations=[cont],
        copy_matches=[index.match_length if cont else 0],
    ), cont


def test_v2_training_forward_equals_serving_forward(target):
    d = _drafter(target, **V2)
    _perturb_inputs(d)
    ids = _repetitive(48)
    feats, _ = target_features(target, ids, d.config.target_layer_ids)
    anchors = torch.tensor([0, 3, 11, 20, 29, 40, 47])
    h_train = block_hidden(d, feats, ids, anchors)
    copied = 0
    for i, a in enumerate(anchors.tolist()):
        out, cont = _serve(d, feats, ids, a, 100 + i)
        copied += bool(cont)
        torch.testing.assert_close(h_train[i], out.hidden[0], atol=2e-5, rtol=1e-5)
    d.finish_all()
    assert copied >= 3  # the comparison covered blocks with copied tokens


def test_copy_inputs_change_the_block(target):
    """Negative control for the equality above: the copy channel is read (a block drafted without its
    continuation differs), so the equality is not between two forwards that ignore it."""
    d = _drafter(target, **V2)
    _perturb_inputs(d)
    ids = _repetitive(48)
    feats, _ = target_features(target, ids, d.config.target_layer_ids)
    a = 40
    out, cont = _serve(d, feats, ids, a, 1)
    assert cont
    d.finish_all()
    d.append_context([2], [feats[:a]])
    blind = d.draft([2], ids[a : a + 1], copy_continuations=[[]], copy_matches=[0])
    d.finish_all()
    assert (out.hidden - blind.hidden).abs().max() > 1e-3


def _brute_force(history: list[int], lo: int, hi: int, k: int) -> list[int]:
    L = len(history)
    for n in range(hi, lo - 1, -1):
        if L < n + 1:
            continue
        suffix = history[L - n :]
        for e in range(L - 1, n - 1, -1):  # most recent earlier occurrence, ending before the history does
            if history[e - n : e] == suffix:
                return history[e : min(e + k, L)]
    return []


def test_anchor_continuations_are_the_longest_recent_match(target):
    d = _drafter(target, copy_channel=True)
    for seed in range(6):
        ids = _repetitive(60, seed=seed)
        anchors = torch.arange(0, 60, 3)
        conts, matches = anchor_continuations(ids, anchors, d.config)
        for a, cont, m in zip(anchors.tolist(), conts, matches, strict=True):
            want = _brute_force(ids[: a + 1].tolist(), 2, 3, d.config.block_size)
            assert cont == want
            assert (m > 0) == bool(cont)


def test_neutral_v2_inputs_compute_the_deepspec_drafter(target):
    """A v2 drafter whose new inputs start neutral (copy_proj at zero) and that has a DeepSpec drafter's weights
    drafts exactly what that drafter does: the warm start of ``dspark train fit --init-from``."""
    plain = _drafter(target)
    v2 = _drafter(target, copy_channel=True, context_projection=True, learned_mask=True)
    own = v2.state_dict()
    own.update(plain.state_dict())
    v2.load_state_dict(own)
    init_input_modules(v2, target.get_input_embeddings().weight, copy_identity=False)
    ids = _repetitive(40)
    feats, _ = target_features(target, ids, plain.config.target_layer_ids)
    anchors = torch.tensor([5, 22, 39])
    torch.testing.assert_close(
        block_hidden(v2, feats, ids, anchors), block_hidden(plain, feats, ids, anchors)
    )
    with torch.no_grad():
        v2.copy_proj.weight.fill_(0.1)
    assert (
        block_hidden(v2, feats, ids, anchors) - block_hidden(plain, feats, ids, anchors)
    ).abs().max() > 1e-4


def test_v2_checkpoint_round_trip_and_deepspec_config_unchanged(target, tmp_path):
    d = _drafter(target, **V2)
    _perturb_inputs(d)
    d.save_pretrained(tmp_path / "v2")
    cfg = json.loads((tmp_path / "v2" / "config.json").read_text())
    assert cfg["copy_channel"] and cfg["context_projection"] and cfg["learned_mask"] and cfg["tap_norm"]
    back = DSparkDrafter.from_pretrained(tmp_path / "v2", target)
    for k, v in d.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    _drafter(target).save_pretrained(tmp_path / "plain")
    plain = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert not {"copy_channel", "context_projection", "learned_mask", "tap_norm"} & set(plain)


def test_copy_drafter_needs_its_continuations(target):
    d = _drafter(target, copy_channel=True)
    d.append_context([1], [torch.zeros(3, d.config.num_taps * d.config.hidden_size)])
    with pytest.raises(ValueError, match="copy_continuations"):
        d.draft([1], torch.tensor([4]))
    with pytest.raises(ValueError, match="expected 1 entries"):
        d.draft([1], torch.tensor([4]), copy_continuations=[[], []], copy_matches=[0, 0])
    d.finish_all()


def test_init_from_a_deepspec_drafter_starts_the_v2_inputs_neutral(target, tmp_path):
    from dspark.training.trainer import load_drafter_weights

    plain = _drafter(target)
    plain.save_pretrained(tmp_path / "plain", include_embeddings=False)
    v2 = _drafter(target, seed=5, copy_channel=True, context_projection=True, learned_mask=True)
    load_drafter_weights(v2, tmp_path / "plain", "--init-from", allow_missing_inputs=True)
    ids = _repetitive(40)
    feats, _ = target_features(target, ids, plain.config.target_layer_ids)
    anchors = torch.tensor([5, 22, 39])
    torch.testing.assert_close(
        block_hidden(v2, feats, ids, anchors), block_hidden(plain, feats, ids, anchors)
    )
    with pytest.raises(ValueError, match="context_proj"):  # not allowed unless asked
        load_drafter_weights(_drafter(target, context_projection=True), tmp_path / "plain")
    with pytest.raises(ValueError, match="tap_norm"):  # cannot start neutral: never filled in
        load_drafter_weights(_drafter(target, tap_norm=True), tmp_path / "plain", allow_missing_inputs=True)


def test_sharded_save_reloads_bit_identically(target, tmp_path):
    d = _drafter(target, **V2)
    _perturb_inputs(d)
    d.save_pretrained(tmp_path / "one")
    d.save_pretrained(tmp_path / "sharded", max_shard_bytes=40_000)
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and not (tmp_path / "sharded" / "model.safetensors").exists()
    assert all((tmp_path / "sharded" / s).stat().st_size < 40_000 + 2_000 for s in shards[:-1])
    a = DSparkDrafter.from_pretrained(tmp_path / "one", target).state_dict()
    b = DSparkDrafter.from_pretrained(tmp_path / "sharded", target).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    d.save_pretrained(tmp_path / "sharded")  # a later unsharded save leaves no stale shard or index behind
    assert (
        not list((tmp_path / "sharded").glob("model-*"))
        and not (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    )
