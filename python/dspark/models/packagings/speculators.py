# SPDX-License-Identifier: Apache-2.0
"""vLLM's ``speculators`` packaging (``speculators_model_type`` ``"dflash"`` or ``"dspark"``).

``config.json``: ``speculators_model_type``, ``transformer_layer_config`` (the drafter's Qwen3 config; its
``vocab_size`` is the target's), ``draft_vocab_size``, ``block_size``, ``aux_hidden_state_layer_ids`` (HF
``hidden_states`` indices: DeepSpec's ``target_layer_ids`` + 1), ``mask_token_id``, ``sample_from_anchor``, the
DSpark heads' fields, and ``speculators_config{algorithm, proposal_methods[{proposal_type, speculative_tokens}],
default_proposal_method, verifier{name_or_path, architectures}}``. Tensors: DeepSpec's names, plus with a
reduced vocabulary ``lm_head.weight`` / ``markov_head.markov_w2.weight`` of ``draft_vocab_size`` rows, ``d2t``
(int64 offsets: target id = draft id + ``d2t[draft id]``) and ``t2d`` (bool over the target vocabulary).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import Tensor

from dspark.models import checkpoint as ckpt
from dspark.models.config import DrafterConfig
from dspark.models.packagings.base import (
    DRAFT_ROWS_ONLY,
    QWEN3_FIELDS,
    REDUCED_TABLES,
    Packaged,
    backbone_config,
    expand_rows,
    field,
    qwen3_fields,
    read_json,
    reduce_rows,
    refuse_dspark_only,
    write_json,
    write_tensors,
)

NAME = "speculators"
MODEL_TYPES = ("dflash", "dspark")
ARCHITECTURES = {"dflash": "DFlashSpeculator", "dspark": "DSparkSpeculator"}
# the Markov heads vLLM's Qwen3 DSpark draft model builds (vLLM 0.34.0 qwen3_dspark.py: markov_w1 / markov_w2 only)
VLLM_MARKOV_HEADS = ("vanilla",)


def matches(doc: dict) -> bool:
    return "speculators_model_type" in doc


def layer_config(tl: dict) -> dict:
    """``transformer_layer_config`` with its absent fields at speculators' values: it builds the ``model_type``'s
    transformers config class from the dict (Qwen3Config without one), so an absent ``head_dim`` is Qwen3's 128
    and an absent ``num_key_value_heads`` its 32, not dspark's hidden_size / heads and heads (speculators 0.9.0
    ``models/dflash/config.py`` lines 89-100). Older writers' ``to_diff_dict`` drops such default values."""
    rope_given = any(k in tl for k in ("rope_parameters", "rope_theta", "rope_scaling"))
    missing = [k for k in QWEN3_FIELDS if k not in tl] + ([] if rope_given else ["rope_parameters"])
    if not missing:
        return tl
    try:
        from transformers import AutoConfig, Qwen3Config

        kind = type(AutoConfig.for_model(tl["model_type"])) if "model_type" in tl else Qwen3Config
        full = kind(**tl).to_dict()
    except Exception:
        # no transformers, or a config its class refuses: read the fields as given (named when missing)
        return tl
    return {**tl, **{k: full[k] for k in missing if full.get(k) is not None}}


def verifier_architectures(verifier: str | None) -> list[str]:
    """The verifier's ``architectures`` when it is a local folder, as speculators' ``VerifierConfig.from_pretrained``
    records them (speculators 0.9.0 ``config.py`` lines 78-98); ``[]`` otherwise (accepted there)."""
    path = Path(verifier) / ckpt.CONFIG_NAME if verifier else None
    if path is None or not path.is_file():
        return []
    try:
        doc = ckpt.read_json(path)
    except (OSError, ValueError):  # informational only: a bad verifier config does not stop the write
        return []
    archs = doc.get("architectures") if isinstance(doc, dict) else None
    return [str(a) for a in archs] if isinstance(archs, list) else []


