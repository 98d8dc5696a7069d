# SPDX-License-Identifier: Apache-2.0
"""Reference of ``dspark::markov_sample_from_hidden``: ``U`` in float64, rounded once to float32, then the
``markov_sample`` reference."""

from __future__ import annotations

from torch import Tensor

from dspark.reference.markov_sample import markov_sample_ref


def base_logits_ref(hidden: Tensor, lm_head: Tensor) -> Tensor:
    """``U = hidden · lm_headᵀ`` ``(R, g, V)`` float32: summed in float64 and rounded once."""
    return (hidden.double() @ lm_head.double().T).float()


def markov_sample_from_hidden_ref(
    hidden: Tensor,
    lm_head: Tensor,
    anchor: Tensor,
    w1: Tensor,
    w2: Tensor,
    temperature: Tensor,
    seed: int,
    offset: int,
    request_ids: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """hidden ``(R, g, H)``, lm_head ``(V, H)``, the rest as :func:`markov_sample_ref` -> tokens ``(R, g)``
    int64, z ``(R, g, V)`` float32, prev_emb ``(R, g, r)`` float32."""
    U = base_logits_ref(hidden, lm_head)
    return markov_sample_ref(U, anchor, w1, w2, temperature, seed, offset, request_ids)
