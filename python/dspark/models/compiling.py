# SPDX-License-Identifier: Apache-2.0
"""``torch.compile`` of the models' dense per-row modules, in place (``DSparkDecoder.compile``).

``nn.Module.compile`` keeps parameter names (checkpoints load and save as before) and leaves the custom ops —
paged attention, Markov sampling, confidence — eager. What is compiled are the modules made of many small
elementwise kernels: an RMSNorm is about six kernels eagerly (cast, square, mean, rsqrt, two products) and one
compiled; an MLP's activation and product fuse. That matters where a forward is hundreds of small kernels (a
GPU at small batches, even inside a CUDA graph).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

# the class-name endings of the target modules compiled (HF Llama / Qwen2 / Qwen3 / Mistral / Gemma families)
TARGET_MODULE_SUFFIXES = ("RMSNorm", "MLP")


def compile_drafter(drafter: nn.Module, options: dict[str, Any]) -> None:
    """Compile every draft layer's norms and MLP, the final norm and the context projection ``fc`` +
    ``hidden_norm``."""
    for layer in drafter.layers:
        layer.input_layernorm.compile(**options)
        layer.post_attention_layernorm.compile(**options)
        layer.mlp.compile(**options)
    for m in (drafter.norm, drafter.fc, drafter.hidden_norm):
        m.compile(**options)


def compile_target_blocks(model: nn.Module, options: dict[str, Any]) -> list[nn.Module]:
    """Compile the target's modules whose class name ends in one of ``TARGET_MODULE_SUFFIXES``; returns them
    (for :func:`restore_compiled`). A model without such modules is left as it is.

    One compiled ``forward`` per class, shared by its instances (an instance attribute ``forward`` that takes
    the module as its first argument): compiling each instance (``nn.Module.compile``) would compile its own
    graph per layer and stop at dynamo's recompile limit after 8 of them."""
    compiled: dict[type, Any] = {}
    done = []
    for m in model.modules():
        cls = type(m)
        if not cls.__name__.endswith(TARGET_MODULE_SUFFIXES) or "forward" in vars(m):
            continue
        if cls not in compiled:
            compiled[cls] = torch.compile(cls.forward, **options)
        m.forward = functools.partial(compiled[cls], m)
        done.append(m)
    return done


def restore_compiled(modules: list[nn.Module]) -> None:
    """Undo :func:`compile_target_blocks`: the modules run their class's ``forward`` again."""
    for m in modules:
        vars(m).pop("forward", None)