def draft_ids(d2t: Tensor, t2d: Tensor | None, draft_vocab_size: int, vocab_size: int, where: str) -> Tensor:
    """The draft vocabulary's target ids from ``d2t`` (checked against ``t2d`` when present)."""
    if d2t.dim() != 1 or d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise ValueError(
            f"{where}: tensor 'd2t' must be a 1-D integer offset table, got {d2t.dtype} {list(d2t.shape)}"
        )
    if d2t.numel() != draft_vocab_size:
        raise ValueError(
            f"{where}: tensor 'd2t' has length {d2t.numel()}, expected draft_vocab_size = {draft_vocab_size}"
        )
    ids = torch.arange(draft_vocab_size, dtype=torch.int64) + d2t.to(torch.int64)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size or bool((ids[1:] <= ids[:-1]).any()):
        raise ValueError(
            f"{where}: tensor 'd2t' must map draft ids to strictly increasing target ids in [0, {vocab_size}) "
            "(target id = draft id + d2t[draft id])"
        )
    if t2d is not None:
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        mask[ids] = True
        if t2d.dim() != 1 or t2d.numel() != vocab_size or not torch.equal(t2d.to(torch.bool), mask):
            raise ValueError(
                f"{where}: tensor 't2d' is inconsistent with 'd2t' (expected a bool mask of length "
                f"{vocab_size} that is true exactly at the {draft_vocab_size} target ids d2t maps to)"
            )
    return ids


def read(path: str | os.PathLike) -> Packaged:
    root = Path(path)
    where = str(root / ckpt.CONFIG_NAME)
    doc = read_json(root / ckpt.CONFIG_NAME)
    mtype = doc.get("speculators_model_type")
    if mtype not in MODEL_TYPES:
        raise ValueError(
            f"{where}: field 'speculators_model_type' = {mtype!r}: dspark reads {list(MODEL_TYPES)} "
            "(block drafters; Eagle-3, MTP and others are different models)"
        )
    tl = layer_config(field(doc, "transformer_layer_config", where, dict))
    out = backbone_config(tl, f"{where} (transformer_layer_config)")
    # speculators' save_pretrained writes the dtype at the top level only
    for key in ("dtype", "torch_dtype"):
        if "dtype" not in out and doc.get(key) is not None:
            out["dtype"] = doc[key]
    V = field(tl, "vocab_size", f"{where}: transformer_layer_config", int)
    H = field(tl, "hidden_size", f"{where}: transformer_layer_config", int)
    target_hidden = doc.get("target_hidden_size")
    if target_hidden is not None and target_hidden != H:
        raise ValueError(
            f"{where}: field 'target_hidden_size' = {target_hidden!r}: dspark's drafter needs the target's hidden "
            f"size equal to transformer_layer_config.hidden_size = {H}"
        )
    block = field(doc, "block_size", where, int)
    from_anchor = field(doc, "sample_from_anchor", where, bool, required=False)
    from_anchor = (mtype == "dspark") if from_anchor is None else from_anchor  # speculators' defaults
    drafts = block - (0 if from_anchor else 1)
    methods = ((doc.get("speculators_config") or {}).get("proposal_methods")) or []
    for k, method in enumerate(methods):
        n = method.get("speculative_tokens") if isinstance(method, dict) else None
        if n is not None and n != drafts:
            raise ValueError(
                f"{where}: field speculators_config.proposal_methods[{k}].speculative_tokens = {n!r}, expected "
                f"{drafts} (block_size {block}, sample_from_anchor {str(from_anchor).lower()}: the block "
                "attends bidirectionally, so it drafts exactly that many)"
            )
    aux = field(doc, "aux_hidden_state_layer_ids", where, list)
    out.update(
        architectures=["Qwen3DSparkModel"],
        block_size=block,
        mask_token_id=field(doc, "mask_token_id", where, int),
        target_layer_ids=[int(i) - 1 for i in aux],  # HF hidden_states index -> decoder layer
        markov_rank=0,
        enable_confidence_head=False,
        confidence_head_with_markov=True,
    )
    if not from_anchor:
        out["sample_from_anchor"] = False
    if mtype == "dspark":  # speculators' pydantic defaults when a field is absent
        out.update(
            markov_rank=doc.get("markov_rank", 256),
            markov_head_type=doc.get("markov_head_type", "vanilla"),
            enable_confidence_head=doc.get("enable_confidence_head", True),
            confidence_head_with_markov=doc.get("confidence_head_with_markov", True),
        )
    tensors = {n: t for n, t in ckpt.read_tensors(root).items() if not n.startswith("verifier_")}
    d2t, t2d = tensors.pop("d2t", None), tensors.pop("t2d", None)
    Vd = field(doc, "draft_vocab_size", where, int)
    vocab = None
    if Vd > V:
        raise ValueError(f"{where}: field 'draft_vocab_size' = {Vd} exceeds the vocabulary ({V})")
    if Vd < V:
        if d2t is None:
            raise ValueError(
                f"{where}: draft_vocab_size = {Vd} < vocab_size = {V} but tensor 'd2t' is missing"
            )
        vocab = draft_ids(d2t, t2d, Vd, V, where)
        for name in REDUCED_TABLES:
            t = tensors.get(name)
            if t is not None:
                if t.shape[0] != Vd:
                    raise ValueError(
                        f"{where}: tensor {name!r} has {t.shape[0]} rows, expected draft_vocab_size = {Vd}"
                    )
                tensors[name] = expand_rows(t, vocab, V)
        out[DRAFT_ROWS_ONLY] = True
    return Packaged(out, tensors, vocab, NAME, str(root))


