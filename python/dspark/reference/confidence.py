# SPDX-License-Identifier: Apache-2.0
"""Reference of ``dspark::confidence``."""

from __future__ import annotations

import torch
from torch import Tensor


def confidence_ref(
    hidden: Tensor,
    prev_emb: Tensor,
    weight: Tensor,
    bias: Tensor,
    sts_temperature: Tensor,
    sts_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """hidden ``(R, g, H)``, prev_emb ``(R, g, r)``, weight ``(H + r,)``, bias ``()``, sts ``(g,)``, sts_bias
    ``(g,)`` or None -> logit, conf, survival ``(R, g)`` float32; ``conf = sigmoid(logit / T + o)``."""
    x = torch.cat([hidden.float(), prev_emb.float()], dim=-1)
    logit = x @ weight.float() + bias.float().reshape(())
    z = logit / sts_temperature.float()
    conf = torch.sigmoid(z if sts_bias is None else z + sts_bias.float())
    return logit, conf, torch.cumprod(conf, dim=1)
