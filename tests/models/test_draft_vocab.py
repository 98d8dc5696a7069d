# SPDX-License-Identifier: Apache-2.0
"""Draft vocabularies: file format and checks, choosing the ids, and drafting restricted to them.

The restricted draft is checked against an explicit loop written here from the definition: ``U`` over the draft
ids, ``z_k = U_k + B_k(x_{k-1})`` taken at those ids, Gumbel-max with the noise keyed by the position in the
draft vocabulary, tokens mapped back to full ids, and ``z`` expanded with ``outside_logit`` elsewhere.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from dspark import DSparkDrafter
from dspark.models.draft_vocab import (
    DRAFT_VOCAB_FILE,
    OUTSIDE_LOGIT,
    check_draft_vocab,
    count_tokens,
    coverage,
    expand_to_vocab,
    load_draft_vocab,
    outside_logit,
    save_draft_vocab,
    top_tokens,
)
from dspark.models.heads import gumbel_noise
from tests.models.drafter_fixtures import random_checkpoint, tiny_config

V = 64
VOCAB = [0, 1, 2, 5, 7, 11, 13, 20, 21, 22, 30, 40, 41, 50, 60, 63]  # the tiny configs' EOS (2) included


def _drafter(tmp_path, head_type="vanilla", rank=6, seed=3, name="c"):
    cfg = tiny_config(head_type, rank, block_size=5, vocab=V)
    random_checkpoint(tmp_path / name, cfg, seed=seed)
    return DSparkDrafter.from_pretrained(tmp_path / name)


def _restricted_reference(d, full_out, ids, anchors, temperature, seed, offset, request_ids):
    """Tokens, expanded z and prev_emb of a draft restricted to ``ids``, from the full draft's U and hidden."""
    U = full_out.base_logits[..., ids].float()  # [R, g, V']
    hidden = full_out.hidden
    R, g, Vd = U.shape
    t = torch.as_tensor(temperature, dtype=torch.float32).expand(R)
    noise = gumbel_noise(seed, offset, torch.as_tensor(request_ids), g, Vd)
    mh = d.markov_head
    prev = anchors.clone()
    state = None if mh is None else mh.init_state(R, hidden)
    tokens, zs, embs = [], [], []
    for k in range(g):
        z = U[:, k]
        if mh is not None:
            e = mh.markov_w1.weight[prev]
            b, state = mh.step_bias(e, hidden[:, k], state)
            z = z + b.float()[:, ids]
            embs.append(e)
        scores = torch.where((t > 0)[:, None], z / t.clamp_min(1e-30)[:, None] + noise[:, k], z)
        prev = torch.as_tensor(ids)[scores.argmax(-1)]
        tokens.append(prev)
        zs.append(z)
    z = torch.full((R, g, V), OUTSIDE_LOGIT)
    z[..., ids] = torch.stack(zs, 1)
    emb = torch.stack(embs, 1) if embs else None
    return torch.stack(tokens, 1), z, emb


# ---- the file and the checks ------------------------------------------------------------------------------------
def test_check_draft_vocab_sorts_and_rejects_bad_ids():
    assert check_draft_vocab([5, 1, 3], V).tolist() == [1, 3, 5]
    with pytest.raises(ValueError, match="non-empty"):
        check_draft_vocab([], V)
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        check_draft_vocab([1, 64], V)
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        check_draft_vocab([-1, 3], V)
    with pytest.raises(ValueError, match="distinct"):
        check_draft_vocab([3, 1, 3], V)
    with pytest.raises(ValueError, match="integer"):
        check_draft_vocab(torch.tensor([1.0, 2.0]), V)
    with pytest.raises(ValueError, match="1-D"):
        check_draft_vocab(torch.ones(2, 2, dtype=torch.int64), V)


def test_save_then_load_round_trips_and_keeps_metadata(tmp_path):
    path = save_draft_vocab(tmp_path, torch.tensor(VOCAB), {"size": len(VOCAB), "note": "x"})
    assert path.name == DRAFT_VOCAB_FILE
    assert load_draft_vocab(tmp_path, V).tolist() == VOCAB
    assert load_draft_vocab(path, V).tolist() == VOCAB
    assert json.loads(path.read_text())["note"] == "x"


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=DRAFT_VOCAB_FILE):
        load_draft_vocab(tmp_path, V)


@pytest.mark.parametrize(
    "body,match",
    [
        ("{not json", "not readable JSON"),
        ('{"ids": [1]}', '"token_ids" list'),
        ("[1, 2]", '"token_ids" list'),
        ('{"token_ids": [1, 2.5]}', "integers"),
        ('{"token_ids": [1, true]}', "integers"),
        ('{"token_ids": [1, 99]}', r"\[0, 64\)"),
        ('{"token_ids": [4, 4]}', "distinct"),
    ],
)
def test_malformed_files_name_the_file_and_the_problem(tmp_path, body, match):
    (tmp_path / DRAFT_VOCAB_FILE).write_text(body)
    with pytest.raises(ValueError, match=match) as e:
        load_draft_vocab(tmp_path, V)
    assert DRAFT_VOCAB_FILE in str(e.value)


