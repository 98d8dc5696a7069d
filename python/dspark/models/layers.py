# SPDX-License-Identifier: Apache-2.0
"""Building blocks of the drafter backbone (Qwen3-shaped; module names match DeepSpec's checkpoints)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Float32Module(nn.Module):
    """A module whose parameters stay float32 when the drafter is cast (``.to(bfloat16)``): small heads whose
    values a cast would round (the confidence and copy heads); device moves still apply."""

    def _apply(self, fn, recurse=True):
        saved = {n: p.data for n, p in self.named_parameters()}
        super()._apply(fn, recurse)
        for n, p in self.named_parameters():
            if p.dtype != torch.float32:
                p.data = saved[n].to(p.device)
        return self


class RMSNorm(nn.Module):
    """HF Qwen3/Llama RMSNorm: variance in float32, cast back, then times the weight."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dt = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dt)


class Rotary(nn.Module):
    """RoPE: ``cos/sin(p * inv_freq)`` in float32, cast to the activation dtype; rotate-half layout. Default
    RoPE (``inv_freq = theta^(-2i/D)``), or YaRN with ``scaling`` (:func:`yarn_inv_freq`)."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None = None) -> None:
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        inv_freq, self.attention_factor = self._inv_freq()
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _inv_freq(self, device=None) -> tuple[Tensor, float]:
        if self.scaling is not None:
            inv_freq, factor = yarn_inv_freq(self.head_dim, self.theta, self.scaling)
            return inv_freq.to(device), factor
        exps = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
        return 1.0 / (self.theta**exps), 1.0

    def reset(self, device) -> None:
        """Recompute ``inv_freq`` (after meta-device construction)."""
        self.inv_freq = self._inv_freq(device)[0]

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``positions`` ``(N,)`` -> cos, sin ``(N, 1, D)`` in ``dtype`` (broadcast over heads)."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq.float().unsqueeze(0)
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:  # YaRN scales the rotated vectors (as transformers does)
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)


def yarn_inv_freq(head_dim: int, theta: float, scaling: dict) -> tuple[Tensor, float]:
    """YaRN's RoPE frequencies ``(head_dim // 2,)`` float32 and attention factor (arXiv 2309.00071).

    ``scaling``: ``factor``, ``original_max_position_embeddings`` and optionally ``beta_fast`` (32),
    ``beta_slow`` (1), ``attention_factor``, ``mscale`` / ``mscale_all_dim``, ``truncate`` (True) — the fields
    and formulas of transformers' ``rope_type: "yarn"``. Frequencies whose wavelength fits the original context
    many times are kept (extrapolated), those that do not are divided by ``factor`` (interpolated), with a
    linear ramp between the two correction dimensions.
    """
    factor = float(scaling["factor"])
    original = float(scaling["original_max_position_embeddings"])

    def mscale_of(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = mscale_of(factor, m) / mscale_of(factor, m_all) if m and m_all else mscale_of(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(
        rotations: float,
    ) -> float:  # the dimension that turns ``rotations`` times in ``original``
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    pos_freqs = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    keep = 1 - ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep
    return inv_freq, float(attention)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x`` ``(N, heads, D)``; ``x * cos + rotate_half(x) * sin``."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def project_q(self, h: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """``(N, H)`` -> normed, rotated queries ``(N, heads, D)``."""
        q = self.q_norm(self.q_proj(h).view(h.shape[0], self.heads, self.head_dim))
        return apply_rotary(q, cos, sin)

    def project_kv(self, h: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """``(N, H)`` -> normed, rotated keys and values ``(N, kv_heads, D)`` each."""
        n = h.shape[0]
        k = self.k_norm(self.k_proj(h).view(n, self.kv_heads, self.head_dim))
        v = self.v_proj(h).view(n, self.kv_heads, self.head_dim)
        return apply_rotary(k, cos, sin), v


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """One decoder layer; the target context enters only as extra keys/values (see ``DSparkDrafter``)."""

    def __init__(self, hidden, intermediate, heads, kv_heads, head_dim, eps) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = MLP(hidden, intermediate)
