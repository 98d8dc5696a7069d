# SPDX-License-Identifier: Apache-2.0
"""Typed wrappers of the ``torch.ops.dspark`` operators; importing this registers their fake implementations."""

from dspark.ops.confidence import confidence
from dspark.ops.markov_sample import markov_sample, markov_sample_from_hidden
from dspark.ops.philox_draw import philox_draw
from dspark.ops.plan_verify import PLAN_MODES, plan_verify
from dspark.ops.rejection_sample import rejection_sample

__all__ = [
    "PLAN_MODES",
    "confidence",
    "markov_sample",
    "markov_sample_from_hidden",
    "philox_draw",
    "plan_verify",
    "rejection_sample",
]
