# SPDX-License-Identifier: Apache-2.0
"""Typed wrappers of the ``torch.ops.dspark`` operators; importing this registers their fake implementations."""

from dspark.ops.confidence import confidence
from dspark.ops.few_row_linear import few_row_linear
from dspark.ops.markov_sample import markov_sample
from dspark.ops.markov_sample_from_hidden import markov_sample_from_hidden
from dspark.ops.paged_kv_append import paged_kv_append
from dspark.ops.paged_verify_attention import paged_verify_attention, paged_verify_attention_split_base
from dspark.ops.philox_draw import philox_draw
from dspark.ops.plan_verify import PLAN_MODES, plan_verify
from dspark.ops.rejection_sample import rejection_sample

__all__ = [
    "PLAN_MODES",
    "confidence",
    "few_row_linear",
    "paged_kv_append",
    "paged_verify_attention",
    "paged_verify_attention_split_base",
    "philox_draw",
    "plan_verify",
    "markov_sample",
    "markov_sample_from_hidden",
    "rejection_sample",
]
