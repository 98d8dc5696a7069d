# SPDX-License-Identifier: Apache-2.0
"""The copy head (``dspark.models.copy_head``) in serving: fresh it drafts what the drafter without it drafts;
trained it adds its bonus at each slot's copied token only (over the whole or a draft vocabulary) and its
confidence term by slot, whether the draft before it followed the copy, and match length — never reading the
slot's own draft; checkpoints round-trip; missing inputs fail clearly."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.models.drafter import DSparkDrafter
from tests.training.test_copy_channel import _drafter, frozen_target

G = 5  # the block size of test_copy_channel._drafter


@pytest.fixture(scope="module", name="target")
def _target():
    return frozen_target()


@pytest.fixture(scope="module")
def pair(target):
    """A plain drafter and the same weights with a (fresh) copy head."""
    plain = _drafter(target)
    head = _drafter(target, copy_head=True)
    missing = head.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["copy_head.conf_bias", "copy_head.logit_bias", "copy_head.logit_gate"]
    return plain, head


def _context(d, target, n: int = 12, rids=(7, 8)):
    from dspark.training.features import target_features

    d.finish_all()
    ids = torch.arange(3, 3 + n) % 90
    feats, _ = target_features(target, ids, d.config.target_layer_ids)
    d.append_context(list(rids), [feats, feats[: n - 4]])
    return torch.tensor([int(ids[-1]), int(ids[n - 5])])


# the continuations of two requests: a full copy, a short one (slots 2.. have none) and their match lengths
CONTS, MATCHES = [[11, 12, 13, 14, 15, 16], [40, 41]], [3, 2]


def _draft(d, anchors, temperature=0.0, **kw):
    return d.draft(
        [7, 8],
        anchors,
        temperature,
        seed=3,
        copy_continuations=CONTS,
        copy_matches=MATCHES,
        return_base_logits=True,
        **kw,
    )


def test_fresh_copy_head_drafts_what_the_plain_drafter_drafts(target, pair):
    plain, head = pair
    anchors = _context(plain, target)
    want = plain.draft([7, 8], anchors, 1.0, seed=3, return_base_logits=True)
    _context(head, target)
    got = _draft(head, anchors, 1.0)
    assert torch.equal(got.tokens, want.tokens)
    assert torch.equal(got.base_logits, want.base_logits)
    torch.testing.assert_close(got.survival, want.survival, atol=1e-6, rtol=1e-6)


def test_bonus_lands_at_the_copied_token_only(target, pair):
    plain, head = pair
    with torch.no_grad():
        head.copy_head.logit_bias.copy_(torch.arange(G * 4, dtype=torch.float32).view(G, 4) / 4 + 1)
        head.copy_head.logit_gate.normal_(generator=torch.Generator().manual_seed(0))
    try:
        anchors = _context(head, target)
        out = _draft(head, anchors)
        _context(plain, target)
        base = plain.draft([7, 8], anchors, 0.0, seed=3, return_base_logits=True).base_logits
        want = base.clone()
        for r, (cont, n) in enumerate(zip(CONTS, MATCHES, strict=True)):
            for j, tok in enumerate(cont[:G]):  # written out: bias[j, n] + h_j · gate / √H at the copy only
                gate = out.hidden[r, j].float() @ head.copy_head.logit_gate / out.hidden.shape[-1] ** 0.5
                bonus = head.copy_head.logit_bias[j, n] + gate
                want[r, j, tok] += bonus
        torch.testing.assert_close(out.base_logits, want, atol=1e-5, rtol=1e-5)
        diff = (out.base_logits - base).ne(0)
        assert int(diff.sum()) == sum(min(len(c), G) for c in CONTS)  # nothing else moved
    finally:
        with torch.no_grad():
            head.copy_head.logit_bias.zero_()
            head.copy_head.logit_gate.zero_()


def test_a_large_bonus_drafts_the_copy(target, pair):
    _, head = pair
    with torch.no_grad():
        head.copy_head.logit_bias.fill_(1e3)
    try:
        out = _draft(head, _context(head, target))
        assert out.tokens[0].tolist() == CONTS[0][:G]
        assert out.tokens[1, :2].tolist() == CONTS[1]
    finally:
        with torch.no_grad():
            head.copy_head.logit_bias.zero_()


def test_draft_vocabulary_maps_the_copy_and_skips_ids_outside(target):
    d = _drafter(target, copy_head=True)
    inside = [i for i in range(96) if i % 3 != 1]  # 13, 16 and 40 are outside
    d.set_draft_vocab(inside)
    with torch.no_grad():
        d.copy_head.logit_bias.fill_(1e3)
    out = _draft(d, _context(d, target))
    for r, cont in enumerate(CONTS):
        for j, tok in enumerate(cont[:G]):
            if tok in inside:
                assert int(out.tokens[r, j]) == tok
            else:
                assert int(out.tokens[r, j]) != tok and int(out.tokens[r, j]) in inside


def test_confidence_term_by_slot_follows_and_match(target, pair):
    plain, head = pair
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        head.copy_head.conf_bias.copy_(torch.randn(head.copy_head.conf_bias.shape, generator=gen))
    try:
        anchors = _context(head, target)
        out = _draft(head, anchors)
        _context(plain, target)
        base = plain.draft([7, 8], anchors, 0.0, seed=3)
        assert torch.equal(out.tokens, base.tokens)  # the confidence term does not touch the drafts
        want = base.conf_logit.clone()
        for r, (cont, n) in enumerate(zip(CONTS, MATCHES, strict=True)):
            for j in range(min(len(cont), G)):  # follows: the draft before slot j is the copy's (slot 0: yes)
                follows = j == 0 or int(out.tokens[r, j - 1]) == cont[j - 1]
                want[r, j] += head.copy_head.conf_bias[j, int(follows), n]
        torch.testing.assert_close(out.conf_logit, want, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out.conf_logit, base.conf_logit)
        torch.testing.assert_close(
            out.survival, torch.sigmoid(out.conf_logit).cumprod(1), atol=1e-6, rtol=1e-5
        )
    finally:
        with torch.no_grad():
            head.copy_head.conf_bias.zero_()


def test_copy_head_needs_its_inputs(target, pair):
    _, head = pair
    anchors = _context(head, target)
    with pytest.raises(ValueError, match="copy_continuations / copy_matches"):
        head.draft([7, 8], anchors)
    p = head.propose([7, 8], anchors, copy_continuations=CONTS, copy_matches=MATCHES)
    s = head.sample(p, 0.0, 0, 0)
    with pytest.raises(ValueError, match="prev_tokens / copy"):
        head.score(p.hidden, s.prev_emb)


def test_copy_head_checkpoint_round_trip(target, tmp_path, pair):
    _, head = pair
    with torch.no_grad():
        head.copy_head.logit_bias.normal_(generator=torch.Generator().manual_seed(2))
    try:
        head.to(torch.bfloat16)
        assert head.copy_head.logit_bias.dtype == torch.float32  # kept in fp32 like the confidence head
        head.save_pretrained(tmp_path / "d", include_embeddings=False)
        cfg = json.loads((tmp_path / "d" / "config.json").read_text())
        assert cfg["copy_head"] is True and "copy_channel" not in cfg
        back = DSparkDrafter.from_pretrained(tmp_path / "d", target=target)
        assert back.config.copy_head and back.config.uses_copies
        for name, t in head.state_dict().items():
            if name.startswith("copy_head."):
                assert torch.equal(back.state_dict()[name], t), name
        # loaded as bf16, the head stays float32 and drafts
        bf16 = DSparkDrafter.from_pretrained(tmp_path / "d", target=target, dtype=torch.bfloat16)
        assert bf16.dtype == torch.bfloat16 and bf16.copy_head.logit_bias.dtype == torch.float32
        out = _draft(bf16, _context(bf16, target))
        assert out.tokens.shape == (2, G) and torch.isfinite(out.survival).all()
    finally:
        head.float()
        with torch.no_grad():
            head.copy_head.logit_bias.zero_()


def test_confidence_of_a_slot_never_reads_its_own_draft(target, pair):
    """Changing the token drafted at slot j changes the confidence of slot j + 1 only (negative control:
    the later slot does move, so the term is read)."""
    _, head = pair
    with torch.no_grad():
        head.copy_head.conf_bias.normal_(generator=torch.Generator().manual_seed(4))
    try:
        anchors = _context(head, target)
        p = head.propose([7, 8], anchors, copy_continuations=CONTS, copy_matches=MATCHES)
        s = head.sample(p, 0.0, 0, 0)
        tokens = s.tokens.clone()
        tokens[0] = torch.tensor(CONTS[0][:G])  # request 0 follows its copy at every slot
        from dspark.models.drafting import previous_tokens

        a = head.score(p.hidden, s.prev_emb, prev_tokens=previous_tokens(p.anchors, tokens), copy=p.copy)[0]
        tokens[0, 2] = (CONTS[0][2] + 1) % 96  # slot 2 leaves the copy
        b = head.score(p.hidden, s.prev_emb, prev_tokens=previous_tokens(p.anchors, tokens), copy=p.copy)[0]
        assert torch.equal(a[0, :3], b[0, :3])  # slots 0..2 do not see x_2
        assert not torch.equal(a[0, 3], b[0, 3])  # slot 3 does
    finally:
        with torch.no_grad():
            head.copy_head.conf_bias.zero_()
