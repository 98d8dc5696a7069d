# SPDX-License-Identifier: Apache-2.0
"""speculators -> dspark and the defaults, for ``check_speculators_package.py``: checkpoints saved by
speculators' own model classes load in dspark bit for bit; absent fields default alike."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from speculators_check_common import (  # puts the repository on sys.path first
    IDS,
    VERIFIER_OWNED,
    Failed,
    check,
    expect,
    raiser,
    same,
    spec_classes,
    tensors,
)

from dspark import DSparkDrafter
from dspark.models import packagings
from dspark.models.config import DrafterConfig


# ---- speculators -> dspark ------------------------------------------------------------------------------------
def speculators_model(
    kind: str, family: str, verifier: Path, *, draft_vocab: bool, seed: int, own_head: bool = False, **fields
):
    """A speculators model built from its config class (as ``from_training_args`` does), random weights."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig, Qwen3Config

    _, _, kinds = spec_classes()
    config_cls, model_cls = kinds[kind]
    shape = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2)
    shape.update(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    shape.update(fields.pop("layer", {}))
    if family == "qwen3":
        layer = Qwen3Config(**{"head_dim": 32, **shape})
    else:
        layer = LlamaConfig(**shape)
    block = fields.pop("block_size", 4)
    from_anchor = fields.get("sample_from_anchor", kind == "dspark")  # speculators' defaults
    vd = IDS.numel() if draft_vocab else 97
    cfg = config_cls(
        transformer_layer_config=layer,
        draft_vocab_size=vd,
        block_size=block,
        aux_hidden_state_layer_ids=[1, 2, 3],
        mask_token_id=96,
        speculators_config=SpeculatorsConfig(
            algorithm=kind,
            proposal_methods=[
                GreedyTokenProposalConfig(speculative_tokens=block if from_anchor else block - 1)
            ],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(str(verifier)),
        ),
        **fields,
    )
    model = model_cls(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n not in VERIFIER_OWNED:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if n.endswith("norm.weight") else 0.0))
    if draft_vocab:
        t2d = torch.zeros(97, dtype=torch.bool)
        t2d[IDS] = True
        model.load_vocab_mappings(t2d, IDS - torch.arange(IDS.numel()))
    model.load_verifier_weights()
    if own_head:  # speculators freezes lm_head at the verifier's rows (model.py:71); another trainer may not
        with torch.no_grad():
            model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=g))
    return model


