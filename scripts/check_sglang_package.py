# SPDX-License-Identifier: Apache-2.0
"""Check the drafters dspark writes against SGLang's own loader code (checked with the sglang 0.5.23 wheel).

dspark drafters (tiny random ones on a tiny random Qwen3 target) are written with ``save_pretrained`` in the
layout SGLang serves them from and handed to SGLang's code, on CPU, as ``python -m sglang.launch_server
--model-path <target> --speculative-algorithm DSPARK|DFLASH --speculative-draft-model-path <drafter>`` would:

* server: ``ServerArgs`` for the pair, published as the runtime context; a gloo process group of one.
* config: ``get_config`` (the draft ``hf_config``), ``parse_dspark_draft_config`` / ``parse_dflash_draft_config``
  and ``resolve_runtime_config`` (the DSpark worker's gamma, verify window and mask token, with and without
  ``--speculative-num-draft-tokens``); every field dspark meant is compared.
* weights: ``ModelConfig.from_server_args(..., is_draft_model=True)``, then ``DefaultModelLoader.load_model``'s
  steps: the registry's class for the architecture (``Qwen3DSparkModel`` / ``DSparkDraftModel`` /
  ``DFlashDraftModel``) is built, every parameter set to NaN, the folder's tensors read through the model's own
  ``load_weights`` (q/k/v and gate/up stacking, the Markov and confidence heads; the DFlash part ignores unknown
  names, so the check itself looks for every file tensor in the model). Checked: no parameter left NaN, every
  file tensor bit for bit in its parameter, except what SGLang takes from the target (``embed_tokens``,
  ``lm_head``), and the built heads (Markov head type, confidence input, gamma, anchor sampling, taps).
  The confidence head is built only when ``SGLANG_RAGGED_VERIFY_MODE`` is not ``static`` (its default), so
  both are loaded.
* refusals: what SGLang cannot serve fails loudly there (no Markov head, a draft vocabulary, a confidence head
  missing under a ragged verify mode).
* negative controls: an unknown backbone tensor (which SGLang's loader skips silently) and a missing one are
  caught by the check; an unknown Markov tensor is refused by SGLang.

Not exercised: forward passes, attention backends, KV-cache pools, CUDA graphs, tensor parallelism,
quantisation, the scheduler. Replaced: ``torchvision`` and ``vllm`` by empty stand-ins (``sglang_check_helpers``).

Run (the wheel's ``sglang/`` folder and its pure-Python dependencies on PYTHONPATH; exits 0 with a SKIP line
when it cannot be imported)::

    PYTHONPATH=/tmp/sg/pkg:/tmp/sg/deps .venv/bin/python scripts/check_sglang_package.py

One PASS / FAIL line per check; the exit status is 1 when any check fails.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sglang_check_helpers as sh  # noqa: E402
from speculators_check_common import (  # noqa: E402  (puts the repository on sys.path first)
    RESULTS,
    built,
    check,
    edited,
    expect,
    fresh_drafter,
    raiser,
    tensors,
    with_draft_vocab,
)

from dspark import DSparkDrafter  # noqa: E402
from dspark.models import packagings  # noqa: E402
from dspark.models.packagings.sglang import serving_notes  # noqa: E402
from tests.decoding.toy_models import random_drafter  # noqa: E402
from tests.models.tiny import tiny_model  # noqa: E402

# SGLang's draft takes the target's (models/dspark.py:550-558, 631-641)
TARGET_OWNED = ("embed_tokens.", "lm_head.")
MARKOV_CLASS = {"vanilla": "VanillaMarkov", "gated": "GatedMarkovHead", "rnn": "RNNHead"}


def dtype_name(d: DSparkDrafter) -> str:
    return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(d.config.dtype, "float32")


def check_served(
    name: str, d: DSparkDrafter, fmt: str, algorithm: str, target_dir: Path, out: Path, dropped: tuple = ()
) -> None:
    """The checks of one dspark drafter SGLang serves: written in ``fmt``, loaded for ``algorithm``.
    ``dropped``: prefixes of the dspark-only tensors SGLang has no parameter for (its loader skips them)."""
    c = d.config
    folder = out / name
    st: dict = {}

    def write():
        d.save_pretrained(folder, format=fmt)
        st["doc"] = json.loads((folder / "config.json").read_text())
        return st["doc"]["architectures"][0]

    def args(n: int | None = None):
        return sh.server_args(target_dir, folder, algorithm, dtype_name(d), n)

    def parse():
        s = sh.sglang_modules()
        hf = s["get_config"](str(folder), trust_remote_code=False)
        want = {"target_layer_ids": list(c.target_layer_ids), "mask_token_id": c.mask_token_id}
        if algorithm == "DSPARK":
            p = s["parse_dspark_draft_config"](draft_hf_config=hf)
            got = {
                "target_layer_ids": p.target_layer_ids,
                "mask_token_id": p.mask_token_id,
                "markov_rank": p.markov_rank,
                "markov_head_type": p.markov_head_type,
                "sample_from_anchor": s["get_dspark_sample_from_anchor"](hf),
                "gamma": p.gamma,
            }
            want.update(
                markov_rank=c.markov_rank,
                markov_head_type=c.markov_head_type,
                sample_from_anchor=c.sample_from_anchor,
                gamma=c.block_slots,  # the written block_size, read as gamma (dspark_config.py:295-297)
            )
        else:
            p = s["parse_dflash_draft_config"](draft_hf_config=hf)
            got = {"target_layer_ids": p.target_layer_ids, "mask_token_id": p.mask_token_id}
            got["block_size"], want["block_size"] = p.block_size, c.block_slots
        diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
        expect(not diff, f"fields (SGLang, dspark) differ: {diff}")
        layer = {k: getattr(hf, k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads")}
        mine = {k: getattr(c, k) for k in layer}
        expect(layer == mine, f"Qwen3 fields {layer} != dspark's {mine}")
        st["hf"] = hf
        return f"{hf.architectures[0]}, {len(want) + len(layer)} fields"

    def runtime():
        resolve = sh.sglang_modules()["resolve_runtime_config"]
        vocab = c.vocab_size
        default = resolve(
            draft_hf_config=st["hf"], speculative_num_draft_tokens=None, target_vocab_size=vocab
        )
        given = resolve(
            draft_hf_config=st["hf"], speculative_num_draft_tokens=c.block_size + 1, target_vocab_size=vocab
        )
        expect(
            given.gamma == c.block_size, f"--speculative-num-draft-tokens {c.block_size + 1}: {given.gamma}"
        )
        expect(default.mask_token_id == c.mask_token_id, f"mask token {default.mask_token_id}")
        if c.sample_from_anchor:
            expect(default.gamma == c.block_size, f"gamma {default.gamma} != dspark's {c.block_size} drafts")
            return f"gamma {default.gamma}, verify window {default.verify_num_draft_tokens}"
        expect(default.gamma == c.block_slots, f"gamma {default.gamma}")
        return (
            f"gamma {default.gamma} = block_size: one more than dspark's {c.block_size} drafts; pass "
            f"--speculative-num-draft-tokens {c.block_size + 1}"
        )

    def loads(mode: str):
        def fn():
            os.environ[sh.RAGGED_MODE] = mode
            model = sh.load_draft(sh.draft_model_config(args(), folder))
            file = tensors(folder)
            left = sh.untouched(model)
            expect(not left, f"SGLang parameters left unloaded: {left}")
            skipped = TARGET_OWNED + (("confidence_head.",) if mode == "static" else ())
            bad, casts = sh.compare(model, file, skipped + dropped)
            expect(not bad, f"{bad}")
            params = dict(model.named_parameters())
            lost = sorted(n for n in file if n.startswith(dropped) and dropped)
            placed = [n for n in lost if sh.sglang_slice(params, n, model)[1] is not None]
            expect(not placed and bool(lost) == bool(dropped), f"dspark-only tensors {lost}, placed {placed}")
            st[mode], st["lost"] = model, lost
            from_target = sorted({n for n in file if n.startswith(TARGET_OWNED)})
            note = f"{type(model).__name__}, {len(file)} tensors"
            note += f"; the target's instead: {from_target}" if from_target else ""
            note += f"; held exactly in another dtype: {casts}" if casts else ""
            return note + (f"; skipped by SGLang: {lost}" if lost else "")

        return fn

    def heads():
        model = st["cap-accept"]
        if algorithm == "DFLASH":
            expect(model.block_size == c.block_slots, f"block {model.block_size} != {c.block_slots} slots")
            return f"block_size {model.block_size}, {model.num_context_features} taps"
        got = {
            "gamma": model.gamma,
            "sample_from_anchor": model.sample_from_anchor,
            "markov": type(model.markov_head).__name__,
            "taps": model.num_context_features,
            "confidence_with_markov": model.confidence_head.with_markov,
        }
        want = {
            "gamma": c.block_slots,
            "sample_from_anchor": c.sample_from_anchor,
            "markov": MARKOV_CLASS[c.markov_head_type],
            "taps": c.num_taps,
            "confidence_with_markov": c.confidence_input_rank > 0,
        }
        diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
        expect(not diff, f"(SGLang, dspark) differ: {diff}")
        return ", ".join(f"{k} {v}" for k, v in got.items())

    def notes():
        said = serving_notes(packagings.read(folder), fmt)
        dspark_algo = algorithm == "DSPARK"  # DFLASH's block_size counts the anchor, and it has no heads
        seen = {
            "gamma": dspark_algo and not c.sample_from_anchor,  # what resolve_runtime_config did (above)
            "skips": bool(st.get("lost")),
            "vocabulary": d.draft_vocab is not None,
            "static": dspark_algo and not c.enable_confidence_head,
        }
        told = {k: any(k in n for n in said) for k in seen}
        expect(told == seen and len(said) == sum(seen.values()), f"notes {said} for {seen}")
        return "; ".join(said) or "none (served as trained)"

    check(f"[{name}] dspark writes format={fmt!r}", write)
    if "doc" not in st:
        return
    check(f"[{name}] SGLang get_config + parse_{algorithm.lower()}_draft_config: fields", parse)
    if "hf" not in st:
        return
    if algorithm == "DSPARK":
        check(f"[{name}] SGLang resolve_runtime_config: gamma, verify window, mask", runtime)
    check(f"[{name}] SGLang loader (ragged verify static): every tensor in its parameter", loads("static"))
    check(f"[{name}] SGLang loader (ragged verify cap-accept): the confidence head too", loads("cap-accept"))
    if "cap-accept" in st:
        check(f"[{name}] SGLang's built draft agrees with dspark's config", heads)
        check(f"[{name}] dspark convert's SGLang notes say what SGLang did", notes)


def check_refused(name: str, d: DSparkDrafter, target_dir: Path, out: Path, what: str, mode: str) -> None:
    """A drafter SGLang cannot serve: its loader refuses it loudly."""
    folder = out / name

    def refused():
        d.save_pretrained(folder, format="deepspec")
        os.environ[sh.RAGGED_MODE] = mode
        args = sh.server_args(target_dir, folder, "DSPARK", dtype_name(d), None)
        try:
            sh.load_draft(sh.draft_model_config(args, folder))
        except (ValueError, AssertionError, RuntimeError) as e:
            return f"{type(e).__name__}: {str(e)[:100]}"
        raise AssertionError("SGLang loaded it silently")

    def noted():
        said = serving_notes(packagings.read(folder), "deepspec")
        expect(any(w in n for n in said for w in ("cannot serve", "refuses", "static")), f"notes {said}")
        return "; ".join(said)

    check(f"[{name}] SGLang refuses {what} loudly (ragged verify {mode})", refused)
    check(f"[{name}] dspark convert's SGLang notes say so", noted)


def negative_controls(d: DSparkDrafter, target_dir: Path, out: Path) -> None:
    """The load check can fail: an unknown backbone tensor (skipped by SGLang) and a missing one are caught; an
    unknown Markov tensor is refused by SGLang."""
    folder = out / "neg"
    d.save_pretrained(folder, format="deepspec")

    def loaded(file: dict):
        os.environ[sh.RAGGED_MODE] = "static"
        args = sh.server_args(target_dir, folder, "DSPARK", "float32", None)
        return sh.load_draft(sh.draft_model_config(args, folder), file)

    def unknown_backbone():
        file = {**tensors(folder), "layers.0.self_attn.no_such_proj.weight": torch.zeros(2, 2)}
        model = loaded(file)
        bad, _ = sh.compare(model, file, TARGET_OWNED + ("confidence_head.",))
        expect(bad, "an unknown tensor name went unnoticed")
        return f"SGLang skipped it; the check says {bad}"

    def missing():
        file = tensors(folder)
        file.pop("norm.weight")
        left = sh.untouched(loaded(file))
        expect("norm.weight" in left, f"a missing norm.weight went unnoticed (untouched: {left})")
        return f"untouched: {left}"

    def unknown_markov():
        file = {**tensors(folder), "markov_head.no_such_proj.weight": torch.zeros(2, 2)}
        try:
            loaded(file)
        except (ValueError, KeyError) as e:
            return f"{type(e).__name__}: {str(e)[:80]}"
        raise AssertionError("an unknown Markov tensor was accepted")

    check("[negative control] an unknown backbone tensor is caught", unknown_backbone)
    check("[negative control] a tensor missing from the file is caught", missing)
    check("[negative control] SGLang's loader refuses an unknown Markov tensor", unknown_markov)


def run_cases(qwen, target_dir: Path, out: Path) -> None:
    noanchor = lambda d, tag: edited(d, qwen, out / f"src-{tag}", sample_from_anchor=False)  # noqa: E731
    served: list[tuple[str, str, Callable[[], DSparkDrafter]]] = [
        ("ds-vanilla-conf", "deepspec DSPARK", lambda: random_drafter(qwen, block_size=4, markov_rank=8)),
        ("ds-gated-conf", "deepspec DSPARK", lambda: random_drafter(qwen, markov_rank=8, head="gated")),
        ("ds-rnn-conf", "deepspec DSPARK", lambda: random_drafter(qwen, markov_rank=8, head="rnn")),
        (
            "ds-vanilla-conf-nomarkovfeat",
            "deepspec DSPARK",
            lambda: fresh_drafter(qwen, markov_rank=8, confidence_head_with_markov=False),
        ),
        (
            "ds-bf16-own-embeddings",
            "deepspec DSPARK",
            lambda: fresh_drafter(qwen, markov_rank=8, dtype=torch.bfloat16, share_embeddings=False),
        ),
        ("ds-vocab", "deepspec DSPARK", lambda: with_draft_vocab(random_drafter(qwen, markov_rank=8))),
        ("ds-vanilla-noanchor", "deepspec DSPARK", lambda: noanchor(fresh_drafter(qwen, markov_rank=8), "a")),
        (
            "sf-vanilla-noanchor",
            "specforge DSPARK",
            lambda: noanchor(fresh_drafter(qwen, markov_rank=8), "b"),
        ),
        (
            "sf-gated-noanchor-conf-nomarkovfeat",
            "specforge DSPARK",
            lambda: noanchor(
                fresh_drafter(
                    qwen, markov_rank=8, markov_head_type="gated", confidence_head_with_markov=False
                ),
                "c",
            ),
        ),
        ("sf-dflash-headless", "specforge DFLASH", lambda: noanchor(fresh_drafter(qwen, markov_rank=0), "d")),
    ]
    for name, how, d in built(served):
        fmt, algorithm = how.split()
        check_served(name, d, fmt, algorithm, target_dir, out)
    for name, _, d in built(
        [("ds-copy-head", "", lambda: fresh_drafter(qwen, markov_rank=8, copy_head=True))]
    ):
        check_served(name, d, "deepspec", "DSPARK", target_dir, out, dropped=("copy_head.",))
    refused: list[tuple[str, str, str, Callable[[], DSparkDrafter]]] = [
        (
            "ds-conf-only",
            "a DSpark drafter without a Markov head",
            "static",
            lambda: fresh_drafter(qwen, markov_rank=0, enable_confidence_head=True),
        ),
        (
            "ds-headless",
            "a DFlash drafter in DeepSpec's layout",
            "static",
            lambda: fresh_drafter(qwen, markov_rank=0),
        ),
        (
            "ds-markov-only",
            "a drafter without a confidence head",
            "cap-accept",
            lambda: fresh_drafter(qwen, markov_rank=8, enable_confidence_head=False),
        ),
    ]
    for name, what, mode, make in refused:
        try:
            d = make()
        except Exception as e:
            check(f"[{name}] build the dspark drafter", raiser(e))
            continue
        check_refused(name, d, target_dir, out, what, mode)
    try:
        negative_controls(random_drafter(qwen, markov_rank=8), target_dir, out)
    except Exception as e:
        check("[negative control] set up", raiser(e))


def main() -> int:
    sh.install_stand_ins()
    try:
        sh.sglang_modules()
    except Exception as e:
        print(
            f"SKIP  SGLang cannot be imported ({type(e).__name__}: {e}); put its sglang/ folder and its "
            "dependencies on PYTHONPATH"
        )
        return 0
    import sglang
    import transformers

    where = Path(sglang.__file__).parent
    print(
        f"SGLang {sglang.__version__} ({where}), transformers {transformers.__version__}, torch {torch.__version__}"
    )
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="dspark-sglang-") as tmp:
        out = Path(tmp)
        qwen = tiny_model("qwen3", layers=5)
        target_dir = out / "target-qwen3"
        qwen.save_pretrained(target_dir)
        run_cases(qwen, target_dir, out)
    failed = RESULTS.count(False)
    print(f"{len(RESULTS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
