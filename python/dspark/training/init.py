# SPDX-License-Identifier: Apache-2.0
"""Initialising a fresh drafter from its target's weights (a warm start for short training budgets).

* ``"norm"``: the drafter's final norm takes the target's final-norm weight (the LM head is shared, so the
  drafter's output lives at the target's logit scale from step 0), and ``fc`` starts as a copy of the last tap
  (``ctx = hidden_norm(F[last tap])``) instead of a random mix of all taps.
* ``"late"`` / ``"early"``: ``"norm"`` plus the drafter's decoder layers copied from the target's last / first
  layers (attention projections, MLP, layer norms; the drafter's per-head q/k norms start at one).
"""

from __future__ import annotations

import torch
from torch import nn

from dspark.models.drafter import DSparkDrafter

INIT_MODES = ("random", "norm", "early", "late")


def _target_layers(target: nn.Module) -> nn.ModuleList:
    base = target.get_decoder() if hasattr(target, "get_decoder") else target.model
    return base.layers


def _final_norm_weight(target: nn.Module) -> torch.Tensor:
    base = target.get_decoder() if hasattr(target, "get_decoder") else target.model
    return base.norm.weight


@torch.no_grad()
def init_from_target(drafter: DSparkDrafter, target: nn.Module, mode: str = "norm") -> None:
    """Overwrite some of ``drafter``'s fresh weights with ``target``'s (module docstring); ``"random"`` keeps all."""
    if mode not in INIT_MODES:
        raise ValueError(f"mode: expected one of {INIT_MODES}, got {mode!r}")
    if mode == "random":
        return
    c = drafter.config
    H = c.hidden_size
    drafter.norm.weight.copy_(_final_norm_weight(target))
    m = len(c.target_layer_ids)
    if drafter.fc.weight.shape != (H, m * H):
        raise ValueError(f"drafter.fc: expected weight ({H}, {m * H}), got {tuple(drafter.fc.weight.shape)}")
    drafter.fc.weight.zero_()
    drafter.fc.weight[:, (m - 1) * H :].copy_(torch.eye(H))
    if mode == "norm":
        return
    src = list(_target_layers(target))
    n = len(drafter.layers)
    if n > len(src):
        raise ValueError(f"mode {mode!r}: the drafter has {n} layers, the target only {len(src)}")
    picks = src[:n] if mode == "early" else src[-n:]
    for dst, s in zip(drafter.layers, picks, strict=True):
        sa, da = s.self_attn, dst.self_attn
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            dw, sw = getattr(da, name).weight, getattr(sa, name).weight
            if dw.shape != sw.shape:
                raise ValueError(f"layer {name}: drafter {tuple(dw.shape)} vs target {tuple(sw.shape)}")
            dw.copy_(sw)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(dst.mlp, name).weight.copy_(getattr(s.mlp, name).weight)
        dst.input_layernorm.weight.copy_(s.input_layernorm.weight)
        dst.post_attention_layernorm.weight.copy_(s.post_attention_layernorm.weight)
