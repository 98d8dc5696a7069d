# SPDX-License-Identifier: Apache-2.0
"""Check dspark's ``specforge`` packaging against the real SpecForge package (checked with specforge 0.2.0).

Both directions, on a tiny random Qwen3 target:

* dspark -> SpecForge: a dspark drafter written with ``save_pretrained(format="specforge")`` is read with
  SpecForge's ``AutoDraftModelConfig.from_file`` and built with ``AutoDraftModel.from_config`` (its
  ``modeling/auto.py``, as ``export/checkpoint_io.py`` ``materialize_draft`` does); the written
  ``model.safetensors`` matches that model's ``state_dict()`` (names, shapes), loads with ``strict=True``, the
  model's block size / taps / mask / heads / RoPE agree with dspark's, and ``AutoDraftModel.from_pretrained``
  reloads every tensor bit for bit. What SpecForge cannot represent is refused by dspark's writer.
* SpecForge -> dspark: DSpark / DFlash drafts built by SpecForge from a draft-config JSON with random weights,
  exported with its ``export/to_hf.py`` ``export_to_hf`` from a ``training_state.pt``, load with
  ``DSparkDrafter.from_pretrained(path, target=...)`` with every tensor bit for bit and the fields agreeing.

Run (SpecForge's package on PYTHONPATH; exits 0 with a SKIP line when its modeling code cannot be imported)::

    PYTHONPATH=/tmp/sf:/tmp/sfdeps .venv/bin/python scripts/check_specforge_package.py

One PASS / FAIL line per check; the exit status is 1 when any check fails.
"""

from __future__ import annotations

import copy
import json
import logging
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from specforge_check_helpers import sf_build, sf_classes, skip_reason, specforge_to_dspark  # noqa: E402
from speculators_check_common import RESULTS, check, edited, expect, raiser, tensors  # noqa: E402

from dspark import DSparkDrafter  # noqa: E402
from tests.decoding.toy_models import random_drafter  # noqa: E402
from tests.models.tiny import tiny_model  # noqa: E402