def check_speculators_written(name: str, model, target, out: Path, share: bool | None = None) -> None:
    SpeculatorModel = spec_classes()[0]
    folder = out / name
    cfg = model.config
    state: dict = {}

    def save():
        model.save_pretrained(str(folder))
        return f"{len(tensors(folder))} tensors"

    def read():
        expect(packagings.detect(folder) == "speculators", f"detected as {packagings.detect(folder)}")
        d = DSparkDrafter.from_pretrained(folder, target=target, share_target_embeddings=share)
        c = d.config
        n = cfg.speculators_config.proposal_methods[0].speculative_tokens
        got = dict(
            drafts=c.block_size,
            slots=c.block_slots,
            sample_from_anchor=c.sample_from_anchor,
            target_layer_ids=c.target_layer_ids,
            mask_token_id=c.mask_token_id,
            markov_rank=c.markov_rank,
            enable_confidence_head=c.enable_confidence_head,
            confidence_rank=c.confidence_input_rank,
            head_dim=c.head_dim,
            num_key_value_heads=c.num_key_value_heads,
        )
        markov = getattr(cfg, "markov_rank", 0)
        conf = getattr(cfg, "enable_confidence_head", False)
        want = dict(
            drafts=n,
            slots=cfg.block_size,
            sample_from_anchor=cfg.sample_from_anchor,
            target_layer_ids=[i - 1 for i in cfg.aux_hidden_state_layer_ids],
            mask_token_id=cfg.mask_token_id,
            markov_rank=markov,
            enable_confidence_head=conf,
            confidence_rank=markov if conf and getattr(cfg, "confidence_head_with_markov", False) else 0,
            head_dim=model.layers[0].self_attn.head_dim,
            num_key_value_heads=cfg.transformer_layer_config.num_key_value_heads,
        )
        if markov:
            got["markov_head_type"], want["markov_head_type"] = c.markov_head_type, cfg.markov_head_type
        expect(got == want, f"dspark {got} != speculators {want}")
        ids = None if d.draft_vocab is None else d.draft_vocab.tolist()
        want_ids = IDS.tolist() if model.use_draft_vocab else None
        expect(ids == want_ids, f"draft vocabulary {ids} != {want_ids}")
        state["d"] = d
        return f"drafts {c.block_size}, slots {c.block_slots}, sample_from_anchor {c.sample_from_anchor}"

    def bits():
        d, file = state["d"], tensors(folder)
        mine = d.checkpoint_tensors(include_embeddings=True)
        ids = IDS if model.use_draft_vocab else None
        for k, v in file.items():
            if k in ("d2t", "t2d"):
                continue
            expect(k in mine, f"{k} has no dspark tensor")
            w = mine[k] if ids is None or k not in packagings.base.REDUCED_TABLES else mine[k][ids]
            expect(
                same(w, v),
                f"{k}: dspark {w.dtype} {tuple(w.shape)} differs from the file's {v.dtype} {tuple(v.shape)}",
            )
        extra = sorted(set(mine) - set(file) - {"embed_tokens.weight", "lm_head.weight"})
        expect(not extra, f"dspark tensors the file lacks: {extra}")
        t_embed = target.get_input_embeddings().weight.detach()
        expect(torch.equal(mine["embed_tokens.weight"], t_embed), "embed_tokens is not the target's")
        if ids is not None and share is None:  # the rows outside the draft vocabulary are the target's
            t_lm = target.get_output_embeddings().weight.detach()
            expect(torch.equal(mine["lm_head.weight"], t_lm), "lm_head is not the target's outside the rows")
        if ids is None:
            t_lm = target.get_output_embeddings().weight.detach()
            expect(torch.equal(mine["lm_head.weight"], t_lm), "lm_head (absent) is not the target's")
        return f"{len(file)} tensors"

    def round_trip():
        ds, back = out / f"{name}-deepspec", out / f"{name}-back"
        packagings.convert(folder, ds, "deepspec")
        packagings.convert(ds, back, "speculators", verifier=cfg.speculators_config.verifier.name_or_path)
        a, b = tensors(folder), tensors(back)
        expect(sorted(a) == sorted(b), f"tensor names {sorted(set(a) ^ set(b))} differ")
        bad = [k for k in a if not same(a[k], b[k])]
        expect(not bad, f"tensors differ: {bad}")
        x = json.loads((folder / "config.json").read_text())
        y = json.loads((back / "config.json").read_text())
        keys = ["speculators_model_type", "block_size", "sample_from_anchor", "aux_hidden_state_layer_ids"]
        keys += ["mask_token_id", "draft_vocab_size", "markov_rank", "enable_confidence_head", "dtype"]
        diff = {k: (x.get(k), y.get(k)) for k in keys if x.get(k) != y.get(k)}
        sx, sy = (z["speculators_config"]["proposal_methods"][0]["speculative_tokens"] for z in (x, y))
        expect(not diff and sx == sy, f"fields differ: {diff}, speculative_tokens {sx} vs {sy}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            again = SpeculatorModel.from_pretrained(str(back))
        sd = again.state_dict()
        bad = [k for k in b if k not in ("embed_tokens.weight",) and not torch.equal(sd[k], b[k])]
        expect(not bad, f"the real package reloads them differently: {bad}")

    check(f"[{name}] speculators save_pretrained", save)
    check(f"[{name}] DSparkDrafter.from_pretrained: config", read)
    if "d" not in state:
        return
    check(f"[{name}] tensors map bit for bit", bits)
    check(
        f"[{name}] convert speculators->deepspec->speculators keeps tensors/fields; speculators reloads",
        round_trip,
    )
    if (getattr(cfg.transformer_layer_config, "rope_parameters", None) or {}).get("rope_type") == "yarn":

        def rope():
            d = state["d"]
            r = model.rotary_emb
            expect(torch.allclose(d.rotary_emb.inv_freq, r.inv_freq, rtol=1e-6, atol=0), "inv_freq differs")
            expect(
                abs(d.rotary_emb.attention_factor - r.attention_scaling) < 1e-9, "attention factor differs"
            )
            return f"attention factor {r.attention_scaling:.6f}"

        check(f"[{name}] YaRN frequencies equal speculators' rotary_emb", rope)


def speculators_to_dspark(targets: dict, verifiers: dict, out: Path) -> None:
    yarn = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 128,
    }
    cases = [
        ("sp-dspark-vanilla-full", "dspark", "qwen3", False, dict(markov_rank=8)),
        (
            "sp-dspark-gated-vocab-llama",
            "dspark",
            "llama",
            True,
            dict(markov_rank=8, markov_head_type="gated"),
        ),
        (
            "sp-dspark-rnn-vocab-conf-nomarkovfeat",
            "dspark",
            "qwen3",
            True,
            dict(markov_rank=8, markov_head_type="rnn", confidence_head_with_markov=False),
        ),
        (
            "sp-dspark-conf-only",
            "dspark",
            "llama",
            False,
            dict(markov_rank=0, confidence_head_with_markov=False),
        ),
        ("sp-dspark-noanchor-vocab", "dspark", "qwen3", True, dict(markov_rank=8, sample_from_anchor=False)),
        ("sp-dflash-full", "dflash", "qwen3", False, dict(block_size=5)),
        ("sp-dflash-vocab-llama", "dflash", "llama", True, {}),
        ("sp-dspark-vocab-own-head", "dspark", "qwen3", True, dict(markov_rank=8, own_head=True)),
        ("sp-dspark-yarn", "dspark", "qwen3", False, dict(markov_rank=8, layer={"rope_parameters": yarn})),
        # Qwen3Config's own defaults for the heads (32 x 128, 32 KV heads): what to_diff_dict may leave out
        (
            "sp-dspark-qwen3-default-heads",
            "dspark",
            "qwen3",
            False,
            dict(
                markov_rank=8, layer={"num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128}
            ),
        ),
    ]
    for seed, (name, kind, family, dv, fields) in enumerate(cases):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = speculators_model(
                    kind, family, verifiers[family], draft_vocab=dv, seed=seed, **dict(fields)
                )
        except Exception as e:
            check(f"[{name}] build the speculators model", raiser(e))
            continue
        if fields.get("own_head"):  # not supported: dspark must refuse it clearly, before drafting
            check(f"[{name}] refused with the LM head named", refusal(model, targets[family], out / name))
            continue
        check_speculators_written(name, model, targets[family], out)


def refusal(model, target, folder: Path) -> Callable[[], str]:
    """A check that loading ``model``'s checkpoint (a reduced LM head that is not the verifier's rows) fails
    with a ValueError naming the LM head."""

    def fn() -> str:
        model.save_pretrained(str(folder))
        try:
            DSparkDrafter.from_pretrained(folder, target=target)
        except ValueError as e:
            expect("lm_head" in str(e), f"refused, but without naming the LM head: {e}")
            return f"refused: {str(e)[:80]}..."
        raise Failed("loaded: a head that is not the verifier's rows would be replaced silently")

    return fn


# ---- defaults -------------------------------------------------------------------------------------------------
def check_defaults(out: Path, targets: dict) -> None:
    """Fields absent from config.json: dspark's reader must take speculators' defaults."""
    SpeculatorModelConfig = spec_classes()[1]

    def compare(src: str, drop: list[str], drop_layer: list[str] = ()) -> str:
        folder = out / f"defaults-{src}-{len(drop)}-{len(drop_layer)}"
        folder.mkdir()
        doc = json.loads((out / src / "config.json").read_text())
        for k in drop:
            doc.pop(k, None)
        for k in drop_layer:
            doc["transformer_layer_config"].pop(k, None)
        (folder / "config.json").write_text(json.dumps(doc))
        (folder / "model.safetensors").symlink_to(out / src / "model.safetensors")
        s = SpeculatorModelConfig.from_pretrained(str(folder))
        c = DrafterConfig.from_dict(packagings.read(folder).config)
        tl = s.transformer_layer_config
        got = dict(sample_from_anchor=c.sample_from_anchor, slots=c.block_slots)
        want = dict(sample_from_anchor=s.sample_from_anchor, slots=s.block_size)
        if s.speculators_model_type == "dspark":
            got.update(markov_rank=c.markov_rank, enable_confidence_head=c.enable_confidence_head)
            want.update(markov_rank=s.markov_rank, enable_confidence_head=s.enable_confidence_head)
            got.update(markov_head_type=c.markov_head_type, with_markov=c.confidence_head_with_markov)
            want.update(markov_head_type=s.markov_head_type, with_markov=s.confidence_head_with_markov)
        for k in ("head_dim", "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "vocab_size"):
            got[k], want[k] = getattr(c, k), getattr(tl, k)
        got["rope_theta"], want["rope_theta"] = c.rope_theta, tl.rope_parameters["rope_theta"]
        diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
        expect(
            not diff,
            "dspark vs speculators: " + ", ".join(f"{k} {a!r} vs {b!r}" for k, (a, b) in diff.items()),
        )
        if drop_layer:  # and the drafter loads with every tensor as stored
            d = DSparkDrafter.from_pretrained(folder, target=targets["qwen3"])
            mine, file = d.checkpoint_tensors(), tensors(folder)
            bad = [k for k in file if k not in mine or not same(mine[k], file[k])]
            expect(not bad, f"tensors differ: {bad}")
        return ", ".join(
            f"{k}={v!r}" for k, v in want.items() if k in drop or k in drop_layer or k == "with_markov"
        )

    heads = ["sample_from_anchor", "markov_rank", "markov_head_type", "enable_confidence_head"]
    heads.append("confidence_head_with_markov")
    check(
        "[defaults] dspark config without the DSpark fields", lambda: compare("sp-dspark-vanilla-full", heads)
    )
    check("[defaults] dflash config without sample_from_anchor", lambda: compare("sp-dflash-full", heads[:1]))
    layer = ["head_dim", "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_parameters"]
    layer.append("max_position_embeddings")
    check(
        "[defaults] transformer_layer_config without heads / head_dim / eps / rope: Qwen3Config's, and loads",
        lambda: compare("sp-dspark-qwen3-default-heads", [], layer),
    )
