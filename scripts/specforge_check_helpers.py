# SPDX-License-Identifier: Apache-2.0
"""SpecForge -> dspark and shared helpers of ``check_specforge_package.py``: drafters built by SpecForge's own
classes from a draft-config JSON, exported with its ``export_to_hf``, load in dspark bit for bit."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from speculators_check_common import (  # puts the repository on sys.path first
    check,
    expect,
    raiser,
    same,
    tensors,
)

from dspark import DSparkDrafter
from dspark.models import packagings

# the Qwen3 shape of the tiny targets (tests/models/tiny.py): a draft config copies it, as SpecForge's do
SHAPE = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)


def effective(file: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors SpecForge loads from a file: ``logit_head.`` nesting removed, the un-nested name winning
    where both are present (modeling/draft/dflash.py ``normalize_draft_head_checkpoint_keys``)."""
    nested = {k.removeprefix("logit_head."): v for k, v in file.items() if k.startswith("logit_head.")}
    return {**nested, **{k: v for k, v in file.items() if not k.startswith("logit_head.")}}


def sf_classes():
    """SpecForge's config reader and model factory (specforge/modeling/auto.py)."""
    from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig

    return AutoDraftModel, AutoDraftModelConfig


def sf_build(config_path: Path):
    """The model SpecForge builds from a draft-config JSON (as export/checkpoint_io.py materialize_draft, fp32)."""
    AutoDraftModel, AutoDraftModelConfig = sf_classes()
    return AutoDraftModel.from_config(AutoDraftModelConfig.from_file(str(config_path)))


def draft_config(arch: str, method: dict, *, layers: int = 2, block: int = 4, **top) -> dict:
    """A SpecForge draft-config JSON (the fields its DFlash / DSpark classes read)."""
    doc = dict(SHAPE, architectures=[arch], model_type="qwen3", num_hidden_layers=layers, block_size=block)
    doc.update(num_target_layers=5, tie_word_embeddings=False, dflash_config=method)
    doc.update(top)
    return doc


def randomize(model, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if n.endswith("norm.weight") else 0.0))
    return {k: v.clone() for k, v in model.state_dict().items()}


def sf_export(doc: dict, folder: Path, seed: int, nest_heads: bool = False):
    """SpecForge's model from ``doc`` with random weights, saved through ``export_to_hf`` from a
    ``training_state.pt`` (export/to_hf.py); returns the model."""
    from specforge.export.to_hf import export_to_hf

    folder.mkdir(parents=True, exist_ok=True)
    cfg_path = folder.parent / f"{folder.name}-draft-config.json"
    cfg_path.write_text(json.dumps(doc))
    model = sf_build(cfg_path)
    sd = randomize(model, seed)
    if nest_heads:  # early DSpark checkpoints (dflash.py normalize_draft_head_checkpoint_keys)
        sd = {
            ("logit_head." + k if k.startswith(("markov_head.", "confidence_head.")) else k): v
            for k, v in sd.items()
        }
    ckpt_path = folder.parent / f"{folder.name}-training_state.pt"
    torch.save({"draft_state_dict": sd, "strategy": "dspark"}, ckpt_path)
    export_to_hf(str(ckpt_path), str(cfg_path), str(folder))
    return model