def check_dspark_written(name: str, d: DSparkDrafter, out: Path) -> None:
    """The checks of one dspark drafter written in the specforge format."""
    c = d.config
    folder = out / name
    state: dict = {}

    def write():
        d.save_pretrained(folder, format="specforge")
        return json.loads((folder / "config.json").read_text())["architectures"][0]

    def build():
        model = sf_build(folder / "config.json")  # raises where SpecForge refuses the config
        arch = json.loads((folder / "config.json").read_text())["architectures"][0]
        expect(type(model).__name__ == arch, f"built a {type(model).__name__}, config names {arch}")
        state["model"] = model
        return type(model).__name__

    def fields():
        model = state["model"]
        markov = getattr(model, "markov_head", None)
        conf = getattr(model, "confidence_head", None)
        got = dict(
            block_size=model.block_size,
            target_layer_ids=list(model.target_layer_ids),
            mask_token_id=model.mask_token_id,
            markov_rank=0 if markov is None else markov.markov_rank,
            confidence=conf is not None,
            confidence_in=None if conf is None else conf.proj.in_features,
            heads=(model.config.num_attention_heads, model.config.num_key_value_heads),
            head_dim=model.layers[0].self_attn.head_dim,
        )
        want = dict(
            block_size=c.block_slots,
            target_layer_ids=list(c.target_layer_ids),
            mask_token_id=c.mask_token_id,
            markov_rank=c.markov_rank,
            confidence=c.enable_confidence_head,
            confidence_in=(c.hidden_size + c.confidence_input_rank) if c.enable_confidence_head else None,
            heads=(c.num_attention_heads, c.num_key_value_heads),
            head_dim=c.head_dim,
        )
        if markov is not None:
            got["markov_head_type"], want["markov_head_type"] = markov.markov_head_type, c.markov_head_type
        expect(got == want, f"SpecForge {got} != dspark {want}")
        r = model.rotary_emb
        expect(
            torch.allclose(d.rotary_emb.inv_freq, r.inv_freq.float(), rtol=1e-6, atol=0), "inv_freq differs"
        )
        expect(abs(d.rotary_emb.attention_factor - r.attention_scaling) < 1e-9, "attention factor differs")
        return f"block {got['block_size']}, markov {got.get('markov_head_type', '-')}, rope x{r.attention_scaling:.4f}"

    def keys():
        model, file = state["model"], tensors(folder)
        sd = model.state_dict()
        extra, missing = sorted(set(file) - set(sd)), sorted(set(sd) - set(file))
        expect(not extra and not missing, f"file-only {extra}, model-only {missing}")
        bad = [
            f"{k} {tuple(file[k].shape)} vs {tuple(sd[k].shape)}"
            for k in file
            if file[k].shape != sd[k].shape
        ]
        expect(not bad, f"shapes differ: {bad}")
        dts = sorted({f"{file[k].dtype} (model {sd[k].dtype})" for k in file if file[k].dtype != sd[k].dtype})
        return f"{len(file)} tensors" + (f"; stored {dts}" if dts else "")

    def strict():
        model, file = state["model"], tensors(folder)
        model.load_state_dict(file, strict=True)
        sd = model.state_dict()
        mine = d.checkpoint_tensors(include_embeddings=False)
        bad = [k for k in file if not torch.equal(sd[k], file[k].to(sd[k].dtype))]
        bad += [k for k in file if not torch.equal(file[k], mine[k])]
        expect(not bad, f"differ after load or from dspark's: {bad}")

    def loaded():
        AutoDraftModel = sf_classes()[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoDraftModel.from_pretrained(str(folder))
        file, sd = tensors(folder), model.state_dict()
        bad = [k for k in file if not torch.equal(sd[k], file[k].to(sd[k].dtype))]
        expect(not bad, f"differ after from_pretrained: {bad}")
        # SpecForge's model holds every tensor in the config's dtype; dspark may store some in float32
        cast = [f"{k} {file[k].dtype}->{sd[k].dtype}" for k in file if file[k].dtype != sd[k].dtype]
        return f"dtype {model.dtype}" + (f"; cast on load: {cast}" if cast else "")

    check(f"[{name}] dspark writes format='specforge'", write)
    if not (folder / "config.json").is_file():
        return
    check(f"[{name}] SpecForge AutoDraftModelConfig.from_file + AutoDraftModel.from_config", build)
    if "model" not in state:
        return
    check(f"[{name}] SpecForge's block / taps / mask / heads / RoPE == dspark's", fields)
    check(f"[{name}] model.safetensors vs SpecForge state_dict: names, shapes", keys)
    check(f"[{name}] load_state_dict(strict=True), values bit for bit", strict)
    check(f"[{name}] AutoDraftModel.from_pretrained bit for bit", loaded)


def dspark_to_specforge(target, out: Path) -> None:
    def fresh(**kw):
        kw = {"block_size": 4, "num_layers": 2, "target_layer_ids": [0, 2, 3], "initializer_range": 0.2, **kw}
        return DSparkDrafter.from_config(target, **kw).eval()

    def noanchor(d: DSparkDrafter, tag: str, **more) -> DSparkDrafter:
        return edited(d, target, out / f"src-{tag}", sample_from_anchor=False, **more)

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    torch.manual_seed(0)
    cases: list[tuple[str, Callable[[], DSparkDrafter]]] = [
        ("ds-vanilla-conf", lambda: noanchor(random_drafter(target, block_size=4, markov_rank=8), "v")),
        ("ds-gated", lambda: noanchor(fresh(markov_rank=8, markov_head_type="gated"), "g")),
        (
            "ds-rnn-conf-nomarkovfeat",
            lambda: noanchor(
                fresh(markov_rank=8, markov_head_type="rnn", confidence_head_with_markov=False), "r"
            ),
        ),
        ("ds-conf-only", lambda: noanchor(fresh(markov_rank=0, enable_confidence_head=True), "c")),
        ("ds-headless-dflash", lambda: noanchor(fresh(markov_rank=0, enable_confidence_head=False), "h")),
        ("ds-mha", lambda: noanchor(fresh(markov_rank=8, num_key_value_heads=4), "m")),
        ("ds-yarn", lambda: noanchor(fresh(markov_rank=8), "y", rope_scaling=yarn)),
    ]
    bt = copy.deepcopy(target).to(torch.bfloat16)  # a bf16 drafter needs a bf16 target (pairing)

    def bf16() -> DSparkDrafter:
        d = DSparkDrafter.from_config(
            bt, block_size=4, target_layer_ids=[0, 2, 3], markov_rank=8, dtype=torch.bfloat16
        )
        return edited(d.eval(), bt, out / "src-b", sample_from_anchor=False)

    cases.append(("ds-bf16", bf16))
    for name, make in cases:
        try:
            d = make()
        except Exception as e:
            check(f"[{name}] build the dspark drafter", raiser(e))
            continue
        check_dspark_written(name, d, out)

    def refuses_anchor():
        try:
            fresh(markov_rank=8).save_pretrained(out / "refused", format="specforge")
        except ValueError as e:
            expect("sample_from_anchor" in str(e), f"refused for another reason: {e}")
            return "ValueError (SpecForge drafts slots 1 .. block_size - 1 only, dflash.py:525)"
        raise AssertionError("a sample_from_anchor=true drafter was written")

    check("[ds-anchor] writer refuses sample_from_anchor=true", refuses_anchor)


def main() -> int:
    why = skip_reason()
    if why is not None:
        print(f"SKIP  SpecForge's modeling code cannot be imported ({why}); put it on PYTHONPATH")
        return 0
    from importlib.metadata import PackageNotFoundError, version

    import specforge
    import transformers

    try:
        v = version("specforge")
    except PackageNotFoundError:
        v = "?"
    where = Path(specforge.__file__).parent
    print(f"specforge {v} ({where}), transformers {transformers.__version__}, torch {torch.__version__}")
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="dspark-specforge-") as tmp:
        out = Path(tmp)
        target = tiny_model("qwen3", layers=5)
        dspark_to_specforge(target, out)
        specforge_to_dspark(target, out)
    failed = RESULTS.count(False)
    print(f"{len(RESULTS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
