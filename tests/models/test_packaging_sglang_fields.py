# SPDX-License-Identifier: Apache-2.0
"""SGLang serving facts found by scripts/check_sglang_package.py against sglang 0.5.23, pinned here without
SGLang installed (docs/file-formats.md, "SGLang")."""

from __future__ import annotations

import json

import pytest
import torch

from dspark import DSparkDrafter
from dspark.cli import main as cli_main
from dspark.models import packagings
from dspark.models.packagings.sglang import serving_notes
from tests.models.drafter_fixtures import tiny_qwen3_target
from tests.models.test_packaging_specforge_fields import no_anchor
from tests.models.test_packagings import IDS

HEAD_FIELDS = ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3_target()


def config(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("head", ["vanilla", "gated"])
def test_specforge_dspark_export_carries_what_sglang_reads_at_the_top_level(tmp_path, target, head):
    # SGLang's DSpark model builds its Markov head from the top-level markov_rank / markov_head_type
    # (models/dspark.py:386-397) and drafts from the anchor's slot unless sample_from_anchor is false
    # (dspark_config.py:29-31); SpecForge's layout drafts from slots 1 ..
    d = no_anchor(tmp_path, target, markov_rank=6, markov_head_type=head, confidence_head_with_markov=False)
    d.save_pretrained(tmp_path / "sf", format="specforge")
    doc = config(tmp_path / "sf")
    assert doc["sample_from_anchor"] is False
    assert {k: doc[k] for k in HEAD_FIELDS} == {k: doc["dflash_config"][k] for k in HEAD_FIELDS}
    assert (doc["markov_rank"], doc["markov_head_type"]) == (6, head)
    back = DSparkDrafter.from_pretrained(tmp_path / "sf", target=target)
    assert not back.config.sample_from_anchor and back.config.markov_head_type == head
    assert not back.config.confidence_head_with_markov


def test_specforge_dflash_export_has_no_dspark_fields(tmp_path, target):
    # negative control: a headless drafter is SGLang's DFlashDraftModel, whose block_size counts the anchor and
    # which reads no sample_from_anchor; nothing DSpark-only is added at the top level
    d = no_anchor(tmp_path, target, markov_rank=0)
    d.save_pretrained(tmp_path / "sf", format="specforge")
    doc = config(tmp_path / "sf")
    assert doc["architectures"] == ["DFlashDraftModel"] and doc["block_size"] == d.config.block_slots
    assert not {"sample_from_anchor", *HEAD_FIELDS} & set(doc)


def test_specforge_reader_refuses_a_top_level_sample_from_anchor_true(tmp_path, target):
    d = no_anchor(tmp_path, target, markov_rank=6)
    d.save_pretrained(tmp_path / "sf", format="specforge")
    p = tmp_path / "sf" / "config.json"
    p.write_text(json.dumps({**config(tmp_path / "sf"), "sample_from_anchor": True}))
    with pytest.raises(ValueError, match=r"config\.json: field sample_from_anchor = True"):
        packagings.read(tmp_path / "sf")


def test_top_level_head_fields_that_disagree_with_dflash_config_are_refused(tmp_path, target):
    d = no_anchor(tmp_path, target, markov_rank=6)
    d.save_pretrained(tmp_path / "sf", format="specforge")
    p = tmp_path / "sf" / "config.json"
    p.write_text(json.dumps({**config(tmp_path / "sf"), "markov_rank": 4}))
    with pytest.raises(ValueError, match=r"field markov_rank: top level 4 != dflash_config\.markov_rank 6"):
        packagings.read(tmp_path / "sf")


def test_deepspec_layout_names_what_sglang_serves_it_as(tmp_path, target):
    # SGLang serves the DeepSpec layout as Qwen3DSparkModel from top-level fields (dspark_config.py:200-320):
    # block_size is its gamma when the anchor's slot drafts
    torch.manual_seed(0)
    d = DSparkDrafter.from_config(target, block_size=3, target_layer_ids=[0, 2, 4], markov_rank=6)
    d.save_pretrained(tmp_path / "ds")
    doc = config(tmp_path / "ds")
    assert doc["architectures"] == ["Qwen3DSparkModel"] and doc["model_type"] == "qwen3"
    assert doc["block_size"] == 3 and "sample_from_anchor" not in doc  # absent: SGLang's default, true
    assert (doc["markov_rank"], doc["markov_head_type"], doc["mask_token_id"]) == (
        6,
        "vanilla",
        d.config.mask_token_id,
    )
    assert doc["target_layer_ids"] == [0, 2, 4]


# ---- what dspark convert says about SGLang ----------------------------------------------------------------------
def packaged(tmp_path, target, name, *, anchor=True, vocab=False, **kw):
    torch.manual_seed(0)
    d = DSparkDrafter.from_config(
        target, block_size=3, target_layer_ids=[0, 2, 4], initializer_range=0.2, **kw
    )
    if not anchor:
        d = no_anchor(tmp_path / name, target, **kw)
    if vocab:
        d.set_draft_vocab(IDS)
    d.save_pretrained(tmp_path / name)
    return packagings.read(tmp_path / name)


def test_serving_notes_say_nothing_for_a_drafter_sglang_serves_as_trained(tmp_path, target):
    p = packaged(tmp_path, target, "plain", markov_rank=6, enable_confidence_head=True)
    assert serving_notes(p, "deepspec") == []
    assert serving_notes(p, "speculators") == []  # not a layout SGLang serves


@pytest.mark.parametrize(
    ("kw", "fmt", "said"),
    [
        ({"markov_rank": 6, "anchor": False}, "deepspec", "--speculative-num-draft-tokens 3"),
        ({"markov_rank": 6, "anchor": False}, "specforge", "--speculative-num-draft-tokens 3"),
        ({"markov_rank": 6, "copy_head": True}, "deepspec", "skips copy_head"),
        ({"markov_rank": 6, "vocab": True}, "deepspec", f"draft vocabulary ({IDS.numel()} ids)"),
        ({"markov_rank": 6, "enable_confidence_head": False}, "deepspec", "SGLANG_RAGGED_VERIFY_MODE=static"),
        ({"markov_rank": 0}, "deepspec", "SGLang cannot serve it"),
        ({"markov_rank": 0, "anchor": False}, "deepspec", "write format='specforge'"),
    ],
)
def test_serving_notes_name_what_sglang_does_differently(tmp_path, target, kw, fmt, said):
    notes = serving_notes(packaged(tmp_path, target, "d", **kw), fmt)
    assert len(notes) == 1 and said in notes[0], notes


def test_a_headless_dflash_drafter_in_specforge_layout_is_served_as_trained(tmp_path, target):
    assert serving_notes(packaged(tmp_path, target, "d", markov_rank=0, anchor=False), "specforge") == []


def test_cli_convert_prints_the_sglang_notes(tmp_path, target, capsys):
    packaged(tmp_path, target, "src", markov_rank=6, anchor=False)
    assert cli_main(["convert", str(tmp_path / "src"), str(tmp_path / "sf"), "--format", "specforge"]) == 0
    err = capsys.readouterr().err
    assert "note (SGLang 0.5.23)" in err and "--speculative-num-draft-tokens 3" in err
    assert cli_main(["convert", str(tmp_path / "src"), str(tmp_path / "sp"), "--format", "speculators"]) == 0
    assert "SGLang" not in capsys.readouterr().err


def test_cli_convert_of_a_headless_drafter_to_specforge_reads_it_back_as_dflash(tmp_path, target, capsys):
    # the specforge writer makes a DFlashDraftModel of it, which dspark detects as the dflash packaging
    packaged(tmp_path, target, "src", markov_rank=0, anchor=False)
    assert cli_main(["convert", str(tmp_path / "src"), str(tmp_path / "sf"), "--format", "specforge"]) == 0
    out = capsys.readouterr()
    assert "(specforge)" in out.out and "SGLang" not in out.err
    assert packagings.detect(tmp_path / "sf") == "dflash"
