# SPDX-License-Identifier: Apache-2.0
"""Round observer and uncensored label collection on a tiny random Llama target and a random drafter."""

import copy

import pytest
import torch

from dspark import DSparkDecoder
from dspark.calibration import (
    CalibrationData,
    accept_prob_labels,
    collect_calibration_data,
    greedy_match_labels,
)
from dspark.decoding.decoder import RoundRecord
from tests.decoding.toy_models import random_drafter, tiny_target

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]


def decoder(**kw):
    target = tiny_target("llama", seed=0)
    return DSparkDecoder(target, random_drafter(target, block_size=4), max_batch_size=3, **kw)


def clone(rec: RoundRecord) -> RoundRecord:
    return RoundRecord(
        list(rec.request_ids),
        rec.conf_logit.clone(),
        rec.draft_tokens.clone(),
        rec.draft_logits.clone(),
        rec.target_logits.clone(),
        list(rec.qo_indptr),
        rec.verify_len.clone(),
        rec.accepted.clone(),
        rec.temperature,
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_observer_sees_consistent_shapes_and_leaves_output_unchanged(temperature):
    dec = decoder()
    try:
        kw = dict(max_new_tokens=12, temperature=temperature, eos_token_id=[], seed=3)
        want = dec.generate(PROMPTS, **kw)
        records: list[RoundRecord] = []
        dec.round_observer = records.append
        got = dec.generate(PROMPTS, **kw)
    finally:
        dec.close()
    assert got.sequences == want.sequences
    assert len(records) == got.stats.rounds > 0
    V, g = 96, dec.gamma
    seen = set()
    for rec in records:
        R = len(rec.request_ids)
        assert 1 <= R <= 3
        seen.update(rec.request_ids)
        assert rec.conf_logit.shape == (R, g) and rec.conf_logit.dtype == torch.float32
        assert rec.draft_tokens.shape == (R, g) and rec.draft_tokens.dtype == torch.int64
        assert rec.draft_logits.shape == (R, g, V)
        assert len(rec.qo_indptr) == R + 1 and rec.qo_indptr[0] == 0
        assert rec.target_logits.shape == (rec.qo_indptr[-1], V)
        lens = [b - a for a, b in zip(rec.qo_indptr, rec.qo_indptr[1:], strict=False)]
        assert rec.verify_len.tolist() == lens
        assert all(1 <= n <= g + 1 for n in lens)
        assert all(0 <= a <= n - 1 for a, n in zip(rec.accepted.tolist(), lens, strict=True))
        assert rec.temperature == temperature
    assert seen == set(range(len(PROMPTS)))


def test_accept_prob_labels_equal_a_direct_computation_from_the_recorded_logits():
    dec = decoder()
    records: list[RoundRecord] = []
    dec.round_observer = lambda r: records.append(clone(r))  # chained by the collector
    planner = dec.planner
    try:
        data = collect_calibration_data(dec, PROMPTS, max_new_tokens=10, temperature=0.8, seed=1)
    finally:
        dec.close()
    assert dec.planner is planner and dec.round_observer is not None  # both restored
    assert data.label == "prob" and data.temperature == 0.8
    assert data.num_samples == sum(len(r.request_ids) for r in records)
    g = dec.gamma
    n = 0
    for rec in records:
        assert rec.verify_len.tolist() == [g + 1] * len(rec.request_ids)  # planner 'full' during collection
        for i, rid in enumerate(rec.request_ids):
            rows = rec.target_logits[rec.qo_indptr[i] : rec.qo_indptr[i] + g].double()
            p = torch.softmax(rows / 0.8, -1)
            q = torch.softmax(rec.draft_logits[i].double() / 0.8, -1)
            want = torch.tensor(
                [sum(min(a, b) for a, b in zip(p[k].tolist(), q[k].tolist(), strict=True)) for k in range(g)],
                dtype=torch.float64,
            )
            torch.testing.assert_close(data.accept_prob[n].double(), want, atol=1e-6, rtol=0)
            want_greedy = (rows.argmax(-1) == rec.draft_tokens[i]).float()
            torch.testing.assert_close(data.greedy_match[n], want_greedy)
            torch.testing.assert_close(data.conf_logit[n], rec.conf_logit[i])
            assert int(data.accepted[n]) == int(rec.accepted[i])
            assert int(data.request_ids[n]) == rid
            n += 1
    # the tiny random models disagree often enough for both outcomes to appear
    assert 0.0 < float(data.accept_prob.mean()) < 1.0
    assert data.cumulative_labels().shape == (data.num_samples, g)
    assert torch.all(data.cumulative_labels()[:, 1:] <= data.cumulative_labels()[:, :-1] + 1e-7)


def test_greedy_collection_labels_are_the_realised_prefix():
    dec = decoder()
    try:
        data = collect_calibration_data(dec, PROMPTS, max_new_tokens=10, temperature=0.0, label="prob")
    finally:
        dec.close()
    assert data.label == "greedy"  # forced at temperature 0
    assert torch.equal(data.accept_prob, data.greedy_match)
    # greedy verification accepts exactly the leading argmax matches
    assert torch.equal(data.cumulative_labels().sum(1).long(), data.accepted)
    assert torch.equal(data.binary_outcome(), data.accept_events())


def test_save_and_load_round_trip(tmp_path):
    g = torch.Generator().manual_seed(0)
    data = CalibrationData(
        conf_logit=torch.randn(5, 3, generator=g),
        accept_prob=torch.rand(5, 3, generator=g),
        greedy_match=(torch.rand(5, 3, generator=g) > 0.5).float(),
        accepted=torch.tensor([0, 3, 1, 2, 3]),
        request_ids=torch.tensor([0, 1, 0, 1, 2]),
        label="greedy",
        temperature=0.7,
        meta={"dataset": "x.jsonl"},
    )
    for name in ("d.pt", "d.npz"):
        data.save(tmp_path / name)
        back = CalibrationData.load(tmp_path / name)
        for k in ("conf_logit", "accept_prob", "greedy_match", "accepted", "request_ids"):
            assert torch.equal(getattr(back, k), getattr(data, k)), (name, k)
        assert (back.label, back.temperature, back.meta) == ("greedy", 0.7, {"dataset": "x.jsonl"})
    assert data.accept_events().tolist()[2] == [True, False, False]
    both = CalibrationData.concatenate([data, data])
    assert both.num_samples == 10


def _valid():
    return dict(
        conf_logit=torch.zeros(4, 2),
        accept_prob=torch.full((4, 2), 0.5),
        greedy_match=torch.zeros(4, 2),
        accepted=torch.zeros(4, dtype=torch.int64),
        request_ids=torch.zeros(4, dtype=torch.int64),
    )


@pytest.mark.parametrize(
    "change,match",
    [
        ({"accept_prob": torch.zeros(4, 3)}, "accept_prob"),
        ({"greedy_match": torch.zeros(3, 2)}, "greedy_match"),
        ({"accepted": torch.zeros(5, dtype=torch.int64)}, "accepted"),
        ({"accepted": torch.full((4,), 3)}, "accepted"),
        ({"conf_logit": torch.tensor([[0.0, float("nan")]] * 4)}, "conf_logit"),
        ({"accept_prob": torch.full((4, 2), float("nan"))}, "accept_prob"),
        ({"conf_logit": torch.zeros(4)}, "conf_logit"),
        ({"label": "tv"}, "label"),
    ],
)
def test_bad_calibration_data_names_the_argument(change, match):
    kw = _valid()
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        CalibrationData(**kw)


def test_label_helpers_and_collection_errors():
    with pytest.raises(ValueError, match="draft_logits"):
        accept_prob_labels(torch.zeros(2, 3, 5), torch.zeros(2, 3, 4), 1.0)
    with pytest.raises(ValueError, match="temperature"):
        accept_prob_labels(torch.zeros(2, 5), torch.zeros(2, 5), 0.0)
    with pytest.raises(ValueError, match="draft_tokens"):
        greedy_match_labels(torch.zeros(2, 3, 5), torch.zeros(2, 2, dtype=torch.int64))
    # identical distributions accept surely; disjoint ones never
    assert accept_prob_labels(torch.randn(3, 7), torch.zeros(3, 7), 1.0).shape == (3,)
    x = torch.randn(4, 9)
    torch.testing.assert_close(accept_prob_labels(x, x.clone(), 0.5), torch.ones(4))
    far = torch.tensor([[50.0, -50.0]])
    assert float(accept_prob_labels(far, -far, 1.0)) < 1e-12
    target = tiny_target("llama", seed=0)
    no_head = copy.deepcopy(random_drafter(target))
    no_head.confidence_head = None
    dec = DSparkDecoder(target, no_head)
    try:
        with pytest.raises(ValueError, match="confidence head"):
            collect_calibration_data(dec, PROMPTS[:1], max_new_tokens=4)
        dec2 = decoder()
        with pytest.raises(ValueError, match="label"):
            collect_calibration_data(dec2, PROMPTS[:1], label="tv")
        dec2.close()
    finally:
        dec.close()
