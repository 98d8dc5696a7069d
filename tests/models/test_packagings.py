# SPDX-License-Identifier: Apache-2.0
"""Drafter packagings (docs/file-formats.md, "Drafter packagings"): hand-written z-lab DFlash, SpecForge DSpark
and speculators checkpoints load and draft what the equivalent DeepSpec-layout checkpoint drafts; conversions
keep every tensor bit for bit; malformed variants name the file and the field."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark import DSparkDrafter
from dspark.cli import main as cli_main
from dspark.models import packagings
from dspark.models.draft_vocab import save_draft_vocab
from tests.models.deepspec_plain import random_checkpoint_tensors
from tests.models.drafter_fixtures import tiny_config, tiny_qwen3_target, write_checkpoint
from tests.models.packaging_fixtures import (
    write_specforge_dspark,
    write_speculators_dspark,
    write_zlab_dflash,
)

IDS = torch.tensor(sorted({0, 1, 2, 61, *range(5, 64, 2)}))  # a draft vocabulary of the tiny target


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3_target()


def deepspec_like(tmp_path, name, tensors, **over):
    """The DeepSpec-layout equivalent (embeddings shared with the target)."""
    cfg = {**tiny_config(over.pop("head", "vanilla"), over.pop("rank", 6), **over.pop("opts", {})), **over}
    return write_checkpoint(tmp_path / name, cfg, tensors)


def rand(rank=6, block_size=4, confidence=None, seed=0):
    cfg = tiny_config(rank=rank, block_size=block_size, confidence=confidence)
    return random_checkpoint_tensors(cfg, torch.Generator().manual_seed(seed), with_embeddings=False)


def drafts(d, target, temperature=0.0):
    """One draft round after a 9-token prompt: tokens, q logits and confidence (None without the head)."""
    ids = torch.tensor([[3, 17, 5, 40, 22, 9, 31, 8, 12]])
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    d.finish_all()
    d.append_context([0], [d.features_from_hidden_states(hs)[0]])
    out = d.draft([0], ids[0, -1:], temperature, seed=7, return_base_logits=True)
    return out


def same_drafts(a, b, target):
    for temp in (0.0, 1.0):
        x, y = drafts(a, target, temp), drafts(b, target, temp)
        assert torch.equal(x.tokens, y.tokens)
        assert torch.equal(x.draft_logits, y.draft_logits)
        if x.conf is not None or y.conf is not None:
            assert torch.equal(x.conf, y.conf)


def tensors_of(folder):
    return load_file(str(folder / "model.safetensors"))


def assert_same_tensors(a, b):
    ta, tb = tensors_of(a), tensors_of(b)
    assert sorted(ta) == sorted(tb)
    for n in ta:
        assert ta[n].dtype == tb[n].dtype and torch.equal(ta[n], tb[n]), n


# ---- each packaging drafts what its DeepSpec-layout equivalent drafts -------------------------------------------
def test_zlab_dflash_matches_deepspec_layout(tmp_path, target):
    t = rand(rank=0, confidence=False, block_size=5)
    zlab = write_zlab_dflash(tmp_path / "zlab", t)
    ref = deepspec_like(
        tmp_path, "ds", t, rank=0, opts={"block_size": 5, "confidence": False}, sample_from_anchor=False
    )
    assert packagings.detect(zlab) == "dflash"
    a = DSparkDrafter.from_pretrained(zlab, target=target)
    b = DSparkDrafter.from_pretrained(ref, target=target)
    assert a.config.block_size == 4 and a.config.block_slots == 5 and not a.config.sample_from_anchor
    assert a.markov_head is None and a.confidence_head is None
    same_drafts(a, b, target)


def test_zlab_slots_are_the_anchor_conventions_shifted_by_one(tmp_path, target):
    """z-lab drafts token k from slot k + 1 of the same block (dflash/model.py: logits[:, 1 - block_size:])."""
    t = rand(rank=0, confidence=False, block_size=5)
    a = DSparkDrafter.from_pretrained(write_zlab_dflash(tmp_path / "zlab", t), target=target)
    anchor = DSparkDrafter.from_pretrained(
        deepspec_like(tmp_path, "ds", t, rank=0, opts={"block_size": 5, "confidence": False}), target=target
    )
    x, y = drafts(a, target), drafts(anchor, target)
    # blocks of 4 and 5 slots are products of differently shaped buffers (BLAS kernels round differently by
    # row count): equal to float rounding, not bit for bit
    shifted = y.base_logits[:, 1:]
    torch.testing.assert_close(x.base_logits, shifted, atol=1e-6, rtol=1e-5)
    top2 = shifted.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 1e-4  # argmax decided by more than the rounding
    assert clear.any() and torch.equal(x.tokens[clear], shifted.argmax(-1)[clear])
    assert not torch.equal(x.tokens, y.tokens[:, :4])  # the two conventions draft differently here


def test_specforge_dspark_matches_deepspec_layout(tmp_path, target):
    t = rand(block_size=5)
    sf = write_specforge_dspark(tmp_path / "sf", t)
    ref = deepspec_like(tmp_path, "ds", t, opts={"block_size": 5}, sample_from_anchor=False)
    assert packagings.detect(sf) == "specforge"
    a = DSparkDrafter.from_pretrained(sf, target=target)
    assert (
        a.config.markov_rank == 6 and a.config.enable_confidence_head and a.config.confidence_head_with_markov
    )
    same_drafts(a, DSparkDrafter.from_pretrained(ref, target=target), target)


def test_speculators_draft_vocab_matches_deepspec_layout(tmp_path, target):
    t = rand()
    sp = write_speculators_dspark(tmp_path / "sp", t, target, IDS)
    ref = deepspec_like(tmp_path, "ds", t)
    save_draft_vocab(ref, IDS)
    assert packagings.detect(sp) == "speculators"
    a = DSparkDrafter.from_pretrained(sp, target=target)
    b = DSparkDrafter.from_pretrained(ref, target=target)
    assert torch.equal(a.draft_vocab, IDS) and a.shares_embeddings == {"embed_tokens": True, "lm_head": True}
    same_drafts(a, b, target)
    out = drafts(a, target, 1.0)
    outside = torch.ones(64, dtype=torch.bool)
    outside[IDS] = False
    assert bool((out.draft_logits[..., outside] < -1e29).all())  # q = 0 outside the draft vocabulary


def test_speculators_full_vocab_matches(tmp_path, target):
    t = rand()
    a = DSparkDrafter.from_pretrained(
        write_speculators_dspark(tmp_path / "sp", t, target, None), target=target
    )
    assert a.draft_vocab is None
    same_drafts(a, DSparkDrafter.from_pretrained(deepspec_like(tmp_path, "ds", t), target=target), target)


def test_negative_control_a_perturbed_tensor_drafts_differently(tmp_path, target):
    t = rand()
    a = DSparkDrafter.from_pretrained(write_speculators_dspark(tmp_path / "a", t, target, IDS), target=target)
    bad = dict(t)
    bad["markov_head.markov_w2.weight"] = -t["markov_head.markov_w2.weight"]  # one tensor changed
    b = DSparkDrafter.from_pretrained(
        write_speculators_dspark(tmp_path / "b", bad, target, IDS), target=target
    )
    x, y = drafts(a, target), drafts(b, target)
    assert not torch.equal(x.draft_logits, y.draft_logits) and not torch.equal(x.tokens, y.tokens)


# ---- round trips ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_deepspec_to_x_to_deepspec_keeps_every_tensor(tmp_path, fmt):
    t = rand(block_size=5)
    src = deepspec_like(tmp_path, "ds", t, opts={"block_size": 5}, sample_from_anchor=False)
    packagings.convert(src, tmp_path / "x", fmt)
    assert packagings.detect(tmp_path / "x") == fmt
    packagings.convert(tmp_path / "x", tmp_path / "back", "deepspec")
    assert_same_tensors(src, tmp_path / "back")
    a, b = packagings.read(src), packagings.read(tmp_path / "back")
    for key in (
        "block_size",
        "sample_from_anchor",
        "markov_rank",
        "target_layer_ids",
        "mask_token_id",
        "enable_confidence_head",
        "confidence_head_with_markov",
        "num_hidden_layers",
        "hidden_size",
    ):
        assert a.config.get(key) == b.config.get(key), key


def test_speculators_to_deepspec_to_speculators_keeps_every_tensor(tmp_path, target):
    sp = write_speculators_dspark(tmp_path / "sp", rand(), target, IDS)
    packagings.convert(sp, tmp_path / "ds", "deepspec")
    assert json.loads((tmp_path / "ds" / "config.json").read_text())["draft_rows_only"] is True
    packagings.convert(tmp_path / "ds", tmp_path / "back", "speculators")
    assert_same_tensors(sp, tmp_path / "back")
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert back["draft_vocab_size"] == IDS.numel() and back["aux_hidden_state_layer_ids"] == [1, 3, 5]
    assert back["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    # and the DeepSpec-layout copy drafts what the original does
    same_drafts(
        DSparkDrafter.from_pretrained(sp, target=target),
        DSparkDrafter.from_pretrained(tmp_path / "ds", target=target),
        target,
    )


def test_specforge_and_zlab_round_trips(tmp_path):
    t = rand(block_size=5)
    sf = write_specforge_dspark(tmp_path / "sf", t)
    packagings.convert(sf, tmp_path / "ds", "deepspec")
    packagings.convert(tmp_path / "ds", tmp_path / "sf2", "specforge")
    assert_same_tensors(sf, tmp_path / "sf2")
    cfg = json.loads((tmp_path / "sf2" / "config.json").read_text())
    assert cfg["dflash_config"]["projector_type"] == "dspark" and cfg["block_size"] == 5
    z = write_zlab_dflash(tmp_path / "z", rand(rank=0, confidence=False, block_size=5))
    packagings.convert(z, tmp_path / "zds", "deepspec")
    packagings.convert(tmp_path / "zds", tmp_path / "zsp", "speculators")
    packagings.convert(tmp_path / "zsp", tmp_path / "zds2", "deepspec")
    assert_same_tensors(z, tmp_path / "zds2")
    assert json.loads((tmp_path / "zsp" / "config.json").read_text())["speculators_model_type"] == "dflash"


def test_save_pretrained_formats_reload_the_same_drafter(tmp_path, target):
    d = DSparkDrafter.from_pretrained(deepspec_like(tmp_path, "ds", rand()), target=target)
    d.set_draft_vocab(IDS)
    d.save_pretrained(tmp_path / "sp", format="speculators", verifier="tiny-qwen3")
    cfg = json.loads((tmp_path / "sp" / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "tiny-qwen3"
    assert tensors_of(tmp_path / "sp")["lm_head.weight"].shape == (IDS.numel(), 32)
    same_drafts(d, DSparkDrafter.from_pretrained(tmp_path / "sp", target=target), target)
    with pytest.raises(ValueError, match="sample_from_anchor=true"):
        d.save_pretrained(tmp_path / "sf", format="specforge")
    assert not (tmp_path / "sf").exists()  # nothing half-written


# ---- malformed variants ----------------------------------------------------------------------------------------
def _edit(folder, fn):
    p = folder / "config.json"
    doc = json.loads(p.read_text())
    fn(doc)
    p.write_text(json.dumps(doc))


def test_missing_dflash_config(tmp_path, target):
    z = write_zlab_dflash(tmp_path / "z", rand(rank=0, confidence=False))
    _edit(z, lambda d: d.pop("dflash_config"))
    with pytest.raises(ValueError, match=r"z/config.json: field 'dflash_config' is missing"):
        DSparkDrafter.from_pretrained(z, target=target)


def test_speculators_bad_d2t_and_t2d(tmp_path, target):
    t = rand()
    sp = write_speculators_dspark(tmp_path / "a", t, target, IDS, d2t=(IDS - torch.arange(IDS.numel()))[:-1])
    with pytest.raises(
        ValueError, match=r"a/config.json: tensor 'd2t' has length 32, expected draft_vocab_size = 33"
    ):
        DSparkDrafter.from_pretrained(sp, target=target)
    mask = torch.zeros(64, dtype=torch.bool)
    mask[IDS] = True
    mask[4] = True
    sp = write_speculators_dspark(tmp_path / "b", t, target, IDS, t2d=mask)
    with pytest.raises(ValueError, match=r"b/config.json: tensor 't2d' is inconsistent with 'd2t'"):
        DSparkDrafter.from_pretrained(sp, target=target)
    sp = write_speculators_dspark(tmp_path / "c", t, target, IDS)
    with pytest.raises(ValueError, match="draft_rows_only"):
        DSparkDrafter.from_pretrained(sp, target=target, draft_vocab=False)


def test_hidden_size_mismatch_names_file_and_field(tmp_path, target):
    sf = write_specforge_dspark(tmp_path / "sf", rand(block_size=5))
    with pytest.raises(
        ValueError, match=r"sf/config.json \(specforge\): hidden_size: drafter has 32, target has 48"
    ):
        DSparkDrafter.from_pretrained(sf, target=tiny_qwen3_target(hidden=48))
    sp = write_speculators_dspark(tmp_path / "sp", rand(), target, None, target_hidden_size=48)
    with pytest.raises(ValueError, match=r"sp/config.json: field 'target_hidden_size' = 48"):
        DSparkDrafter.from_pretrained(sp, target=target)


def test_speculative_tokens_must_match_the_block(tmp_path, target):
    sp = write_speculators_dspark(tmp_path / "sp", rand(), target, None)
    _edit(sp, lambda d: d["speculators_config"]["proposal_methods"][0].update(speculative_tokens=3))
    with pytest.raises(ValueError, match=r"proposal_methods\[0\].speculative_tokens = 3, expected 4"):
        DSparkDrafter.from_pretrained(sp, target=target)


def test_unrepresentable_models_are_refused(tmp_path, target):
    sf = write_specforge_dspark(
        tmp_path / "linear", rand(block_size=5), rope_scaling={"rope_type": "linear", "factor": 4.0}
    )
    with pytest.raises(ValueError, match=r"linear/config.json: field rope_scaling.rope_type = 'linear'"):
        DSparkDrafter.from_pretrained(sf, target=target)
    z = write_zlab_dflash(tmp_path / "sel", rand(rank=0, confidence=False), selector_rank=16)
    with pytest.raises(ValueError, match=r"sel/config.json: field dflash_config.selector_rank = 16"):
        DSparkDrafter.from_pretrained(z, target=target)
    z = write_zlab_dflash(tmp_path / "swa", rand(rank=0, confidence=False))
    _edit(z, lambda d: d.update(layer_types=["sliding_attention", "full_attention"], sliding_window=8))
    with pytest.raises(
        ValueError, match=r"swa/config.json: field 'layer_types' has non-full-attention layers \[0\]"
    ):
        DSparkDrafter.from_pretrained(z, target=target)


def test_unknown_packaging_lists_the_known_ones(tmp_path, target):
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    save_file({"x": torch.zeros(1)}, str(tmp_path / "u" / "model.safetensors"))
    with pytest.raises(
        ValueError,
        match=r"u/config.json: unknown drafter packaging; known: deepspec .* speculators .* specforge .* dflash",
    ):
        DSparkDrafter.from_pretrained(tmp_path / "u", target=target)


def test_exports_refuse_what_they_cannot_represent(tmp_path):
    src = deepspec_like(tmp_path, "ds", rand(), copy_head=True, copy_min_match=2, copy_max_match=3)
    t = tensors_of(src)
    t.update(
        {
            "copy_head.logit_bias": torch.zeros(4, 4),
            "copy_head.logit_gate": torch.zeros(32),
            "copy_head.conf_bias": torch.zeros(4, 2, 4),
        }
    )
    save_file(t, str(src / "model.safetensors"))
    with pytest.raises(ValueError, match="copy_head is dspark-only"):
        packagings.convert(src, tmp_path / "sp", "speculators")
    assert not (tmp_path / "sp").exists()
    sv = deepspec_like(tmp_path, "sv", rand(block_size=5), opts={"block_size": 5}, sample_from_anchor=False)
    save_draft_vocab(sv, IDS)
    with pytest.raises(ValueError, match="no draft vocabulary"):
        packagings.convert(sv, tmp_path / "sf", "specforge")
    with pytest.raises(ValueError, match="dflash is read-only"):
        packagings.convert(sv, tmp_path / "z", "dflash")


# ---- the command line ------------------------------------------------------------------------------------------
def test_cli_convert(tmp_path, capsys):
    src = deepspec_like(tmp_path, "ds", rand())
    dst = tmp_path / "out"
    assert cli_main(["convert", str(src), str(dst), "--format", "speculators"]) == 0
    assert "(deepspec) ->" in capsys.readouterr().out
    before = tensors_of(dst)
    assert cli_main(["convert", str(src), str(dst), "--format", "deepspec"]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert sorted(tensors_of(dst)) == sorted(before)  # untouched
    assert cli_main(["convert", str(dst), str(dst.parent / "back"), "--format", "deepspec"]) == 0
    assert cli_main(["convert", str(src), str(dst), "--format", "deepspec", "--force"]) == 0
    assert_same_tensors(src, dst)
    assert cli_main(["convert", str(src), str(tmp_path / "sf"), "--format", "specforge"]) == 2
    assert not (tmp_path / "sf").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".sf")]
