# SPDX-License-Identifier: Apache-2.0
"""z-lab's DFlash packaging (``DFlashDraftModel``; SpecForge's DFlash exports share it), read-only.

``config.json`` is the drafter's Qwen3 config plus a top-level ``block_size`` (newer checkpoints may put it in
``dflash_config``), ``num_target_layers`` and ``dflash_config{mask_token_id, target_layer_ids}``; the weights
use DeepSpec's names without ``embed_tokens`` / ``lm_head`` (the target's are used). The block is ``[anchor,
MASK x (block_size - 1)]`` and only slots ``1 .. block_size - 1`` draft: dspark loads it with
``sample_from_anchor=false``, no Markov head and no confidence head.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import Tensor

from dspark.models import checkpoint as ckpt
from dspark.models.packagings.base import Packaged, backbone_config, field, read_json

NAME = "dflash"
ARCHITECTURE = "DFlashDraftModel"
# dflash_config keys of models dspark's drafter does not compute (DFlash2's candidate selector and
# convolution, sliding-window and causal variants, attention sinks)
UNSUPPORTED_KEYS = (
    "selector_rank",
    "selector_top_k",
    "conv_kernel_size",
    "conv_group_size",
    "use_swa",
    "swa_window_size",
    "attention_sink_bias",
    "input_embedding_scale",
    "output_multiplier",
    "final_logit_softcapping",
)
# prefixes that older SpecForge exports nest the heads under
HEAD_PREFIXES = ("logit_head.",)


def matches(doc: dict) -> bool:
    archs = doc.get("architectures") or []
    return "dflash_config" in doc or any(str(a).startswith("DFlash") for a in archs)


def spread_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default taps when ``target_layer_ids`` is absent: one middle layer, else evenly from layer 1 to
    layer ``L - 3`` (dflash/model.py ``build_target_layer_ids``)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def method_config(doc: dict, where: str) -> dict:
    """``dflash_config`` (required), with the variants dspark cannot compute refused by name."""
    archs = [str(a) for a in doc.get("architectures") or []]
    if any(a.startswith("DFlash2") for a in archs):
        raise ValueError(
            f"{where}: field 'architectures' = {archs}: DFlash2 (candidate selector, convolution) is not "
            "a model dspark's drafter computes"
        )
    m = doc.get("dflash_config")
    if m is None:
        raise ValueError(
            f"{where}: field 'dflash_config' is missing (expected an object with mask_token_id and "
            "target_layer_ids)"
        )
    if not isinstance(m, dict):
        raise ValueError(f"{where}: field 'dflash_config' = {m!r} must be an object")
    bad = [k for k in UNSUPPORTED_KEYS if m.get(k) not in (None, False)]
    if bad:
        raise ValueError(
            f"{where}: field dflash_config.{bad[0]} = {m[bad[0]]!r}: not a model dspark's drafter computes "
            "(DFlash2 selectors, sliding windows and attention sinks are not supported)"
        )
    if m.get("causal"):
        raise ValueError(
            f"{where}: field dflash_config.causal = true: dspark's block attention is bidirectional"
        )
    return m


def family_config(doc: dict, where: str) -> dict:
    """The DeepSpec-layout config of a ``dflash_config`` drafter (z-lab's or SpecForge's): the backbone's
    fields, the block, the taps and the mask token; heads off (callers add them)."""
    m = method_config(doc, where)
    hidden = field(doc, "hidden_size", where, int)
    target_hidden = doc.get("target_hidden_size")
    if target_hidden is not None and target_hidden != hidden:
        raise ValueError(
            f"{where}: field 'target_hidden_size' = {target_hidden!r}: dspark's drafter needs the target's "
            f"hidden size equal to its own hidden_size = {hidden}"
        )
    out = backbone_config(doc, where)
    block = doc.get("block_size", m.get("block_size"))
    if block is None:
        raise ValueError(f"{where}: field 'block_size' is missing (checked the top level and dflash_config)")
    if isinstance(block, bool) or not isinstance(block, int) or block < 2:
        raise ValueError(f"{where}: field 'block_size' = {block!r} must be an int >= 2 (the anchor + drafts)")
    mask = m.get("mask_token_id")
    if mask is None:
        raise ValueError(f"{where}: field dflash_config.mask_token_id is missing")
    ids = m.get("target_layer_ids")
    num_target = doc.get("num_target_layers")
    if ids is None:
        if num_target is None:
            raise ValueError(
                f"{where}: field dflash_config.target_layer_ids is missing (and no num_target_layers to "
                "derive it from)"
            )
        ids = spread_layer_ids(int(num_target), int(doc.get("num_hidden_layers") or 1))
    out.update(
        architectures=["Qwen3DSparkModel"],
        block_size=block,
        sample_from_anchor=False,
        mask_token_id=mask,
        target_layer_ids=list(ids),
        markov_rank=0,
        enable_confidence_head=False,
        confidence_head_with_markov=False,
    )
    if num_target is not None:
        out["num_target_layers"] = num_target
    return out


def read_family_tensors(root: Path) -> dict[str, Tensor]:
    """The weights, with the heads' older ``logit_head.`` nesting removed.

    Where a file holds both names (SpecForge's ``export_to_hf`` writes the model's tensors and then the
    checkpoint's own keys, so a nested checkpoint exports both), the un-nested one wins, as in SpecForge's
    ``normalize_draft_head_checkpoint_keys`` (specforge 0.2.0 modeling/draft/dflash.py:329), whatever the order.
    """
    out: dict[str, Tensor] = {}
    nested: dict[str, Tensor] = {}
    for name, t in ckpt.read_tensors(root).items():
        short = name
        for pre in HEAD_PREFIXES:
            short = short.removeprefix(pre)
        (out if short == name else nested)[short] = t
    return {**nested, **out}


def read(path: str | os.PathLike) -> Packaged:
    root = Path(path)
    where = str(root / ckpt.CONFIG_NAME)
    doc = read_json(root / ckpt.CONFIG_NAME)
    m = method_config(doc, where)
    projector = m.get("projector_type", "dflash")
    if projector != "dflash":
        raise ValueError(
            f"{where}: field dflash_config.projector_type = {projector!r}: a DFlashDraftModel has projector "
            "'dflash' (a 'dspark' projector is SpecForge's DSpark packaging)"
        )
    return Packaged(family_config(doc, where), read_family_tensors(root), None, NAME, str(root))
