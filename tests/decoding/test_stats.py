# SPDX-License-Identifier: Apache-2.0
"""DSparkStats: counters derived by hand on small round sequences."""

import json
import math

import pytest

from dspark.decoding.stats import DSparkStats


def test_tau_and_acceptance_by_hand():
    s = DSparkStats(gamma=3)
    # request A verifies all 3 drafts, accepts 2 (emits 3); request B verifies 1 draft, rejects it (emits 1)
    s.record_round([4, 2], [2, 0], [3, 1], survival=[[0.9, 0.8, 0.5], [0.3, 0.1, 0.0]])
    # request A: everything verified and accepted, EOS cut the bonus (emits 3)
    s.record_round([4], [3], [3], survival=[[0.9, 0.9, 0.9]])
    assert s.rounds == 2 and s.request_rounds == 3
    assert s.tau == pytest.approx(7 / 3)
    assert s.accepted_hist == [1, 0, 1, 1]
    assert s.verified_at == [3, 2, 2]
    assert s.reached == [3, 2, 2]
    assert s.accepted_at == [2, 2, 1]
    assert s.conditional_acceptance == pytest.approx([2 / 3, 1.0, 0.5])
    assert s.accept_rate_at == pytest.approx([2 / 3, 1.0, 0.5])
    assert s.mean_verify_len == pytest.approx(1 + 7 / 3)
    assert s.rejected_drafts == 2 and s.mean_budget == pytest.approx(3.5)
    # calibration only on the two uncensored rows (verify_len = gamma + 1)
    cal = s.calibration
    assert s.calib_rows == 2
    assert cal["predicted"] == pytest.approx([0.9, 0.85, 0.7])
    assert cal["realised"] == pytest.approx([1.0, 1.0, 0.5])


def test_reached_differs_from_verified_after_an_early_rejection():
    s = DSparkStats(gamma=3)
    s.record_round([4], [0], [1])  # drafts 1, 2 verified but never reached
    assert s.verified_at == [1, 1, 1] and s.reached == [1, 0, 0]
    assert s.conditional_acceptance[0] == 0.0 and math.isnan(s.conditional_acceptance[1])


def test_merge_json_summary():
    a, b = DSparkStats(gamma=2), DSparkStats(gamma=2)
    a.record_round([3], [2], [3])
    b.record_round([1], [0], [1])
    b.add_time("verify", 0.5)
    b.wall_seconds = 2.0
    a.merge(b)
    assert a.request_rounds == 2 and a.emitted_tokens == 4 and a.tokens_per_second == 2.0
    d = json.loads(a.to_json())
    assert d["tau"] == 2.0 and d["calibration"]["predicted"] == [None, None]
    assert "tau 2.00" in a.summary() and "verify 100%" in a.summary()
    with pytest.raises(ValueError, match="gamma"):
        a.merge(DSparkStats(gamma=3))


@pytest.mark.parametrize("args", [([5], [0], [1]), ([2], [2], [1]), ([2], [1], [3]), ([1, 2], [0], [1])])
def test_inconsistent_rounds_are_refused(args):
    with pytest.raises(ValueError):
        DSparkStats(gamma=3).record_round(*args)


def test_unknown_stage():
    with pytest.raises(ValueError, match="unknown stage"):
        DSparkStats(gamma=1).add_time("sleep", 1.0)
