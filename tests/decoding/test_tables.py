# SPDX-License-Identifier: Apache-2.0
"""SpsTable.steps_per_sec prices a batch as the planner op does (the reference's ceiling rule)."""

import pytest

from dspark.decoding.tables import SpsTable
from dspark.reference import sps_ceil_ref

TABLE = SpsTable((1, 2, 4, 8, 16), (100.0, 98.0, 90.0, 70.0, 40.0), 64)


@pytest.mark.parametrize("batch_tokens", [1, 2, 3, 5, 8, 9, 16, 17, 64, 200])
def test_steps_per_sec_matches_the_reference(batch_tokens):
    ref = sps_ceil_ref(list(TABLE.sample_batch_tokens), list(TABLE.sample_steps_per_sec), batch_tokens)
    assert TABLE.steps_per_sec(batch_tokens) == ref


def test_steps_per_sec_between_and_past_the_probes():
    assert TABLE.steps_per_sec(3) == 90.0  # the next probe up, never the floor
    assert TABLE.steps_per_sec(32) == pytest.approx(20.0)  # constant tokens/s past the last probe
