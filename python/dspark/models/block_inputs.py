# SPDX-License-Identifier: Apache-2.0
"""What enters a drafter's block: the context rows and the block's input embeddings, the same in serving and
training (docs/drafter.md, "Copy channel").

DeepSpec's block is ``[x_a, MASK x (γ-1)]`` over context rows ``hidden_norm(fc(F))``. The v2 inputs, each a
config flag (off in DeepSpec's checkpoints, which then compute exactly what they did):

* ``tap_norm``: an RMSNorm per tapped layer before ``fc`` (the tapped layers' scales differ by an order of
  magnitude, and a few channels carry massive activations);
* ``learned_mask``: a trained MASK vector ``mask_embed`` instead of the embedding of the real token
  ``mask_token_id``;
* ``copy_channel``: the history's lookup continuation ``c_1 .. c_γ`` (the tokens that followed the most recent
  earlier occurrence of the history's longest suffix of ``copy_min_match .. copy_max_match`` tokens; none where
  the continuation is shorter) is added to slot ``j``'s input as ``copy_proj(E[c_{j+1}])`` — each slot carries
  the copy's guess of its own label, ``x_{a+1+j}``, so that with an embedding tied to the LM head the residual
  stream holds the copied token's logit direction directly — and ``copy_embed[n]`` (``n`` the copy class: the
  match length, split by extent with ``copy_extent_bounds``; 0 where slot ``j`` has no copied token) tells the
  block how sure the copy is;
* ``context_projection``: ``context_proj(row_{a-1})``, the last context row, added to every block row.

The copy inputs are a function of the history alone, so drafting from them keeps the round exact (DESIGN §4.5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark.host_sync import to_device
from dspark.models.config import DrafterConfig
from dspark.models.layers import RMSNorm


def add_input_modules(model: nn.Module, c: DrafterConfig) -> None:
    """Register the v2 input modules ``c`` asks for on ``model`` (top-level names, as the checkpoint stores them).

    Fresh values make the block compute what a DeepSpec drafter does until trained: ``copy_embed`` and
    ``context_proj`` start at zero, ``copy_proj`` at the identity, ``mask_embed`` is set by
    :func:`init_input_modules` once the embedding is known, ``tap_norm`` at ones.
    """
    H = c.hidden_size
    if c.tap_norm:
        model.tap_norm = RMSNorm(c.num_taps * H, c.rms_norm_eps)
    if c.copy_channel:
        model.copy_proj = nn.Linear(H, H, bias=False)
        model.copy_embed = nn.Embedding(c.num_copy_classes, H)
    if c.context_projection:
        model.context_proj = nn.Linear(H, H, bias=False)
    if c.learned_mask:
        model.mask_embed = nn.Parameter(torch.zeros(H))


@torch.no_grad()
def init_input_modules(model: nn.Module, embed: Tensor, *, copy_identity: bool = True) -> None:
    """Neutral starting values of the v2 input modules (module docstring).

    ``copy_identity=False`` starts ``copy_proj`` at zero too: a drafter warm-started from a DeepSpec one then
    computes exactly what it did, and training opens the channel.
    """
    c = model.config
    if c.tap_norm:
        model.tap_norm.weight.fill_(1.0)
    if c.copy_channel:
        if copy_identity:
            model.copy_proj.weight.copy_(torch.eye(c.hidden_size))
        else:
            model.copy_proj.weight.zero_()
        model.copy_embed.weight.zero_()
    if c.context_projection:
        model.context_proj.weight.zero_()
    if c.learned_mask:
        model.mask_embed.copy_(embed[c.mask_token_id].to(model.mask_embed.dtype))


def context_rows(model: nn.Module, features: Tensor) -> Tensor:
    """Context rows ``hidden_norm(fc(F))`` ``(n, H)`` from tapped features ``(n, m·H)`` (``tap_norm`` first when
    the config has it: each tap's ``H`` channels normed on their own)."""
    c = model.config
    x = features
    if c.tap_norm:
        n, H = x.shape[0], c.hidden_size
        w = model.tap_norm.weight.view(c.num_taps, H)
        xf = x.view(n, c.num_taps, H).float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps)
        x = (w * xf.to(x.dtype)).view(n, -1)
    return model.hidden_norm(model.fc(x))


