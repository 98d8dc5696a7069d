# SPDX-License-Identifier: Apache-2.0
"""Pure-PyTorch / pure-Python oracles of every dspark op (slow, plain, obviously right)."""

from dspark.reference.confidence import confidence_ref
from dspark.reference.few_row_linear import few_row_linear_ref
from dspark.reference.markov_sample import markov_sample_ref
from dspark.reference.markov_sample_from_hidden import base_logits_ref, markov_sample_from_hidden_ref
from dspark.reference.paged_kv_append import paged_kv_append_ref
from dspark.reference.paged_verify_attention import gather_request_kv, paged_verify_attention_ref
from dspark.reference.philox import philox4x32_10_ref, philox_draw_ref
from dspark.reference.plan_verify import plan_verify_anticipating_ref, plan_verify_ref, sps_ceil_ref
from dspark.reference.rejection_sample import draft_probs_ref, rejection_sample_ref, target_probs_ref

__all__ = [
    "base_logits_ref",
    "confidence_ref",
    "few_row_linear_ref",
    "gather_request_kv",
    "paged_kv_append_ref",
    "paged_verify_attention_ref",
    "draft_probs_ref",
    "markov_sample_ref",
    "markov_sample_from_hidden_ref",
    "philox4x32_10_ref",
    "philox_draw_ref",
    "plan_verify_anticipating_ref",
    "plan_verify_ref",
    "rejection_sample_ref",
    "sps_ceil_ref",
    "target_probs_ref",
]
