# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of ``check_speculators_package.py`` and ``check_vllm_package.py``: the PASS / FAIL
bookkeeping, tensor reading, the tiny draft vocabulary, the drafters they write and the speculators classes
(imported on demand)."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "python")]

from safetensors.torch import load_file  # noqa: E402

IDS = torch.tensor(sorted({0, 1, 2, 5, 7, 11, 13, 40, 50, 63, 96}))  # a draft vocabulary of the tiny targets
# what speculators rebuilds from the verifier instead of reading (models/dflash/core.py _keys_to_ignore_*)
VERIFIER_OWNED = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight")
RESULTS: list[bool] = []


class Failed(Exception):
    pass


def expect(cond: bool, msg: str) -> None:
    if not cond:
        raise Failed(msg)


def check(name: str, fn: Callable[[], str | None]) -> None:
    try:
        note = fn()
    except Failed as e:
        RESULTS.append(False)
        print(f"FAIL  {name}: {e}", flush=True)
    except Exception as e:  # a crash inside either package is a failed check, not the end of the run
        RESULTS.append(False)
        last = traceback.extract_tb(e.__traceback__)[-1]
        print(f"FAIL  {name}: {type(e).__name__}: {e} ({Path(last.filename).name}:{last.lineno})", flush=True)
    else:
        RESULTS.append(True)
        print(f"PASS  {name}" + (f"  [{note}]" if note else ""), flush=True)


def raiser(e: Exception) -> Callable[[], None]:
    """A check that reports ``e`` (a case whose inputs could not be built)."""

    def fn() -> None:
        raise e

    return fn


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


# q/k/v and gate/up checkpoint names -> (the engines' stacked parameter name, shard): vLLM's
# DFlashQwen3Model.hf_to_vllm_mapper.orig_to_new_stacked and SGLang's DFlashDraftModel.load_weights
# stacked_params_mapping agree
STACKED = {
    ".q_proj.": (".qkv_proj.", 0),
    ".k_proj.": (".qkv_proj.", 1),
    ".v_proj.": (".qkv_proj.", 2),
    ".gate_proj.": (".gate_up_proj.", 0),
    ".up_proj.": (".gate_up_proj.", 1),
}


def stacked_place(params: dict, full: str, model, stack: bool = True) -> tuple[str, torch.Tensor | None]:
    """``(name, tensor)``: where a checkpoint tensor, named ``full`` in the engine's naming, landed in
    ``params`` — its parameter, or with ``stack`` the shard of a stacked projection; None when there is none."""
    shard = None
    for old, (new, k) in STACKED.items() if stack else ():
        if old in full:
            full, shard = full.replace(old, new), k
            break
    p = params.get(full)
    if p is None or shard is None:
        return full, p
    return full, stacked_shard(model, full, p, shard)


def stacked_shard(model, full: str, p: torch.Tensor, shard: int) -> torch.Tensor:
    """The rows of an engine's stacked projection ``p`` (the parameter named ``full``) that hold ``shard``:
    q / k / v of a ``qkv_proj`` (sized by its attention module), or gate / up of a ``gate_up_proj``."""
    if ".qkv_proj." in full:
        attn = model.get_submodule(full.rsplit(".qkv_proj.", 1)[0])
        sizes = [attn.q_size, attn.kv_size, attn.kv_size]
    else:
        sizes = [p.shape[0] // 2] * 2
    start = sum(sizes[:shard])
    return p[start : start + sizes[shard]]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# ---- dspark -> speculators ------------------------------------------------------------------------------------
def spec_classes():
    from speculators import SpeculatorModel, SpeculatorModelConfig
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig

    return (
        SpeculatorModel,
        SpeculatorModelConfig,
        {
            "dspark": (DSparkSpeculatorConfig, DSparkDraftModel),
            "dflash": (DFlashSpeculatorConfig, DFlashDraftModel),
        },
    )


def edited(d, target, folder: Path, **fields):
    """The drafter ``d`` with DeepSpec-layout config fields changed (what ``from_config`` has no option for),
    saved to ``folder`` and loaded again for ``target``."""
    import json

    from dspark import DSparkDrafter

    d.save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(fields)
    (folder / "config.json").write_text(json.dumps(cfg))
    return DSparkDrafter.from_pretrained(folder, target=target)


def fresh_drafter(target, **kw):
    """A new random drafter for ``target``: 4 block slots, 2 layers, taps 0-2 unless ``kw`` says otherwise."""
    from dspark import DSparkDrafter

    kw = {"block_size": 4, "num_layers": 2, "target_layer_ids": [0, 1, 2], "initializer_range": 0.2, **kw}
    return DSparkDrafter.from_config(target, **kw).eval()


def with_draft_vocab(d):
    """``d`` with the tiny draft vocabulary :data:`IDS`."""
    d.set_draft_vocab(IDS)
    return d


def built(cases):
    """``(name, family, drafter)`` of each ``(name, family, make)`` case whose ``make()`` builds; a case that
    raises is one FAIL line, and the rest go on."""
    for name, family, make in cases:
        try:
            d = make()
        except Exception as e:
            check(f"[{name}] build the dspark drafter", raiser(e))
            continue
        yield name, family, d