def check_sf_exported(name: str, doc: dict, target, out: Path, seed: int, nest_heads: bool = False) -> None:
    folder = out / name
    state: dict = {}

    def save():
        state["model"] = sf_export(doc, folder, seed, nest_heads)
        written = json.loads((folder / "config.json").read_text())
        return f"{len(tensors(folder))} tensors, dtype {written.get('dtype', written.get('torch_dtype'))}"

    def read():
        model = state["model"]
        kind = (
            "dflash" if type(model).__name__ == "DFlashDraftModel" else "specforge"
        )  # dspark's z-lab reader
        expect(packagings.detect(folder) == kind, f"detected as {packagings.detect(folder)}, expected {kind}")
        d = DSparkDrafter.from_pretrained(folder, target=target)
        c = d.config
        m = model.config.dflash_config
        markov = model.markov_head if hasattr(model, "markov_head") else None
        conf = getattr(model, "confidence_head", None)
        got = dict(
            slots=c.block_slots,
            drafts=c.block_size,
            sample_from_anchor=c.sample_from_anchor,
            target_layer_ids=list(c.target_layer_ids),
            mask_token_id=c.mask_token_id,
            markov_rank=c.markov_rank,
            confidence=c.enable_confidence_head,
            confidence_rank=c.confidence_input_rank if c.enable_confidence_head else 0,
            heads=(c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        )
        want = dict(
            slots=model.block_size,
            drafts=model.block_size - 1,  # spec_generate fills block_output_ids[:, 1:] (dflash.py:525)
            sample_from_anchor=False,
            target_layer_ids=list(model.target_layer_ids),
            mask_token_id=model.mask_token_id,
            markov_rank=0 if markov is None else markov.markov_rank,
            confidence=conf is not None,
            confidence_rank=(conf.proj.in_features - model.config.hidden_size) if conf is not None else 0,
            heads=(
                model.config.num_attention_heads,
                model.config.num_key_value_heads,
                model.layers[0].self_attn.head_dim,
            ),
        )
        if markov is not None:
            got["markov_head_type"], want["markov_head_type"] = c.markov_head_type, markov.markov_head_type
        expect(got == want, f"dspark {got} != SpecForge {want}")
        if "projector_type" in m:
            state["projector"] = m["projector_type"]
        state["d"] = d
        return f"slots {c.block_slots}, drafts {c.block_size}, markov {got.get('markov_head_type', '-')}"

    def bits():
        d, file = state["d"], effective(tensors(folder))
        mine = d.checkpoint_tensors(include_embeddings=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sf = sf_classes()[0].from_pretrained(str(folder))  # how SpecForge itself reloads the export
        sd = sf.state_dict()
        cast = []
        for k, v in file.items():
            expect(k in mine, f"{k} has no dspark tensor")
            if mine[k].dtype != v.dtype:  # a file of mixed dtypes: dspark holds one dtype; lossless only
                cast.append(f"{k} {v.dtype}->{mine[k].dtype}")
                expect(
                    same(mine[k].to(v.dtype), v) and torch.equal(v.to(mine[k].dtype), mine[k]),
                    f"{k}: lossy cast",
                )
                continue
            expect(
                same(mine[k], v),
                f"{k}: dspark {tuple(mine[k].shape)} differs from the file's {tuple(v.shape)}",
            )
            expect(
                torch.equal(sd[k], v.to(sd[k].dtype)), f"{k}: SpecForge's from_pretrained reads other values"
            )
        extra = sorted(set(mine) - set(file) - {"embed_tokens.weight", "lm_head.weight"})
        expect(not extra, f"dspark tensors the file lacks: {extra}")
        missing = sorted(set(sd) - set(file))
        expect(not missing, f"SpecForge tensors the file lacks: {missing}")
        t_embed = target.get_input_embeddings().weight.detach()
        expect(torch.equal(mine["embed_tokens.weight"], t_embed), "embed_tokens is not the target's")
        return f"{len(file)} tensors" + (f"; dspark casts losslessly: {cast}" if cast else "")

    def rope():
        d, model = state["d"], state["model"]
        r = model.rotary_emb
        expect(
            torch.allclose(d.rotary_emb.inv_freq, r.inv_freq.float(), rtol=1e-6, atol=0), "inv_freq differs"
        )
        expect(abs(d.rotary_emb.attention_factor - r.attention_scaling) < 1e-9, "attention factor differs")
        return f"attention factor {r.attention_scaling:.6f}"

    def round_trip():
        ds, back = out / f"{name}-deepspec", out / f"{name}-back"
        packagings.convert(folder, ds, "deepspec")
        packagings.convert(ds, back, "specforge")
        a, b = effective(tensors(folder)), tensors(back)
        expect(sorted(a) == sorted(b), f"tensor names {sorted(set(a) ^ set(b))} differ")
        bad = [k for k in a if not same(a[k], b[k])]
        expect(not bad, f"tensors differ: {bad}")
        again = sf_build(back / "config.json")
        again.load_state_dict({**again.state_dict(), **b}, strict=True)
        x = json.loads((folder / "config.json").read_text())["dflash_config"]
        y = json.loads((back / "config.json").read_text())["dflash_config"]
        keys = ("mask_token_id", "target_layer_ids", "markov_rank", "markov_head_type", "attention_mode")
        keys += ("enable_confidence_head", "confidence_head_with_markov")
        diff = {k: (x[k], y.get(k)) for k in keys if k in x and y.get(k) != x[k]}
        expect(not diff, f"dflash_config fields changed: {diff}")

    check(f"[{name}] SpecForge builds + export_to_hf", save)
    if not (folder / "config.json").is_file():
        return
    check(f"[{name}] DSparkDrafter.from_pretrained: config", read)
    if "d" not in state:
        return
    check(f"[{name}] tensors map bit for bit", bits)
    check(f"[{name}] RoPE / YaRN inv_freq and attention factor", rope)
    check(
        f"[{name}] convert specforge->deepspec->specforge keeps tensors/fields; SpecForge reloads strict",
        round_trip,
    )


def specforge_to_dspark(target, out: Path) -> None:
    ds = "DSparkDraftModel"
    yarn = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "rope_theta": 10000.0,
    }
    ids = [0, 2, 3]
    cases = [
        (
            "sf-vanilla-conf",
            draft_config(
                ds,
                dict(
                    projector_type="dspark",
                    mask_token_id=96,
                    target_layer_ids=ids,
                    markov_rank=8,
                    markov_head_type="vanilla",
                    enable_confidence_head=True,
                    confidence_head_with_markov=True,
                ),
            ),
        ),
        (
            "sf-gated-alpha-default",
            draft_config(
                ds,
                dict(
                    mask_token_id=96,
                    target_layer_ids=ids,
                    markov_rank=8,
                    markov_head_type="gated",
                    confidence_head_alpha=1.0,
                ),
            ),
        ),
        (
            "sf-rnn-noconf",
            draft_config(
                ds,
                dict(
                    projector_type="dspark",
                    mask_token_id=95,
                    target_layer_ids=ids,
                    markov_rank=4,
                    markov_head_type="rnn",
                ),
                block=6,
            ),
        ),
        (
            "sf-conf-only-mha",
            draft_config(
                ds,
                dict(
                    projector_type="dspark",
                    mask_token_id=96,
                    target_layer_ids=[1, 3],
                    enable_confidence_head=True,
                    attention_mode="mha",
                ),
                num_key_value_heads=4,
            ),
        ),
        ("sf-derived-taps", draft_config(ds, dict(projector_type="dspark", mask_token_id=96, markov_rank=8))),
        (
            "sf-yarn",
            draft_config(
                ds,
                dict(projector_type="dspark", mask_token_id=96, target_layer_ids=ids, markov_rank=8),
                rope_parameters=yarn,
                max_position_embeddings=512,
            ),
        ),
        ("sf-dflash", draft_config("DFlashDraftModel", dict(mask_token_id=96, target_layer_ids=ids))),
    ]
    for i, (name, doc) in enumerate(cases):
        check_sf_exported(name, doc, target, out, seed=100 + i)
    check_sf_exported("sf-legacy-logit-head", cases[0][1], target, out, seed=200, nest_heads=True)


def skip_reason() -> str | None:
    try:
        import specforge.modeling.draft.dspark  # noqa: F401
        from specforge.export.to_hf import export_to_hf  # noqa: F401
        from specforge.modeling.auto import AutoDraftModel  # noqa: F401
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


__all__ = ["check_sf_exported", "raiser", "sf_build", "sf_classes", "skip_reason", "specforge_to_dspark"]
