# SPDX-License-Identifier: Apache-2.0
"""Checks that a drafter fits a target before any generation (each failure is a ValueError naming the field)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor, nn

from dspark.models.config import DrafterConfig

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def target_text_config(target: nn.Module):
    """The decoder config of an HF causal LM (``get_text_config()`` for multimodal wrappers)."""
    cfg = getattr(target, "config", None)
    if cfg is None:
        raise ValueError("target: expected a Hugging Face causal LM with a .config")
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def target_num_layers(target: nn.Module) -> int:
    return int(target_text_config(target).num_hidden_layers)


def validate_pairing(
    cfg: DrafterConfig,
    target: nn.Module,
    *,
    tokenizer=None,
    drafter_dir: str | os.PathLike | None = None,
) -> None:
    """Check vocabulary, tokenizer, hidden size, tapped layers and mask id of a drafter config against a target.

    Parameters
    ----------
    cfg : DrafterConfig
        The drafter's config.
    target : nn.Module
        An HF causal LM (``.config``, ``get_input_embeddings()``, ``get_output_embeddings()``).
    tokenizer : optional
        The target's tokenizer; its size must fit the vocabulary, and when ``drafter_dir`` holds tokenizer files
        their vocabulary must be the same.
    drafter_dir : path, optional
        The drafter checkpoint directory.

    Raises
    ------
    ValueError
        Naming the mismatching field.
    """
    tc = target_text_config(target)
    emb = target.get_input_embeddings()
    t_vocab = int(emb.weight.shape[0]) if emb is not None else int(tc.vocab_size)
    if cfg.vocab_size != int(tc.vocab_size) or cfg.vocab_size != t_vocab:
        raise ValueError(
            f"vocab_size: drafter has {cfg.vocab_size}, target has {tc.vocab_size} (embedding rows {t_vocab})"
        )
    if cfg.hidden_size != int(tc.hidden_size):
        raise ValueError(f"hidden_size: drafter has {cfg.hidden_size}, target has {tc.hidden_size}")
    L = int(tc.num_hidden_layers)
    if cfg.num_target_layers is not None and cfg.num_target_layers != L:
        raise ValueError(
            f"num_target_layers: drafter was trained for {cfg.num_target_layers}, target has {L} layers"
        )
    bad = [i for i in cfg.target_layer_ids if not -1 <= i <= L - 2]
    if bad:
        raise ValueError(
            f"target_layer_ids: {bad} outside [-1, {L - 2}] (target has {L} layers; the last one is not allowed "
            f"because HF returns it normed)"
        )
    if not 0 <= cfg.mask_token_id < t_vocab:
        raise ValueError(
            f"mask_token_id: {cfg.mask_token_id} is outside the target vocabulary [0, {t_vocab})"
        )
    if cfg.block_size < 1:
        raise ValueError(f"block_size: must be >= 1, got {cfg.block_size}")
    if tokenizer is not None:
        n = len(tokenizer)
        if n > cfg.vocab_size:
            raise ValueError(
                f"tokenizer: the target tokenizer has {n} tokens, more than vocab_size {cfg.vocab_size}"
            )
        if drafter_dir is not None and any((Path(drafter_dir) / f).is_file() for f in _TOKENIZER_FILES):
            from transformers import AutoTokenizer

            theirs = AutoTokenizer.from_pretrained(str(drafter_dir))
            if theirs.get_vocab() != tokenizer.get_vocab():
                raise ValueError("tokenizer: the drafter checkpoint's tokenizer differs from the target's")


def check_same_weights(name: str, stored: Tensor, target_weight: Tensor) -> None:
    """A stored ``embed_tokens``/``lm_head`` copy must equal the target's (compared in the coarser dtype).

    Raises
    ------
    ValueError
        Naming the tensor, when the shapes or the values differ.
    """
    if tuple(stored.shape) != tuple(target_weight.shape):
        raise ValueError(f"{name}: stored shape {list(stored.shape)} != target's {list(target_weight.shape)}")
    coarse = stored.dtype if stored.element_size() <= target_weight.element_size() else target_weight.dtype
    dev = target_weight.device  # compare where the target lives (no host copy of a large table)
    a = stored.detach().to(device=dev, dtype=coarse)
    b = target_weight.detach().to(dtype=coarse)
    if not torch.equal(a, b):
        diff = (a.float() - b.float()).abs().max().item()
        raise ValueError(
            f"{name}: the checkpoint's copy differs from the target's (max abs diff {diff:.3g}); the drafter was "
            f"trained for another target revision, or trained its own (pass share_target_embeddings=True to use "
            f"the target's anyway, or share_target_embeddings=False to keep the checkpoint's as the drafter's own)"
        )


def check_dtype_device(
    what: str, tensor: Tensor, dtype: torch.dtype, device: torch.device, *, check_dtype: bool = True
) -> None:
    if check_dtype and tensor.dtype != dtype:
        raise ValueError(
            f"dtype: {what} is {tensor.dtype} but the drafter runs in {dtype}; load the drafter with dtype={tensor.dtype}"
        )
    if tensor.device != device:
        raise ValueError(f"device: {what} is on {tensor.device} but the drafter is on {device}")
