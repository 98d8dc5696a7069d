# SPDX-License-Identifier: Apache-2.0
"""Reference of ``dspark::confidence``."""

from __future__ import annotations

import torch
from torch import Tensor


def confidence_ref(
    hidden: Tensor, prev_emb: Tensor, weight: Tensor, bias: Tensor, sts_temperature: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """hidden ``(R, g, H)``, prev_emb ``(R, g, r)``, weight ``(H + r,)``, bias ``()``, sts ``(g,)``
    -> logit, conf, survival ``(R, g)`` float32."""
    x = torch.cat([hidden.float(), prev_emb.float()], dim=-1)
    logit = x @ weight.float() + bias.float().reshape(())
    conf = torch.sigmoid(logit / sts_temperature.float())
    return logit, conf, torch.cumprod(conf, dim=1)
