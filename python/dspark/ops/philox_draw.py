# SPDX-License-Identifier: Apache-2.0
"""``dspark::philox_draw``: keyed counter-based uniforms and Gumbels (the RNG every random op uses)."""

from __future__ import annotations

import torch
from torch import Tensor

# Purposes of include/dspark/philox.h (distinct purposes give independent streams).
PURPOSE_TEST = 0
PURPOSE_DRAFT_SAMPLE = 1
PURPOSE_ACCEPT = 2
PURPOSE_RESIDUAL = 3


def philox_draw(
    seed: int, offset: int, request: Tensor, position: Tensor, purpose: int, index: Tensor
) -> tuple[Tensor, Tensor]:
    """Philox4x32-10 draws keyed by ``(seed, offset, request, position, purpose, index)``.

    The same function runs in every random dspark kernel on CPU and CUDA, so given the same key both devices
    draw the same numbers.

    Parameters
    ----------
    seed, offset : int
        The stream's seed and its offset (advanced once per decode round).
    request, position, index : Tensor
        Shape ``(N,)`` int64: request id (< 2^32), position (< 2^16) and index (< 2^34, e.g. a vocabulary id).
    purpose : int
        Stream purpose in ``[0, 65535]`` (see ``PURPOSE_*``).

    Returns
    -------
    uniform : Tensor
        Shape ``(N,)`` float32 in the open interval (0, 1).
    gumbel : Tensor
        Shape ``(N,)`` float32, ``-log(-log(uniform))``.

    Examples
    --------
    >>> import torch, dspark
    >>> i = torch.arange(4)
    >>> u, g = dspark.ops.philox_draw(0, 0, i * 0, i * 0, 0, i)
    >>> bool(((u > 0) & (u < 1)).all())
    True
    """
    return torch.ops.dspark.philox_draw.default(seed, offset, request, position, purpose, index)


@torch.library.register_fake("dspark::philox_draw")
def _philox_draw_fake(seed, offset, request, position, purpose, index):
    return request.new_empty(request.shape, dtype=torch.float32), request.new_empty(
        request.shape, dtype=torch.float32
    )