def test_top_tokens_counts_forces_and_breaks_ties_by_id():
    lists = [[3, 3, 3, 9, 9, 4], [4, 9, 7, 7, 7, 7], [1]]
    counts = count_tokens(lists, 12)
    expected = Counter(t for ids in lists for t in ids)
    assert counts.tolist() == [expected.get(i, 0) for i in range(12)]
    assert count_tokens([[11, 12, -1, 40]], 12).tolist() == [0] * 11 + [1]  # out-of-range ids not counted
    # 7:4, 3:3, 9:3, 4:2, 1:1; ties (3 and 9) keep the lower id first
    assert top_tokens(counts, 2).tolist() == [3, 7]
    assert top_tokens(counts, 3).tolist() == [3, 7, 9]
    assert top_tokens(counts, 3, always=[11]).tolist() == [3, 7, 11]
    assert coverage(torch.tensor([3, 7]), counts) == pytest.approx(7 / 13)
    with pytest.raises(ValueError, match="size"):
        top_tokens(counts, 0)
    with pytest.raises(ValueError, match="forced"):
        top_tokens(counts, 1, always=[1, 2])
    with pytest.raises(ValueError, match=r"\[0, 12\)"):
        top_tokens(counts, 3, always=[12])


def test_expand_to_vocab_fills_outside_with_a_logit_softmax_zeroes():
    ids = torch.tensor([1, 4])
    out = expand_to_vocab(torch.tensor([[0.5, -2.0]]), ids, 6)
    assert out[0, 1] == 0.5 and out[0, 4] == -2.0
    assert torch.softmax(out, -1)[0, [0, 2, 3, 5]].eq(0).all()
    assert torch.isfinite(out).all()
    half = expand_to_vocab(torch.tensor([[0.5, -2.0]], dtype=torch.float16), ids, 6)
    assert torch.isfinite(half).all() and half[0, 0] == outside_logit(torch.float16)


# ---- drafting restricted to a draft vocabulary --------------------------------------------------------------
@pytest.mark.parametrize("head_type,rank", [("vanilla", 6), ("gated", 6), ("rnn", 6), ("vanilla", 0)])
@pytest.mark.parametrize("temperature", [0.0, 1.0, [0.0, 0.7, 1.3]])
def test_restricted_draft_equals_the_definition(tmp_path, head_type, rank, temperature):
    full = _drafter(tmp_path, head_type, rank)
    sub = _drafter(tmp_path, head_type, rank)
    sub.set_draft_vocab(VOCAB)
    gen = torch.Generator().manual_seed(1)
    ids = [3, 8, 5]
    feats = [torch.randn(n, 96, generator=gen) for n in (4, 0, 9)]
    full.append_context(ids, feats)
    sub.append_context(ids, feats)
    # anchors outside the draft vocabulary too (3, 17): the first slot's W1 row is the anchor's
    anchors = torch.tensor([3, 17, 40])
    temp = torch.tensor(temperature) if isinstance(temperature, list) else temperature
    for offset in range(3):
        ref_out = full.draft(ids, anchors, temp, seed=7, offset=offset, return_base_logits=True)
        out = sub.draft(ids, anchors, temp, seed=7, offset=offset, return_base_logits=True)
        tokens, z, emb = _restricted_reference(full, ref_out, VOCAB, anchors, temp, 7, offset, ids)
        assert torch.equal(out.tokens, tokens)
        assert set(out.tokens.flatten().tolist()) <= set(VOCAB)
        torch.testing.assert_close(out.draft_logits, z, rtol=1e-5, atol=1e-5)
        assert out.draft_logits.shape == (3, 5, V)
        torch.testing.assert_close(out.hidden, ref_out.hidden, rtol=0, atol=0)
        if emb is not None:
            torch.testing.assert_close(out.prev_emb, emb, rtol=0, atol=0)
        outside = torch.ones(V, dtype=torch.bool)
        outside[VOCAB] = False
        assert torch.softmax(out.draft_logits, -1)[..., outside].eq(0).all()  # q is 0 off the draft ids
        assert out.base_logits[..., outside].eq(OUTSIDE_LOGIT).all()
        anchors = out.tokens[:, -1]


@pytest.mark.parametrize("restricted", [True, False])
def test_sample_can_leave_q_over_the_draft_vocabulary(tmp_path, restricted):
    # the decoder widens q only where a round reads it: narrow + widened later must be the whole-vocabulary q
    d = _drafter(tmp_path)
    if restricted:
        d.set_draft_vocab(VOCAB)
    d.append_context([0, 1], [torch.randn(5, 96), torch.randn(2, 96)])
    proposal = d.propose([0, 1], torch.tensor([9, 40]))
    wide = d.sample(proposal, 1.0, seed=4, offset=2)
    narrow = d.sample(proposal, 1.0, seed=4, offset=2, whole_vocab=False)
    assert wide.logits.shape == (2, 5, V)
    assert narrow.logits.shape == (2, 5, len(VOCAB) if restricted else V)
    assert torch.equal(narrow.tokens, wide.tokens)
    torch.testing.assert_close(d.whole_vocab_logits(narrow.logits), wide.logits, rtol=0, atol=0)


