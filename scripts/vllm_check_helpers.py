# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of ``check_vllm_package.py``: vLLM's configs, distributed state and draft model on CPU, and the
comparison of a loaded vLLM draft model with dspark's ``model.safetensors``.

Everything here calls vLLM's own code; the one thing replaced is ``CpuPlatform.check_and_update_config`` (it
refuses x86 CPUs without triton-cpu, which only vLLM's CPU kernels need; the draft model is built, never run).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from speculators_check_common import stacked_place

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vLLM's own switch to its CPU platform
os.environ.setdefault("HF_HUB_OFFLINE", "1")

VERIFIER = "Qwen/Qwen3-0.6B"  # vLLM auto-detection needs a repository id, not a local folder (config.py:905)
_STATE: dict = {}


def vllm_modules():
    """The vLLM modules the check calls (ImportError when vLLM cannot be imported)."""
    from vllm.config import (
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        SpeculativeConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.model_executor.models.qwen3_dflash import dflash_has_any_non_causal
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.transformers_utils.config import get_config, maybe_override_with_speculators
    from vllm.transformers_utils.configs.speculators import SpeculatorsConfig

    return dict(
        DeviceConfig=DeviceConfig,
        ModelConfig=ModelConfig,
        ParallelConfig=ParallelConfig,
        SpeculativeConfig=SpeculativeConfig,
        VllmConfig=VllmConfig,
        set_current_vllm_config=set_current_vllm_config,
        dflash_has_any_non_causal=dflash_has_any_non_causal,
        ModelRegistry=ModelRegistry,
        get_config=get_config,
        maybe_override_with_speculators=maybe_override_with_speculators,
        SpeculatorsConfig=SpeculatorsConfig,
    )


def cpu_platform() -> None:
    """Let vLLM's CPU platform accept a config without triton-cpu (see the module docstring)."""
    from vllm.platforms import current_platform

    type(current_platform).check_and_update_config = classmethod(lambda cls, vllm_config: None)


def target_config(target_dir: Path):
    v = vllm_modules()
    return v["ModelConfig"](model=str(target_dir), skip_tokenizer_init=True, dtype="float32")


def speculative_config(draft_dir: Path, method: str, n: int | None, target_mc):
    v = vllm_modules()
    given = {} if n is None else {"num_speculative_tokens": n}  # None: left to the speculator's default
    return v["SpeculativeConfig"](
        model=str(draft_dir),
        method=method,
        target_model_config=target_mc,
        target_parallel_config=v["ParallelConfig"](),
        **given,
    )


def vllm_config(target_mc, spec):
    v = vllm_modules()
    cfg = v["VllmConfig"](
        model_config=target_mc, speculative_config=spec, device_config=v["DeviceConfig"]("cpu")
    )
    if "dist" not in _STATE:  # one process group (world size 1, gloo) for every model
        from vllm.distributed import init_distributed_environment, initialize_model_parallel

        with v["set_current_vllm_config"](cfg):
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method="tcp://127.0.0.1:29517",
                backend="gloo",
            )
            initialize_model_parallel(1, 1)
        _STATE["dist"] = True
    return cfg


def build_model(cfg):
    """vLLM's draft model class for the draft's architecture (its registry), built from ``cfg``."""
    v = vllm_modules()
    arch = cfg.speculative_config.draft_model_config.hf_config.architectures[0]
    cls = v["ModelRegistry"].models[arch].load_model_cls()
    with v["set_current_vllm_config"](cfg):
        model = cls(vllm_config=cfg)
    return model


def poison(model) -> None:
    """NaN in every float parameter, -7 in every integer one: what loading leaves untouched stays visible."""
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan") if p.is_floating_point() else -7)


def untouched(model) -> list[str]:
    return [
        n
        for n, p in model.named_parameters()
        if p.numel() and bool((p.isnan() if p.is_floating_point() else p == -7).any())
    ]


def load(model, cfg, file: dict[str, torch.Tensor]) -> None:
    v = vllm_modules()
    with v["set_current_vllm_config"](cfg):
        model.load_weights(iter(file.items()))
        model.process_weights_after_loading()


def vllm_slice(params: dict[str, torch.Tensor], name: str, model) -> tuple[str, torch.Tensor | None]:
    """Where the checkpoint tensor ``name`` landed in the loaded vLLM model: its parameter and the part of it
    (a stacked projection's shard, the rows of a padded vocabulary table). None when vLLM has no such place."""
    if name == "d2t":
        full = "draft_id_to_target_id"
    elif name.startswith("lm_head."):
        full = name
    else:
        full = "model." + name
    return stacked_place(params, full, model)


def compare(model, file: dict[str, torch.Tensor]) -> list[str]:
    """The file tensors whose loaded values (shape, then bits) differ from what the vLLM model holds."""
    params = dict(model.named_parameters())
    bad = []
    for name, t in file.items():
        if name == "t2d":  # training-only: vLLM's loader skips it (qwen3_dspark.py:328)
            continue
        full, p = vllm_slice(params, name, model)
        if p is None:
            bad.append(f"{name}: no vLLM parameter {full}")
            continue
        if t.dim() == 2 and p.dim() == 2 and p.shape[0] > t.shape[0] and p.shape[1] == t.shape[1]:
            p = p[: t.shape[0]]  # a vocabulary table padded by vLLM's VocabParallelEmbedding
        if tuple(p.shape) != tuple(t.shape):
            bad.append(f"{name} {tuple(t.shape)} -> {full} {tuple(p.shape)}")
        elif not torch.equal(p.detach(), t.to(p.dtype)):
            bad.append(f"{name}: values differ in {full}")
    return bad
