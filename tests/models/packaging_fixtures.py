# SPDX-License-Identifier: Apache-2.0
"""Tiny drafter checkpoints written by hand in each foreign packaging, from the fields its loader reads
(docs/file-formats.md, "Drafter packagings"), never through dspark's writers."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

# the Qwen3 fields of tests.models.drafter_fixtures.tiny_config (the drafter's own transformer)
QWEN3 = {
    "model_type": "qwen3",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 64,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": None,
}
BACKBONE = ("layers.", "fc.", "hidden_norm.", "norm.")


def backbone(tensors: dict) -> dict:
    return {n: t for n, t in tensors.items() if n.startswith(BACKBONE)}


def heads(tensors: dict) -> dict:
    return {n: t for n, t in tensors.items() if n.startswith(("markov_head.", "confidence_head."))}


def _write(path: Path, cfg: dict, tensors: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


def write_zlab_dflash(path: Path, tensors: dict, *, layers: int = 2, block_size: int = 5, **dflash) -> Path:
    """z-lab's ``DFlashDraftModel`` (dflash/model.py): top-level ``block_size``, ``dflash_config``."""
    cfg = {
        **QWEN3,
        "architectures": ["DFlashDraftModel"],
        "num_hidden_layers": layers,
        "layer_types": ["full_attention"] * layers,
        "num_target_layers": 6,
        "block_size": block_size,
        "dflash_config": {"mask_token_id": 61, "target_layer_ids": [0, 2, 4], **dflash},
        "dtype": "float32",
    }
    return _write(path, cfg, backbone(tensors))


def write_specforge_dspark(path: Path, tensors: dict, *, layers: int = 2, block_size: int = 5, **top) -> Path:
    """SpecForge's ``DSparkDraftModel`` (configs/qwen3-8b-dspark.json's fields)."""
    cfg = {
        **QWEN3,
        "architectures": ["DSparkDraftModel"],
        "auto_map": {"AutoModel": "dspark.DSparkDraftModel"},
        "num_hidden_layers": layers,
        "layer_types": ["full_attention"] * layers,
        "max_window_layers": layers,
        "num_target_layers": 6,
        "block_size": block_size,
        "dflash_config": {
            "attention_mode": "gqa",
            "confidence_head_alpha": 1.0,
            "confidence_head_with_markov": True,
            "enable_confidence_head": True,
            "markov_head_type": "vanilla",
            "markov_rank": 6,
            "mask_token_id": 61,
            "projector_type": "dspark",
            "target_layer_ids": [0, 2, 4],
        },
        "dtype": "float32",
        **top,
    }
    return _write(path, cfg, {**backbone(tensors), **heads(tensors)})


def write_speculators_dspark(
    path: Path,
    tensors: dict,
    target,
    ids: torch.Tensor | None,
    *,
    layers: int = 2,
    block_size: int = 4,
    d2t: torch.Tensor | None = None,
    t2d: torch.Tensor | None = None,
    **top,
) -> Path:
    """vLLM speculators' DSpark (speculators models/dspark/config.py + model.py's draft vocabulary): with
    ``ids``, ``lm_head`` and ``markov_w2`` hold those rows only, plus ``d2t`` offsets and the ``t2d`` mask."""
    V = 64
    tl = {**QWEN3, "num_hidden_layers": layers, "layer_types": ["full_attention"] * layers}
    body = {**backbone(tensors), **heads(tensors)}
    body["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    lm = target.get_output_embeddings().weight.detach().clone()
    if ids is not None:
        Vd = ids.numel()
        body["lm_head.weight"] = lm[ids].clone()
        body["markov_head.markov_w2.weight"] = body["markov_head.markov_w2.weight"][ids].clone()
        body["d2t"] = ids - torch.arange(Vd) if d2t is None else d2t
        mask = torch.zeros(V, dtype=torch.bool)
        mask[ids] = True
        body["t2d"] = mask if t2d is None else t2d
    else:
        Vd = V
        body["lm_head.weight"] = lm
    cfg = {
        "architectures": ["DSparkSpeculator"],
        "speculators_model_type": "dspark",
        "speculators_version": "0.5.0",
        "transformer_layer_config": tl,
        "draft_vocab_size": Vd,
        "block_size": block_size,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [1, 3, 5],
        "mask_token_id": 61,
        "sliding_window_non_causal": False,
        "sample_from_anchor": True,
        "markov_rank": 6,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "speculators_config": {
            "algorithm": "dspark",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": block_size}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": "tiny-qwen3", "architectures": ["Qwen3ForCausalLM"]},
        },
        **top,
    }
    return _write(path, cfg, body)
