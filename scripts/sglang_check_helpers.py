# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of ``check_sglang_package.py``: SGLang's server arguments, runtime context, distributed state
and draft-model loader on CPU, and the comparison of a loaded SGLang draft model with dspark's
``model.safetensors``.

Everything here calls SGLang's own code. Two packages SGLang imports on the way to its draft models but never
calls there are replaced by empty stand-ins (:func:`install_stand_ins`): ``torchvision`` (its multimodal configs;
the wheels on the package index are built for another torch) and ``vllm`` (``RotaryEmbedding`` imports
``vllm._custom_ops.rotary_embedding`` as a fallback kernel for non-CUDA devices; nothing here runs a kernel).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import socket
import sys
import types
from pathlib import Path

import torch
from speculators_check_common import stacked_place

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RAGGED_MODE = "SGLANG_RAGGED_VERIFY_MODE"  # "static" (default): no confidence head; "cap-accept": built
_STATE: dict = {}


class _Anything:
    """What a stand-in module hands out for any name: callable, subclassable, with any attribute."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Anything()

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __mro_entries__(self, bases):
        return (object,)


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: set[str]):
        self.roots = roots

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"

        def attr(name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Anything()

        module.__getattr__ = attr
        return module

    def exec_module(self, module) -> None:
        pass


def install_stand_ins() -> None:
    """Empty ``torchvision`` and ``vllm`` modules (see the module docstring), before SGLang is imported."""
    if not any(isinstance(f, _StandIns) for f in sys.meta_path):
        sys.meta_path.insert(0, _StandIns({"torchvision", "vllm"}))


def sglang_modules() -> dict:
    """The SGLang functions and classes the check calls (ImportError when SGLang cannot be imported)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.model_loader.loader import _get_quantization_config, _initialize_model, get_model_loader
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.models.dspark import Qwen3DSparkModel
    from sglang.srt.runtime_context import get_context, get_parallel
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
    from sglang.srt.speculative.dspark_components.dspark_config import (
        get_dspark_sample_from_anchor,
        parse_dspark_draft_config,
        resolve_runtime_config,
    )
    from sglang.srt.utils.hf_transformers_utils import get_config

    return dict(
        LoadConfig=LoadConfig,
        ModelConfig=ModelConfig,
        init_distributed_environment=init_distributed_environment,
        initialize_model_parallel=initialize_model_parallel,
        _get_quantization_config=_get_quantization_config,
        _initialize_model=_initialize_model,
        get_model_loader=get_model_loader,
        set_default_torch_dtype=set_default_torch_dtype,
        Qwen3DSparkModel=Qwen3DSparkModel,
        get_context=get_context,
        get_parallel=get_parallel,
        ServerArgs=ServerArgs,
        parse_dflash_draft_config=parse_dflash_draft_config,
        get_dspark_sample_from_anchor=get_dspark_sample_from_anchor,
        parse_dspark_draft_config=parse_dspark_draft_config,
        resolve_runtime_config=resolve_runtime_config,
        get_config=get_config,
    )


def server_args(target_dir: Path, draft_dir: Path, algorithm: str, dtype: str, num_draft_tokens: int | None):
    """``ServerArgs`` of ``python -m sglang.launch_server --model-path target --speculative-algorithm ...
    --speculative-draft-model-path draft --device cpu``, published as the process's runtime context (what the
    launcher does; SGLang's layers read the parallel widths from it)."""
    s = sglang_modules()
    given = {} if num_draft_tokens is None else {"speculative_num_draft_tokens": num_draft_tokens}
    args = s["ServerArgs"](
        model_path=str(target_dir),
        speculative_algorithm=algorithm,
        speculative_draft_model_path=str(draft_dir),
        device="cpu",
        dtype=dtype,
        **given,
    )
    s["get_context"]().set_server_args(args)
    if "dist" not in _STATE:  # one process group (world size 1, gloo) for every model
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        s["init_distributed_environment"](
            backend="gloo",
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
        )
        s["get_parallel"]().override_permanently(  # the ranks a one-process launcher stamps
            tp_rank=0,
            pp_size=1,
            pp_rank=0,
            attn_dp_size=1,
            attn_dp_rank=0,
            attn_tp_size=1,
            attn_tp_rank=0,
            attn_cp_rank=0,
            attn_dcp_size=1,
            moe_ep_size=1,
            moe_ep_rank=0,
            moe_dp_size=1,
            moe_tp_size=1,
        )
        s["initialize_model_parallel"]()
        _STATE["dist"] = True
    return args


def draft_model_config(args, draft_dir: Path):
    """The draft's ``ModelConfig`` as the draft worker builds it (``ModelConfig.from_server_args``)."""
    return sglang_modules()["ModelConfig"].from_server_args(
        args, model_path=str(draft_dir), is_draft_model=True
    )


def load_draft(model_config, file: dict[str, torch.Tensor] | None = None):
    """SGLang's ``DefaultModelLoader.load_model`` step by step: build the registry's class for the draft's
    architecture, set every parameter to NaN (:func:`poison`), read the checkpoint folder's tensors (or
    ``file``) through the model's own ``load_weights``, post-process."""
    s = sglang_modules()
    load_config = s["LoadConfig"]()
    loader = s["get_model_loader"](load_config, model_config)
    cpu = torch.device("cpu")
    with s["set_default_torch_dtype"](model_config.dtype):
        with cpu:
            model = s["_initialize_model"](
                model_config, load_config, s["_get_quantization_config"](model_config, load_config)
            )
        poison(model)
        weights = loader._get_all_weights(model_config, model) if file is None else iter(file.items())
        loader.load_weights_and_postprocess(model, weights, cpu)
    return model.eval()


def poison(model) -> None:
    """NaN in every float parameter: what loading leaves untouched stays visible."""
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.fill_(float("nan"))


def untouched(model) -> list[str]:
    return [n for n, p in model.named_parameters() if p.numel() and p.is_floating_point() and p.isnan().any()]


def sglang_slice(params: dict[str, torch.Tensor], name: str, model) -> tuple[str, torch.Tensor | None]:
    """Where the checkpoint tensor ``name`` landed in the loaded SGLang model: its parameter, or the shard of a
    stacked projection. None when SGLang has no such parameter."""
    # the backbone's only are stacked: the heads load by name (models/dspark.py:627-650)
    return stacked_place(params, name, model, stack=name.startswith("layers."))


def compare(
    model, file: dict[str, torch.Tensor], skipped: tuple[str, ...] = ()
) -> tuple[list[str], list[str]]:
    """``(bad, casts)``: the file tensors (other than those starting with ``skipped``) whose loaded values
    (shape, then bits) differ from what the SGLang model holds or that have no place in it, and those held in
    another dtype that represents every stored value exactly (a bf16 tensor in a float32 parameter)."""
    params = dict(model.named_parameters())
    bad, casts = [], []
    for name, t in file.items():
        if name.startswith(skipped):
            continue
        full, p = sglang_slice(params, name, model)
        if p is None:
            bad.append(f"{name}: no SGLang parameter {full}")
        elif tuple(p.shape) != tuple(t.shape):
            bad.append(f"{name} {tuple(t.shape)} -> {full} {tuple(p.shape)}")
        elif not torch.equal(p.detach(), t.to(p.dtype)) or not torch.equal(p.detach().to(t.dtype), t):
            bad.append(f"{name}: values differ in {full} ({t.dtype} stored, {p.dtype} held)")
        elif p.dtype != t.dtype:
            casts.append(f"{name} {t.dtype} -> {p.dtype}")
    return bad, casts
