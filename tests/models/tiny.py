# SPDX-License-Identifier: Apache-2.0
"""Tiny random Hugging Face causal LMs of the families the target adapter supports (built, never downloaded)."""

from __future__ import annotations

import torch

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


def tiny_config(family: str, layers: int = 3):
    import transformers as tf

    common = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    if family == "llama":
        return tf.LlamaConfig(**common)
    if family == "qwen2":
        return tf.Qwen2Config(**common, use_sliding_window=False)
    if family == "qwen3":
        return tf.Qwen3Config(**common, head_dim=32)  # q/k norms, head_dim != hidden / heads
    if family == "mistral":
        return tf.MistralConfig(**common, sliding_window=None)
    raise ValueError(family)


def tiny_model(family: str, seed: int = 0, layers: int = 3):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, layers), attn_implementation="sdpa")
    with torch.no_grad():  # larger-than-init weights so that attention patterns are far from uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    return model.float().eval()