def test_batch_size_changes_and_weight_updates_are_picked_up(tmp_path):
    full, sub = _drafter(tmp_path), _drafter(tmp_path)
    sub.set_draft_vocab(VOCAB)
    gen = torch.Generator().manual_seed(2)
    rids = list(range(9))
    feats = [torch.randn(3, 96, generator=gen) for _ in rids]
    full.append_context(rids, feats)
    sub.append_context(rids, feats)
    for step, n in enumerate([1, 9, 2, 6]):  # the spare anchor rows grow past their first capacity (8)
        if step == 2:  # an in-place update (as an optimizer makes) must reach the gathered tables
            for d in (full, sub):
                with torch.no_grad():
                    d.markov_head.markov_w2.weight.mul_(3.0)
        anchors = torch.randint(0, V, (n,), generator=gen)
        ref_out = full.draft(rids[:n], anchors, 1.0, seed=3, offset=step, return_base_logits=True)
        out = sub.draft(rids[:n], anchors, 1.0, seed=3, offset=step)
        tokens, z, _ = _restricted_reference(full, ref_out, VOCAB, anchors, 1.0, 3, step, rids[:n])
        assert torch.equal(out.tokens, tokens)
        torch.testing.assert_close(out.draft_logits, z, rtol=1e-5, atol=1e-5)


def test_num_positions_and_the_whole_vocabulary_again(tmp_path):
    d = _drafter(tmp_path)
    d.append_context([0], [torch.randn(5, 96)])
    before = d.draft([0], torch.tensor([9]), 1.0, seed=1)
    d.set_draft_vocab(VOCAB)
    short = d.draft([0], torch.tensor([9]), 1.0, seed=1, num_positions=2)
    full_restricted = d.draft([0], torch.tensor([9]), 1.0, seed=1)
    assert torch.equal(short.tokens, full_restricted.tokens[:, :2])
    d.set_draft_vocab(None)
    after = d.draft([0], torch.tensor([9]), 1.0, seed=1)
    assert d.draft_vocab is None
    assert torch.equal(before.tokens, after.tokens)
    torch.testing.assert_close(before.draft_logits, after.draft_logits, rtol=0, atol=0)


def test_checkpoints_carry_the_draft_vocabulary(tmp_path):
    d = _drafter(tmp_path)
    d.set_draft_vocab(VOCAB)
    d.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / DRAFT_VOCAB_FILE).is_file()

    def loaded(**kw):
        ids = DSparkDrafter.from_pretrained(tmp_path / "saved", **kw).draft_vocab
        return None if ids is None else ids.tolist()

    assert loaded() == VOCAB
    assert loaded(draft_vocab=False) is None
    assert loaded(draft_vocab=[4, 2]) == [2, 4]
    assert loaded(draft_vocab=save_draft_vocab(tmp_path / "elsewhere", torch.tensor([1, 2, 3]))) == [1, 2, 3]
    d.set_draft_vocab(None)
    d.save_pretrained(tmp_path / "saved")  # saving without one removes the stale file
    assert not (tmp_path / "saved" / DRAFT_VOCAB_FILE).exists()
    (tmp_path / "saved" / DRAFT_VOCAB_FILE).write_text('{"token_ids": [70]}')
    with pytest.raises(ValueError, match="draft vocabulary"):
        DSparkDrafter.from_pretrained(tmp_path / "saved")
    with pytest.raises(ValueError, match="distinct"):
        d.set_draft_vocab([1, 1])


def test_reserved_spare_rows_keep_the_markov_tables_in_place():
    """``reserve`` sizes the tables ``markov_inputs`` returns once (a CUDA graph of a draw holds their
    addresses); a batch past the reserve reallocates them, and ``buffers_key`` says so."""
    from dspark.models.draft_vocab import DraftVocabTables

    g = torch.Generator().manual_seed(0)
    ids = torch.tensor(VOCAB)
    w1, w2, lm = (
        torch.randn(V, 4, generator=g),
        torch.randn(V, 4, generator=g),
        torch.randn(V, 8, generator=g),
    )
    tables = DraftVocabTables(ids, lm, w1, w2)
    tables.reserve(16)
    key = tables.buffers_key
    for R in (1, 5, 16):
        u, a, t1, t2 = tables.markov_inputs(torch.randn(R, 3, len(VOCAB)), torch.arange(R), w1, w2)
        assert tables.buffers_key == key and t1.shape == (len(VOCAB) + R, 4)
        assert torch.equal(t1[len(VOCAB) :], w1[:R]) and a.tolist() == list(range(len(VOCAB), len(VOCAB) + R))
    tables.markov_inputs(torch.randn(17, 3, len(VOCAB)), torch.arange(17), w1, w2)
    assert tables.buffers_key != key  # grown: a graph of the old tables must be dropped
