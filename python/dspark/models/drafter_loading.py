# SPDX-License-Identifier: Apache-2.0
"""Where a loaded drafter's tensors go: its dtype/device, and whether its embedding and LM head alias the
target's or are its own (``DSparkDrafter.from_pretrained``; the rules are in docs/drafter.md)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dspark.models.checkpoint import storage_dtype
from dspark.models.config import DrafterConfig, dtype_from_name
from dspark.models.pairing import check_same_weights

SHARABLE = ("embed_tokens", "lm_head")


def target_tables(target: nn.Module | None) -> dict[str, Tensor | None]:
    """The target's input embedding and LM head weights (None without a target / an output embedding)."""
    if target is None:
        return dict.fromkeys(SHARABLE)
    head = target.get_output_embeddings()
    return {
        "embed_tokens": target.get_input_embeddings().weight,
        "lm_head": head.weight if head is not None else None,
    }


def resolve_dtype_device(
    cfg: DrafterConfig,
    tensors: dict[str, Tensor],
    t_embed: Tensor | None,
    dtype: torch.dtype | str | None,
    device: torch.device | str | None,
) -> tuple[torch.dtype, torch.device]:
    """The drafter's dtype (asked, else the target's, else the checkpoint's) and device (asked, else the
    target's, else CPU)."""
    dt = dtype_from_name(dtype) if dtype is not None else None
    if dtype is not None and dt is None:
        raise ValueError(f"dtype: expected a torch dtype or one of float32/bfloat16/float16, got {dtype!r}")
    if dt is None:
        dt = t_embed.dtype if t_embed is not None else (cfg.dtype or storage_dtype(tensors))
    if device is not None:
        dev = torch.device(device)
    else:
        dev = t_embed.device if t_embed is not None else torch.device("cpu")
    if dev.type == "cuda" and dev.index is None:  # compare like the target's "cuda:N"
        dev = torch.device("cuda", torch.cuda.current_device())
    return dt, dev


def place_embeddings(
    tensors: dict[str, Tensor],
    tables: dict[str, Tensor | None],
    *,
    has_target: bool,
    dtype: torch.dtype,
    device: torch.device,
    share: bool | None,
) -> dict[str, bool]:
    """Decide, for ``embed_tokens`` and ``lm_head``, whether the drafter aliases the target's table.

    ``tensors`` is updated in place: an aliased table's stored copy is dropped; a table the drafter keeps is
    left (or put) there, already in ``dtype`` on ``device``.

    Parameters
    ----------
    tensors : dict
        The checkpoint's tensors (``embed_tokens.weight`` / ``lm_head.weight`` optional).
    tables : dict
        The target's weights by name (:func:`target_tables`).
    has_target : bool
        Whether a target was given.
    dtype, device
        What the drafter runs at.
    share : bool or None
        ``share_target_embeddings``: None aliases where the stored copy is absent or equals the target's at
        ``dtype`` (a cast copy when ``dtype``/``device`` differ from the target's); True always aliases; False
        keeps the stored copies as the drafter's own.

    Returns
    -------
    dict
        Name -> True when the target's module is to be aliased.

    Raises
    ------
    ValueError
        A table missing with nothing to share, or (``share=None``) a stored copy that differs from the target's.
    """
    aliased: dict[str, bool] = {}
    casts: dict[int, Tensor] = {}  # the target's tables cast to the drafter's dtype/device, one per storage

    def cast_copy(t_w: Tensor) -> Tensor:
        key = t_w.data_ptr()  # tied embedding / LM head: one copy
        if key not in casts:
            casts[key] = t_w.detach().to(device=device, dtype=dtype)
        return casts[key]

    for name in SHARABLE:
        key, t_w = name + ".weight", tables[name]
        stored = tensors.get(key)
        if share is False:
            if stored is None:
                raise ValueError(f"{key}: missing from the checkpoint and share_target_embeddings=False")
            aliased[name] = False  # the drafter's own, as stored
            continue
        if stored is None or share:
            if not has_target:
                why = "share_target_embeddings=True" if share else "missing from the checkpoint"
                raise ValueError(f"{key}: {why}; pass target= to share the target's")
            if t_w is None:
                raise ValueError(f"{name}: the target has none to share")
        if t_w is None:  # no target (or no LM head to share): the stored copy is the drafter's
            aliased[name] = False
            continue
        same_place = t_w.dtype == dtype and t_w.device == device
        if share or (stored is None and same_place):
            tensors.pop(key, None)
            aliased[name] = True  # an explicit alias of another dtype fails the runtime check, by design
            continue
        if stored is None:  # the drafter runs at another dtype/device: a cast copy instead of an alias
            tensors[key] = cast_copy(t_w)
            aliased[name] = False
            continue
        mine = stored.to(device=device, dtype=dtype)
        theirs = t_w if same_place else cast_copy(t_w)
        if torch.equal(mine, theirs):  # a copy of the target's: alias it (or share the one cast copy)
            if same_place:
                tensors.pop(key)
            else:
                tensors[key] = theirs
            aliased[name] = same_place
            continue
        # not bit-equal at the drafter's dtype: an error unless equal in the coarser dtype (e.g. a bf16 copy
        # of an fp32 target), in which case the stored values are what the drafter was trained with
        check_same_weights(key, stored, t_w)
        tensors[key] = mine
        aliased[name] = False
    return aliased


def loaded_state(tensors: dict[str, Tensor], dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
    """The state dict to assign: every tensor in ``dtype`` on ``device``, the confidence head in float32."""
    return {
        n: t.to(device=device, dtype=torch.float32 if n.startswith("confidence_head.") else dtype)
        for n, t in tensors.items()
    }