def write(path: str | os.PathLike, p: Packaged, *, verifier: str | None = None) -> None:
    cfg = DrafterConfig.from_dict(p.config)
    refuse_dspark_only(p.config, NAME)
    heads = cfg.has_markov or cfg.enable_confidence_head
    mtype = "dflash" if not heads and not cfg.sample_from_anchor else "dspark"
    tensors = dict(p.tensors)
    V = cfg.vocab_size
    Vd = V
    if p.draft_vocab is not None:
        ids = p.draft_vocab.to(torch.int64)
        Vd = ids.numel()
        if "lm_head.weight" not in tensors:
            raise ValueError(
                "format='speculators': a draft vocabulary needs the LM head's rows (vLLM requires lm_head with "
                "d2t when draft_vocab_size < vocab_size); save with include_embeddings=True"
            )
        for name in REDUCED_TABLES:
            if name in tensors:
                tensors[name] = reduce_rows(tensors[name], ids)
        tensors["d2t"] = ids - torch.arange(Vd, dtype=torch.int64)
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[ids] = True
        tensors["t2d"] = t2d
    elif p.config.get(DRAFT_ROWS_ONLY):
        raise ValueError("format='speculators': config has draft_rows_only but no draft vocabulary is given")
    name = verifier or p.config.get("_name_or_path")
    doc = {
        "architectures": [ARCHITECTURES[mtype]],
        "speculators_model_type": mtype,
        "transformer_layer_config": qwen3_fields(p.config),
        "draft_vocab_size": Vd,
        "block_size": cfg.block_slots,
        "aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids],
        "mask_token_id": cfg.mask_token_id,
        # dspark's block attends bidirectionally. speculators 0.9.0 reads this for sliding-window layers only
        # (dspark has none); vLLM 0.34.0 turns it into dflash_config.causal = not it for every layer of a
        # "dflash" drafter (algos.py update_dflash, qwen3_dflash.py _dflash_layer_causal): false would run the
        # draft block causally there
        "sliding_window_non_causal": True,
        "sample_from_anchor": cfg.sample_from_anchor,
        "speculators_config": {
            "algorithm": mtype,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.block_size}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": name, "architectures": verifier_architectures(name)},
        },
    }
    if cfg.has_markov and cfg.markov_head_type not in VLLM_MARKOV_HEADS:
        warnings.warn(
            f"format='speculators': markov_head_type {cfg.markov_head_type!r} is read by speculators but vLLM "
            f"0.34.0's Qwen3DSparkForCausalLM builds only {list(VLLM_MARKOV_HEADS)} Markov heads: its loader "
            "refuses this checkpoint (no parameter for the head's extra tensors)",
            stacklevel=2,
        )
    if mtype == "dspark":
        doc.update(
            markov_rank=cfg.markov_rank,
            markov_head_type=cfg.markov_head_type,
            enable_confidence_head=cfg.enable_confidence_head,
            # speculators refuses true with markov_rank 0 (models/dspark/core.py lines 54-58); dspark's head then
            # reads no Markov feature either way
            confidence_head_with_markov=cfg.confidence_head_with_markov and cfg.has_markov,
        )
    if cfg.dtype is not None:
        doc["dtype"] = str(cfg.dtype).removeprefix("torch.")
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    write_tensors(root, tensors)
    write_json(root / ckpt.CONFIG_NAME, doc)
