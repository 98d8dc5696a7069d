# SPDX-License-Identifier: Apache-2.0
"""SpecForge's DSpark packaging (``DSparkDraftModel``, ``dflash_config.projector_type = "dspark"``).

The z-lab DFlash config plus the heads' fields in ``dflash_config`` (``markov_rank``, ``markov_head_type``,
``enable_confidence_head`` / ``confidence_head_alpha``, ``confidence_head_with_markov``, ``attention_mode``);
tensors as DeepSpec names them, no ``embed_tokens`` / ``lm_head``. SpecForge drafts from slots
``1 .. block_size - 1`` with the anchor as the Markov head's first previous token, so it is
``sample_from_anchor=false`` in dspark. Writing refuses what its loader cannot build and copies the heads' fields
and ``sample_from_anchor: false`` to the top level, where SGLang reads them (docs/file-formats.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from dspark.models import checkpoint as ckpt
from dspark.models.config import DrafterConfig
from dspark.models.packagings import dflash
from dspark.models.packagings.base import (
    EMBEDDINGS,
    Packaged,
    qwen3_fields,
    read_json,
    refuse_dspark_only,
    write_json,
    write_tensors,
)

NAME = "specforge"
ARCHITECTURE = "DSparkDraftModel"
HEAD_FIELDS = ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")


def matches(doc: dict) -> bool:
    m = doc.get("dflash_config")
    projector = m.get("projector_type") if isinstance(m, dict) else None
    return projector == "dspark" or ARCHITECTURE in (doc.get("architectures") or [])


def read(path: str | os.PathLike) -> Packaged:
    root = Path(path)
    where = str(root / ckpt.CONFIG_NAME)
    doc = read_json(root / ckpt.CONFIG_NAME)
    m = dflash.method_config(doc, where)
    projector = m.get("projector_type", "dspark")
    if projector != "dspark":
        raise ValueError(
            f"{where}: field dflash_config.projector_type = {projector!r}: a DSparkDraftModel needs 'dspark' "
            "(known projectors: 'dflash', 'dspark')"
        )
    if doc.get("sample_from_anchor", False) is not False:
        raise ValueError(
            f"{where}: field sample_from_anchor = {doc['sample_from_anchor']!r}: SpecForge's DSparkDraftModel "
            "drafts from slots 1 .. block_size - 1 (false, or absent)"
        )
    out = dflash.family_config(doc, where)
    for key in HEAD_FIELDS:  # nested first, the top level as SGLang's export normaliser accepts it too
        top, nested = doc.get(key), m.get(key)
        if top is not None and nested is not None and top != nested:
            raise ValueError(f"{where}: field {key}: top level {top!r} != dflash_config.{key} {nested!r}")
    value = lambda key, default: m.get(key, doc.get(key, default))  # noqa: E731
    alpha = value("confidence_head_alpha", 0.0) or 0.0
    out.update(
        markov_rank=value("markov_rank", 0) or 0,
        markov_head_type=str(value("markov_head_type", "vanilla")).lower(),
        enable_confidence_head=value("enable_confidence_head", alpha > 0),
        # SpecForge's default is false, DeepSpec's true: always explicit in dspark's config
        confidence_head_with_markov=value("confidence_head_with_markov", False),
    )
    return Packaged(out, dflash.read_family_tensors(root), None, NAME, str(root))


def write(path: str | os.PathLike, p: Packaged) -> None:
    cfg = DrafterConfig.from_dict(p.config)
    refuse_dspark_only(p.config, NAME)
    if cfg.sample_from_anchor:
        raise ValueError(
            "format='specforge': this drafter's anchor slot predicts the first draft (sample_from_anchor=true, "
            "DeepSpec's convention, what dspark train makes); SpecForge's DSparkDraftModel drafts from slots "
            "1 .. block_size - 1 only and has no field to say otherwise. Save with format='deepspec' (SGLang "
            "serves that layout as Qwen3DSparkModel) or format='speculators' (vLLM)"
        )
    if p.draft_vocab is not None:
        raise ValueError(
            "format='specforge': SpecForge's layout has no draft vocabulary (no d2t / reduced LM head); "
            "clear it (drafter.set_draft_vocab(None)) or save with format='speculators'"
        )
    heads = cfg.has_markov or cfg.enable_confidence_head
    method = {
        "projector_type": "dspark" if heads else "dflash",
        "mask_token_id": cfg.mask_token_id,
        "target_layer_ids": list(cfg.target_layer_ids),
    }
    if heads:
        method.update(
            attention_mode="mha" if cfg.num_key_value_heads == cfg.num_attention_heads else "gqa",
            markov_rank=cfg.markov_rank,
            markov_head_type=cfg.markov_head_type,
            enable_confidence_head=cfg.enable_confidence_head,
            # without a Markov head dspark's confidence input has no Markov part (confidence_input_rank 0) and
            # SpecForge refuses true there (specforge 0.2.0 modeling/draft/dspark.py:354): write false
            confidence_head_with_markov=cfg.confidence_head_with_markov and cfg.has_markov,
            confidence_head_alpha=1.0 if cfg.enable_confidence_head else 0.0,
        )
    doc = qwen3_fields(p.config)
    doc.update(
        architectures=[ARCHITECTURE if heads else dflash.ARCHITECTURE],
        block_size=cfg.block_slots,
        dflash_config=method,
    )
    if heads:
        # SGLang's DSpark model reads the heads' fields from the top level and defaults to drafting from the
        # anchor's slot (sglang 0.5.23 models/dspark.py:386-397, dspark_config.py:29-31); SpecForge reads them
        # nested or at the top level and ignores sample_from_anchor (docs/file-formats.md, "specforge")
        doc.update({key: method[key] for key in HEAD_FIELDS}, sample_from_anchor=False)
    if cfg.num_target_layers is not None:
        doc["num_target_layers"] = cfg.num_target_layers
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    write_tensors(root, {n: t for n, t in p.tensors.items() if n not in EMBEDDINGS})
    write_json(root / ckpt.CONFIG_NAME, doc)