def write_context(model: nn.Module, rows: Tensor, positions: Tensor, slots: Tensor) -> None:
    """Write context rows ``(n, H)`` into the drafter's paged contexts at ``slots`` ``(n,)`` int64: each layer's
    normed, rotated K and V at ``positions`` ``(n,)`` int64 (both on the drafter's device), and the rows
    themselves where they are kept. Eager, or recorded into a CUDA graph (``context_graphs``)."""
    store = model.contexts
    cos, sin = model.rotary_emb.cos_sin(positions, model.dtype)
    for li, layer in enumerate(model.layers):
        k, v = layer.self_attn.project_kv(rows, cos, sin)
        store.write(li, slots, k, v)
    store.write_rows(slots, rows)  # kept only with context_projection


def block_embeddings(
    model: nn.Module,
    anchors: Tensor,
    embed: Tensor,
    copy_tokens: Tensor | None = None,
    copy_match: Tensor | None = None,
    last_rows: Tensor | None = None,
) -> Tensor:
    """Input embeddings ``(N·γ, H)`` of N blocks in the drafter's dtype.

    Parameters
    ----------
    anchors : Tensor
        ``(N,)`` int64: each block's anchor token.
    embed : Tensor
        ``(V, H)``: the (shared) input embedding.
    copy_tokens : Tensor, optional
        ``(N, γ)`` int64: the lookup continuation per block (slot ``j`` reads entry ``j``), ``-1`` where there is
        none. Read only with ``copy_channel`` (None there: no copies).
    copy_match : Tensor, optional
        ``(N,)`` int64: the continuation's copy class (0: none; its match length, or past ``copy_max_match``
        its extent class with ``copy_extent_bounds``), in ``[0, num_copy_classes)``.
    last_rows : Tensor, optional
        ``(N, H)``: context row ``a - 1`` per block (zeros for a block without context). Read only with
        ``context_projection``.
    """
    c = model.config
    dev, dt = anchors.device, model.fc.weight.dtype
    N, g = anchors.shape[0], c.block_slots
    if c.learned_mask:
        x = model.mask_embed.to(dt).expand(N, g, -1).clone()
        x[:, 0] = F.embedding(anchors, embed).to(dt)
    else:
        tok = torch.full((N, g), c.mask_token_id, dtype=torch.int64, device=dev)
        tok[:, 0] = anchors
        x = F.embedding(tok, embed).to(dt)
    if c.copy_channel and copy_tokens is not None:
        has = copy_tokens >= 0  # [N, g]
        copied = F.embedding(copy_tokens.clamp_min(0), embed).to(dt) * has.unsqueeze(-1).to(dt)
        match = copy_match.to(dev).clamp(0, c.num_copy_classes - 1)
        x = x + model.copy_proj(copied) + model.copy_embed(torch.where(has, match.unsqueeze(1), 0)).to(dt)
    if c.context_projection and last_rows is not None:
        x = x + model.context_proj(last_rows.to(dt)).unsqueeze(1)
    return x.reshape(N * g, -1)


def copy_inputs(
    continuations: list[list[int]], matches: list[int], g: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Host lookup continuations -> the ``copy_tokens`` ``(N, γ)`` (-1 padded) and ``copy_match`` ``(N,)``
    tensors :func:`block_embeddings` reads, built on the host and sent to ``device`` once."""
    N = len(continuations)
    tok = torch.full((N, g), -1, dtype=torch.int64)
    for i, cont in enumerate(continuations):
        k = min(len(cont), g)
        if k:
            tok[i, :k] = torch.tensor(cont[:k], dtype=torch.int64)
    match = torch.tensor([m if cont else 0 for m, cont in zip(matches, continuations, strict=True)])
    return to_device(tok, device), to_device(match, device)
