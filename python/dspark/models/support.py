# SPDX-License-Identifier: Apache-2.0
"""Which Hugging Face causal LMs :class:`dspark.models.target.TargetAdapter` runs, and how it reaches their layers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

TESTED_FAMILIES = ("llama (incl. SmolLM2)", "qwen2", "qwen3", "mistral")
_SUPPORT_NOTE = (
    "dspark's TargetAdapter supports decoder-only causal LMs (XxxForCausalLM) whose attention goes through "
    "transformers' AttentionInterface (model._supports_attention_backend) and whose decoder layers are at "
    f"model.model.layers; tested families: {', '.join(TESTED_FAMILIES)}"
)


class UnsupportedModelError(ValueError):
    """The model cannot run through :class:`TargetAdapter`; the message names the class and why."""


def tap_layers(layers: nn.ModuleList, layer_ids: Sequence[int], store: Any) -> list:
    """Hooks that call ``store(layer_id, hidden [B, T, H])`` during a forward, for each tapped layer.

    Layer ``l >= 0`` is the output of decoder layer ``l`` (HF's ``hidden_states[l + 1]``); ``-1`` is the input of
    decoder layer 0, i.e. the embedding output (HF's ``hidden_states[0]``, DeepSpec's ``-1``). Returns the hook
    handles (``.remove()`` each when done).
    """
    handles = []
    for layer in layer_ids:
        if layer == -1:

            def pre(_mod, args, kwargs):
                store(-1, args[0] if args else kwargs["hidden_states"])

            handles.append(layers[0].register_forward_pre_hook(pre, with_kwargs=True))
        else:

            def post(_mod, _args, output, layer=layer):
                store(layer, output[0] if isinstance(output, tuple) else output)

            handles.append(layers[layer].register_forward_hook(post))
    return handles


def decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    """The decoder layers of a Llama-style causal LM (``model.model.layers``), or None where it has none."""
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    return layers if isinstance(layers, nn.ModuleList) else None


def check_supported(model: nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` naming the model class and what is supported."""
    name = type(model).__name__
    config = getattr(model, "config", None)
    reasons = []
    if config is None or not hasattr(model, "set_attn_implementation"):
        reasons.append("it is not a transformers PreTrainedModel")
    else:
        if getattr(config, "is_encoder_decoder", False):
            reasons.append("it is an encoder-decoder model")
        if not name.endswith("ForCausalLM") or model.get_output_embeddings() is None:
            reasons.append("it is not a causal LM with an LM head")
        if not getattr(model, "_supports_attention_backend", False):
            reasons.append("its attention does not go through transformers' AttentionInterface")
        layers = decoder_layers(model)
        if layers is None or not all(hasattr(getattr(m, "self_attn", None), "layer_idx") for m in layers):
            reasons.append(
                "its decoder layers (model.model.layers[i].self_attn with layer_idx) were not found"
            )
    if reasons:
        raise UnsupportedModelError(f"{name} is not supported: {'; '.join(reasons)}. {_SUPPORT_NOTE}.")
