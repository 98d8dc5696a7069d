# SPDX-License-Identifier: Apache-2.0
"""A fresh drafter for a target: its config (a copy of the target's text config plus the DSpark fields, as
DeepSpec writes it) and its initial weights (``DSparkDrafter.from_config``; docs/drafter.md)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TypeVar

import torch
from torch import nn

from dspark.models.block_inputs import init_input_modules
from dspark.models.config import DrafterConfig
from dspark.models.pairing import target_text_config, validate_pairing

# the drafter class is passed in, not imported: drafter.py imports this module
D = TypeVar("D", bound=nn.Module)


def default_target_layer_ids(num_layers: int, taps: int = 5) -> list[int]:
    """DeepSpec's spread of tapped target layers.

    Parameters
    ----------
    num_layers : int
        The target's decoder layer count ``L``.
    taps : int
        How many layers to tap.

    Returns
    -------
    list of int
        ``1 + j (L - 4) / (taps - 1)`` rounded, clipped to ``L - 2``, sorted and distinct (``[1, 9, 17, 25, 33]``
        for 36 layers).

    Raises
    ------
    ValueError
        A target with fewer than 2 layers.
    """
    if num_layers < 2:
        raise ValueError(f"target_layer_ids: a target needs >= 2 layers to tap one, it has {num_layers}")
    hi = num_layers - 2
    span = max(num_layers - 4, 0)
    ids = sorted({min(hi, round(1 + j * span / max(taps - 1, 1))) for j in range(taps)})
    return ids


def fresh_config(
    target: nn.Module,
    *,
    block_size: int = 7,
    num_layers: int = 1,
    target_layer_ids: Sequence[int] | None = None,
    markov_rank: int = 256,
    markov_head_type: str = "vanilla",
    mask_token_id: int | None = None,
    enable_confidence_head: bool | None = None,
    confidence_head_with_markov: bool = True,
    intermediate_size: int | None = None,
    num_attention_heads: int | None = None,
    num_key_value_heads: int | None = None,
    head_dim: int | None = None,
    copy_channel: bool = False,
    copy_min_match: int = 2,
    copy_max_match: int = 3,
    copy_extent_bounds: Sequence[int] = (),
    context_projection: bool = False,
    learned_mask: bool = False,
    tap_norm: bool = False,
    copy_head: bool = False,
    copy_greedy_bias: bool = False,
) -> DrafterConfig:
    """The config of a fresh drafter for ``target``, checked against it (arguments as in :func:`new_drafter`;
    the last nine are the v2 inputs of ``dspark.models.block_inputs`` and the copy head of
    ``dspark.models.copy_head``, all off by default).

    Returns
    -------
    DrafterConfig
        The target's text config with the drafter's shapes and the DSpark fields; ``dtype`` is not set.

    Raises
    ------
    ValueError
        A field that does not pair with the target (see ``validate_pairing``).
    """
    tc = target_text_config(target)
    raw = copy.deepcopy(tc.to_dict())
    L = int(tc.num_hidden_layers)
    heads = num_attention_heads or int(tc.num_attention_heads)
    hd = head_dim or getattr(tc, "head_dim", None) or int(tc.hidden_size) // heads
    raw.update(
        model_type="qwen3",
        hidden_size=int(tc.hidden_size),
        intermediate_size=intermediate_size or int(tc.intermediate_size),
        num_attention_heads=heads,
        num_key_value_heads=num_key_value_heads or int(getattr(tc, "num_key_value_heads", None) or heads),
        head_dim=int(hd),
        vocab_size=int(tc.vocab_size),
        num_hidden_layers=num_layers,
        num_target_layers=L,
        block_size=block_size,
        mask_token_id=int(tc.vocab_size) - 1 if mask_token_id is None else mask_token_id,
        target_layer_ids=list(target_layer_ids)
        if target_layer_ids is not None
        else default_target_layer_ids(L),
        markov_rank=markov_rank,
        markov_head_type=markov_head_type,
        enable_confidence_head=(markov_rank > 0)
        if enable_confidence_head is None
        else enable_confidence_head,
        confidence_head_with_markov=confidence_head_with_markov,
        attention_bias=False,
        hidden_act="silu",
        copy_channel=copy_channel,
        copy_min_match=copy_min_match,
        copy_max_match=copy_max_match,
        copy_extent_bounds=list(copy_extent_bounds),
        context_projection=context_projection,
        learned_mask=learned_mask,
        tap_norm=tap_norm,
        copy_head=copy_head,
        copy_greedy_bias=copy_greedy_bias,
    )
    raw.pop("layer_types", None)
    # A fresh drafter uses default RoPE at the target's base frequency (scaled variants are not implemented).
    rope = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
    raw.pop("rope_scaling", None)
    raw.pop("rope_theta", None)
    raw["rope_parameters"] = {"rope_theta": float(theta), "rope_type": "default"}
    cfg = DrafterConfig.from_dict(raw)
    validate_pairing(cfg, target)
    return cfg


def new_drafter(
    cls: type[D],
    target: nn.Module,
    *,
    share_embeddings: bool = True,
    dtype: torch.dtype | None = None,
    initializer_range: float | None = None,
    **config_options,
) -> D:
    """A fresh (randomly initialised) drafter of class ``cls`` for an HF causal LM ``target``.

    Parameters
    ----------
    cls : type
        ``DSparkDrafter`` (or a subclass).
    target : nn.Module
        The HF causal LM to draft for.
    share_embeddings : bool
        Alias the target's embedding and LM head (frozen in training by the caller); otherwise copy them.
    dtype : torch.dtype, optional
        Default: the target's. The drafter goes to the target's device.
    initializer_range : float, optional
        Std of HF's default normal init; default the target config's (0.02 when it has none).
    **config_options
        The shape and head options of :func:`fresh_config` (``block_size``, ``num_layers``, ``markov_rank``...).

    Returns
    -------
    nn.Module
        The drafter, checked against the target.
    """
    cfg = fresh_config(target, **config_options)
    t_embed = target.get_input_embeddings().weight
    dtype = dtype or t_embed.dtype
    cfg.dtype = dtype
    model = cls(cfg, own_embed=not share_embeddings, own_lm_head=not share_embeddings)
    tc = target_text_config(target)
    std = (
        initializer_range if initializer_range is not None else float(getattr(tc, "initializer_range", 0.02))
    )
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
    init_input_modules(model, t_embed.detach())
    if share_embeddings:
        model.share_target_embeddings(target)
    else:
        with torch.no_grad():
            model.embed_tokens.weight.copy_(t_embed)
            model.lm_head.weight.copy_(target.get_output_embeddings().weight)
    model.to(device=t_embed.device, dtype=dtype)
    model._check_runtime(target)
    return model
