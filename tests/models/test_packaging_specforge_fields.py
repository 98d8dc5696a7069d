# SPDX-License-Identifier: Apache-2.0
"""SpecForge packaging facts found by scripts/check_specforge_package.py against specforge 0.2.0, pinned here
without SpecForge installed (docs/file-formats.md, "SpecForge")."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark import DSparkDrafter
from dspark.models import packagings
from tests.models.drafter_fixtures import tiny_qwen3_target
from tests.models.packaging_fixtures import write_specforge_dspark
from tests.models.test_packagings import rand


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3_target()


def no_anchor(tmp_path, target, **kw) -> DSparkDrafter:
    """A dspark drafter in SpecForge's block convention (sample_from_anchor=false)."""
    torch.manual_seed(0)
    d = DSparkDrafter.from_config(
        target, block_size=3, target_layer_ids=[0, 2, 4], initializer_range=0.2, **kw
    )
    d.save_pretrained(tmp_path / "src")
    p = tmp_path / "src" / "config.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "sample_from_anchor": False}))
    return DSparkDrafter.from_pretrained(tmp_path / "src", target=target)


def method(folder) -> dict:
    return json.loads((folder / "config.json").read_text())["dflash_config"]


def test_confidence_only_drafter_writes_with_markov_false(tmp_path, target):
    # from_config's default confidence_head_with_markov=True means no Markov input when markov_rank=0
    # (confidence_input_rank 0); SpecForge raises on true without a Markov head (modeling/draft/dspark.py:354)
    d = no_anchor(tmp_path, target, markov_rank=0, enable_confidence_head=True)
    assert d.config.confidence_head_with_markov and d.config.confidence_input_rank == 0
    d.save_pretrained(tmp_path / "sf", format="specforge")
    m = method(tmp_path / "sf")
    assert m["projector_type"] == "dspark" and m["enable_confidence_head"] is True
    assert m["confidence_head_with_markov"] is False and m["markov_rank"] == 0
    assert load_file(str(tmp_path / "sf" / "model.safetensors"))["confidence_head.proj.weight"].shape == (
        1,
        32,
    )
    back = DSparkDrafter.from_pretrained(tmp_path / "sf", target=target)
    assert back.config.enable_confidence_head and back.config.confidence_input_rank == 0


def test_markov_confidence_drafter_keeps_with_markov_true(tmp_path, target):
    # negative control: with a Markov head the flag is written as is, and the head's input grows by the rank
    d = no_anchor(tmp_path, target, markov_rank=6, enable_confidence_head=True)
    d.save_pretrained(tmp_path / "sf", format="specforge")
    m = method(tmp_path / "sf")
    assert m["confidence_head_with_markov"] is True and m["markov_rank"] == 6
    assert load_file(str(tmp_path / "sf" / "model.safetensors"))["confidence_head.proj.weight"].shape == (
        1,
        38,
    )


def _nested_export(tmp_path, nested_first: bool):
    """A folder holding each head tensor twice, as SpecForge's export_to_hf writes a checkpoint whose heads
    were nested under ``logit_head.`` (the model's un-nested tensors, then the checkpoint's own keys)."""
    t = rand()
    folder = write_specforge_dspark(tmp_path / f"sf{int(nested_first)}", t)
    file = load_file(str(folder / "model.safetensors"))
    heads = [k for k in file if k.startswith(("markov_head.", "confidence_head."))]
    nested = {"logit_head." + k: file[k] + 1.0 for k in heads}  # other values: which one won is visible
    both = {**nested, **file} if nested_first else {**file, **nested}
    save_file(both, str(folder / "model.safetensors"))
    return folder, file, heads


@pytest.mark.parametrize("nested_first", [True, False])
def test_unnested_head_name_wins_when_both_present(tmp_path, nested_first):
    # SpecForge's normalize_draft_head_checkpoint_keys keeps an existing un-nested key (dflash.py:329)
    folder, file, heads = _nested_export(tmp_path, nested_first)
    p = packagings.read(folder)
    assert heads and all(torch.equal(p.tensors[k], file[k]) for k in heads)
    assert not any(k.startswith("logit_head.") for k in p.tensors)


def test_nested_head_name_alone_is_read(tmp_path):
    # negative control: an early checkpoint with only the nested names still loads them
    folder = write_specforge_dspark(tmp_path / "sf", rand())
    file = load_file(str(folder / "model.safetensors"))
    moved = {
        ("logit_head." + k if k.startswith(("markov_head.", "confidence_head.")) else k): v
        for k, v in file.items()
    }
    save_file(moved, str(folder / "model.safetensors"))
    p = packagings.read(folder)
    assert sorted(p.tensors) == sorted(file)
    assert all(torch.equal(p.tensors[k], file[k]) for k in file)
