# SPDX-License-Identifier: Apache-2.0
"""Tiny DeepSpec-layout checkpoints written to disk, and tiny HF targets, for the drafter tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.models.deepspec_plain import random_checkpoint_tensors


def tiny_config(
    head_type: str = "vanilla",
    rank: int = 6,
    *,
    confidence: bool | None = None,
    layers: int = 2,
    block_size: int = 4,
    rope_style: str = "parameters",
    hidden: int = 32,
    vocab: int = 64,
    num_target_layers: int = 6,
) -> dict:
    """A config.json dict as DeepSpec writes it (target's Qwen3 fields + DSpark fields)."""
    cfg = {
        "architectures": ["Qwen3DSparkModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": 48,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "max_position_embeddings": 4096,
        "max_window_layers": 28,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "num_hidden_layers": layers,
        "num_target_layers": num_target_layers,
        "block_size": block_size,
        "layer_types": ["full_attention"] * layers,
        "mask_token_id": vocab - 3,
        "target_layer_ids": [0, 2, 4],
        "num_anchors": 512,
        "tie_word_embeddings": False,
        "enable_confidence_head": rank > 0 if confidence is None else confidence,
        "confidence_head_with_markov": True,
        "markov_rank": rank,
        "dtype": "float32",
        "transformers_version": "5.10.2",
    }
    if rank > 0:
        cfg["markov_head_type"] = head_type
    if rope_style == "parameters":
        cfg["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}
    else:
        cfg["rope_theta"] = 10000.0
    return cfg


def write_checkpoint(path: Path, cfg: dict, tensors: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


def random_checkpoint(path: Path, cfg: dict, seed: int = 0, with_embeddings: bool = True):
    gen = torch.Generator().manual_seed(seed)
    tensors = random_checkpoint_tensors(cfg, gen, with_embeddings=with_embeddings)
    write_checkpoint(path, cfg, tensors)
    return tensors


def tiny_qwen3_target(hidden: int = 32, vocab: int = 64, layers: int = 6, seed: int = 0, dtype=torch.float32):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(cfg).to(dtype).eval()


def tiny_llama_target(hidden: int = 32, vocab: int = 64, layers: int = 4, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg).eval()
