# SPDX-License-Identifier: Apache-2.0
"""Check dspark's ``speculators`` packaging against the real ``speculators`` package (vLLM's; checked with 0.9.0).

Both directions, on tiny random Llama / Qwen3 targets:

* dspark -> speculators: a dspark drafter written with ``save_pretrained(format="speculators")`` parses with
  ``SpeculatorModelConfig.from_pretrained`` (right class, fields), its ``model.safetensors`` matches the
  ``state_dict()`` of the model built from that config (names, shapes, dtypes; only the keys speculators
  reconstructs from the verifier may be absent), loads with ``strict=True``, and loads through
  ``SpeculatorModel.from_pretrained`` (verifier weights from a tiny local HF folder) bit for bit.
* speculators -> dspark: ``DSparkDraftModel`` / ``DFlashDraftModel`` built from their configs and saved with
  their ``save_pretrained`` load with ``DSparkDrafter.from_pretrained(path, target=...)`` with every tensor bit
  for bit; ``dspark convert`` speculators -> deepspec -> speculators keeps every tensor and field.
* defaults: fields absent from ``config.json`` default in dspark's reader as in speculators' classes.

Run (speculators and its dependencies on PYTHONPATH; exits 0 with a SKIP line when it cannot be imported)::

    PYTHONPATH=/tmp/spec:/tmp/specdeps .venv/bin/python scripts/check_speculators_package.py

One PASS / FAIL line per check; the exit status is 1 when any check fails.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speculators_check_common import (  # noqa: E402  (puts the repository on sys.path first)
    IDS,
    RESULTS,
    built,
    check,
    edited,
    expect,
    fresh_drafter,
    spec_classes,
    tensors,
    with_draft_vocab,
)
from speculators_check_reverse import check_defaults, speculators_to_dspark  # noqa: E402

from dspark import DSparkDrafter  # noqa: E402
from tests.decoding.toy_models import random_drafter  # noqa: E402
from tests.models.tiny import tiny_model  # noqa: E402


def check_dspark_written(name: str, d: DSparkDrafter, target, verifier: Path, out: Path) -> None:
    """The checks of one dspark drafter written in the speculators format."""
    SpeculatorModel, SpeculatorModelConfig, kinds = spec_classes()
    c = d.config
    folder = out / name
    state: dict = {}

    def write():
        d.save_pretrained(folder, format="speculators", verifier=str(verifier))

    def parse():
        cfg = SpeculatorModelConfig.from_pretrained(str(folder))
        mtype = json.loads((folder / "config.json").read_text())["speculators_model_type"]
        expect(
            type(cfg) is kinds[mtype][0],
            f"parsed as {type(cfg).__name__}, expected {kinds[mtype][0].__name__}",
        )
        state["cfg"], state["cls"] = cfg, kinds[mtype][1]
        tl = cfg.transformer_layer_config
        want = {
            "block_size": c.block_slots,
            "sample_from_anchor": c.sample_from_anchor,
            "aux_hidden_state_layer_ids": [i + 1 for i in c.target_layer_ids],
            "mask_token_id": c.mask_token_id,
            "draft_vocab_size": c.vocab_size if d.draft_vocab is None else d.draft_vocab.numel(),
        }
        if mtype == "dspark":
            want.update(
                markov_rank=c.markov_rank,
                enable_confidence_head=c.enable_confidence_head,
                confidence_head_with_markov=c.confidence_head_with_markov and c.has_markov,
            )
            if c.has_markov:
                want["markov_head_type"] = c.markov_head_type
        got = {k: getattr(cfg, k) for k in want}
        expect(got == want, f"fields {got} != {want}")
        layer = {k: getattr(tl, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads")}
        layer.update({k: getattr(tl, k) for k in ("num_key_value_heads", "head_dim", "vocab_size")})
        layer.update(num_hidden_layers=tl.num_hidden_layers, rms_norm_eps=tl.rms_norm_eps)
        layer["rope_theta"] = tl.rope_parameters["rope_theta"]
        mine = {k: getattr(c, k) for k in layer}
        expect(layer == mine, f"transformer_layer_config {layer} != dspark's {mine}")
        n = cfg.speculators_config.proposal_methods[0].speculative_tokens
        rule = cfg.block_size if cfg.sample_from_anchor else cfg.block_size - 1  # dflash/core.py:259
        expect(
            n == rule == c.block_size,
            f"speculative_tokens {n}, speculators' rule {rule}, dspark drafts {c.block_size}",
        )
        from speculators.config import VerifierConfig

        ver = cfg.speculators_config.verifier
        real = VerifierConfig.from_pretrained(str(verifier))  # what speculators' own training records
        expect(ver == real, f"speculators_config.verifier {ver} != {real}")
        return f"{type(cfg).__name__}, {mtype}, speculative_tokens {n}, verifier {ver.architectures}"

    def build():
        model = state["cls"](state["cfg"])  # raises where speculators refuses the config
        state["model"] = model
        return type(model).__name__

    def keys():
        model, file = state["model"], tensors(folder)
        sd = model.state_dict()
        extra = sorted(set(file) - set(sd))
        missing = sorted(set(sd) - set(file))
        optional = set(model._keys_to_ignore_on_load_missing)
        expect(not extra, f"tensors the model does not have: {extra}")
        expect(
            set(missing) <= optional, f"model tensors absent from the file: {sorted(set(missing) - optional)}"
        )
        bad = [
            f"{k} {tuple(file[k].shape)} vs {tuple(sd[k].shape)}"
            for k in file
            if file[k].shape != sd[k].shape
        ]
        expect(not bad, f"shapes differ: {bad}")
        dts = sorted({f"{file[k].dtype} (model {sd[k].dtype})" for k in file if file[k].dtype != sd[k].dtype})
        return f"{len(file)} tensors; absent (rebuilt from the verifier): {missing}" + (
            f"; stored {dts}" if dts else ""
        )

    def strict():
        model, file = state["model"], tensors(folder)
        full = {**model.state_dict(), **file}
        model.load_state_dict(full, strict=True)
        sd = model.state_dict()
        bad = [k for k in file if not torch.equal(sd[k], file[k].to(sd[k].dtype))]
        expect(not bad, f"differ after load: {bad}")

    def loaded():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = SpeculatorModel.from_pretrained(str(folder))
        file, sd = tensors(folder), model.state_dict()
        expect(type(model) is state["cls"], f"loaded a {type(model).__name__}")
        nan = [k for k, v in sd.items() if v.is_floating_point() and bool(v.isnan().any())]
        expect(not nan, f"never loaded (NaN): {nan}")
        t_embed = target.get_input_embeddings().weight.detach()
        t_lm = target.get_output_embeddings().weight.detach()
        rebuilt = {"embed_tokens.weight"} | ({"lm_head.weight"} if d.draft_vocab is None else set())
        cast = []
        for k, v in file.items():
            if (
                k in rebuilt
            ):  # speculators overwrites these from the verifier (dflash/core.py load_verifier_weights)
                ref = t_embed if k == "embed_tokens.weight" else t_lm
                expect(torch.equal(sd[k], ref.to(sd[k].dtype)), f"{k} is not the verifier's after loading")
                continue
            if v.dtype != sd[k].dtype:
                cast.append(f"{k} {v.dtype}->{sd[k].dtype}")
            expect(torch.equal(sd[k], v.to(sd[k].dtype)), f"{k} differs after from_pretrained")
        if d.draft_vocab is not None:
            t_lm = t_lm[IDS]
        expect(
            torch.equal(sd["verifier_lm_head.weight"], t_lm.to(model.dtype)),
            "verifier_lm_head != target's (rows)",
        )
        return f"dtype {model.dtype}" + (f"; cast on load: {cast}" if cast else "")

    check(f"[{name}] dspark writes format='speculators'", write)
    if not (folder / "config.json").is_file():
        return
    check(f"[{name}] SpeculatorModelConfig.from_pretrained: class and fields", parse)
    if "cfg" not in state:
        return
    check(f"[{name}] speculators builds the model from the config", build)
    if "model" not in state:
        return
    check(f"[{name}] model.safetensors vs model state_dict: names, shapes", keys)
    check(f"[{name}] load_state_dict(strict=True) (verifier-owned keys from the model) and values", strict)
    check(f"[{name}] SpeculatorModel.from_pretrained (local verifier) bit for bit", loaded)


def dspark_to_speculators(targets: dict, verifiers: dict, out: Path) -> None:
    qwen, llama = targets["qwen3"], targets["llama"]

    torch.manual_seed(0)
    cases: list[tuple[str, str, Callable[[], DSparkDrafter]]] = [
        ("ds-vanilla-conf-full", "qwen3", lambda: random_drafter(qwen, block_size=4, markov_rank=8)),
        (
            "ds-gated-vocab-llama",
            "llama",
            lambda: with_draft_vocab(random_drafter(llama, markov_rank=8, head="gated")),
        ),
        (
            "ds-rnn-conf-nomarkovfeat-vocab",
            "qwen3",
            lambda: with_draft_vocab(
                fresh_drafter(qwen, markov_rank=8, markov_head_type="rnn", confidence_head_with_markov=False)
            ),
        ),
        (
            "ds-conf-only-markov0",
            "qwen3",
            lambda: fresh_drafter(qwen, markov_rank=0, enable_confidence_head=True),
        ),
        ("ds-headless-anchor", "llama", lambda: fresh_drafter(llama, markov_rank=0)),
        (
            "ds-dflash-layout",
            "qwen3",
            lambda: edited(
                fresh_drafter(qwen, markov_rank=0), qwen, out / "src-dflash", sample_from_anchor=False
            ),
        ),
        (
            "ds-vanilla-noanchor-vocab",
            "llama",
            lambda: with_draft_vocab(
                edited(
                    fresh_drafter(llama, markov_rank=8), llama, out / "src-noanchor", sample_from_anchor=False
                )
            ),
        ),
        (
            "ds-bf16-own-embeddings",
            "qwen3",
            lambda: fresh_drafter(qwen, markov_rank=8, dtype=torch.bfloat16, share_embeddings=False),
        ),
    ]
    for name, family, d in built(cases):
        check_dspark_written(name, d, targets[family], verifiers[family], out)


def main() -> int:
    try:
        import speculators
        from speculators.models.dspark import DSparkDraftModel  # noqa: F401
    except Exception as e:
        print(
            f"SKIP  speculators cannot be imported ({type(e).__name__}: {e}); put it and its dependencies on PYTHONPATH"
        )
        return 0
    from importlib.metadata import version

    import transformers

    where = Path(speculators.__file__).parent
    print(
        f"speculators {version('speculators')} ({where}), transformers {transformers.__version__}, torch {torch.__version__}"
    )
    logging.disable(logging.WARNING)
    try:
        from loguru import logger

        logger.remove()
    except ImportError:
        pass
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="dspark-speculators-") as tmp:
        out = Path(tmp)
        targets = {f: tiny_model(f, layers=5) for f in ("qwen3", "llama")}
        verifiers = {}
        for f, t in targets.items():
            verifiers[f] = out / f"verifier-{f}"
            t.save_pretrained(verifiers[f])
        dspark_to_speculators(targets, verifiers, out)
        speculators_to_dspark(targets, verifiers, out)
        check_defaults(out, targets)
    failed = RESULTS.count(False)
    print(f"{len(RESULTS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
