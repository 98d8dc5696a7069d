# SPDX-License-Identifier: Apache-2.0
"""Check dspark's ``speculators`` packaging against vLLM's own loader code (checked with the vLLM 0.34.0 wheel).

dspark drafters (tiny random ones, on tiny random Qwen3 / Llama targets: full and reduced draft vocabulary,
Markov and confidence heads on and off, the headless DFlash layout) are written with
``save_pretrained(format="speculators")`` and handed to vLLM's code, on CPU:

* config: ``vllm.transformers_utils.config.get_config`` (the path ``vllm serve`` takes; it picks
  ``SpeculatorsConfig`` and runs the registered ``update_dspark`` / ``update_dflash``) parses ``config.json``;
  every field dspark meant is compared (architecture, taps with vLLM's i - 1 convention, mask token, block,
  anchor sampling, Markov rank and type, confidence-head flags, draft vocabulary, the Qwen3 fields).
  ``maybe_override_with_speculators`` (``vllm serve <drafter>``) yields the method, ``num_speculative_tokens``
  and the verifier; ``SpeculativeConfig`` + ``VllmConfig`` build the draft ``ModelConfig`` through that path,
  choose the speculator (``DSparkSpeculatorConfig`` / ``DFlashSpeculatorConfig``), its number of draft queries and
  the draft attention's causality (``dflash_has_any_non_causal``).
* weights: the draft model class vLLM's registry names for the architecture (``Qwen3DSparkForCausalLM`` /
  ``DFlashQwen3ForCausalLM``) is built from that ``VllmConfig`` (vLLM's real layers, a world-size-1 gloo group),
  every parameter is set to NaN, the model's own ``load_weights`` reads ``model.safetensors`` (its renaming, q/k/v
  and gate/up stacking, ``d2t`` -> ``draft_id_to_target_id``, ``t2d`` skipped; an unknown name raises there), then
  ``process_weights_after_loading``. Checked: no parameter is left NaN except those vLLM fills from elsewhere
  (``mask_embedding``; ``embed_tokens`` / ``lm_head`` when the file has none: shared from the target), every
  file tensor sits bit for bit in its parameter (the shard of a stacked one, the rows of a padded vocabulary
  table), ``map_draft_to_target`` gives the draft vocabulary, and every draft layer is non-causal.
* negative controls: an unknown tensor name is refused by vLLM's loader; a missing tensor is caught.

Not exercised: vLLM's forward passes, attention backends, KV-cache writes and CUDA / CPU kernels (no compiled
vLLM ops are loaded), ``load_dspark_model``'s sharing of the target's embedding / LM head, tensor parallelism,
quantisation, and the engine. One vLLM function is replaced: ``CpuPlatform.check_and_update_config`` (it refuses
an x86 CPU without triton-cpu; nothing here runs a kernel). ``VLLM_TARGET_DEVICE=cpu`` selects vLLM's CPU platform.

Run (vLLM's ``vllm/`` folder and its pure-Python dependencies on PYTHONPATH; exits 0 with a SKIP line when it
cannot be imported)::

    PYTHONPATH=/tmp/vllm/src:/tmp/vllmdeps .venv/bin/python scripts/check_vllm_package.py

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

import vllm_check_helpers as vh  # noqa: E402  (sets VLLM_TARGET_DEVICE before vLLM is imported)
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
from tests.decoding.toy_models import random_drafter  # noqa: E402
from tests.models.tiny import tiny_model  # noqa: E402

LAYER_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "num_hidden_layers",
    "rms_norm_eps",
)


def wanted_fields(d: DSparkDrafter, mtype: str) -> dict:
    """The vLLM draft-config fields dspark means (algos.py update_dspark / update_dflash)."""
    c = d.config
    aux = [i + 1 for i in c.target_layer_ids]
    want = {
        "draft_vocab_size": c.vocab_size if d.draft_vocab is None else d.draft_vocab.numel(),
        "eagle_aux_hidden_state_layer_ids": aux,
    }
    if mtype == "dflash":
        want.update(
            architectures=["DFlashDraftModel"],
            dflash_config={
                "mask_token_id": c.mask_token_id,
                "target_layer_ids": list(c.target_layer_ids),
                "sample_from_anchor": False,
                "causal": False,  # dspark's block attends bidirectionally
            },
        )
        return want
    want.update(
        architectures=["Qwen3DSparkModel"],
        target_layer_ids=list(c.target_layer_ids),
        mask_token_id=c.mask_token_id,
        block_size=c.block_slots,
        sample_from_anchor=c.sample_from_anchor,
        dspark_bonus_anchor=not c.sample_from_anchor,
        markov_rank=c.markov_rank,
        enable_confidence_head=c.enable_confidence_head,
        confidence_head_with_markov=c.confidence_head_with_markov and c.has_markov,
    )
    if c.has_markov:
        want["markov_head_type"] = c.markov_head_type
    return want


def check_case(name: str, d: DSparkDrafter, target_dir: Path, out: Path) -> None:
    """The checks of one dspark drafter written in the speculators format and read by vLLM."""
    v = vh.vllm_modules()
    c = d.config
    folder = out / name
    st: dict = {}

    def write():
        d.save_pretrained(folder, format="speculators", verifier=vh.VERIFIER)
        st["mtype"] = json.loads((folder / "config.json").read_text())["speculators_model_type"]
        return st["mtype"]

    def parse():
        cfg = v["get_config"](str(folder), trust_remote_code=False)
        expect(type(cfg) is v["SpeculatorsConfig"], f"parsed as {type(cfg).__name__}")
        want = wanted_fields(d, st["mtype"])
        got = {k: getattr(cfg, k, "<absent>") for k in want}
        diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
        expect(not diff, f"fields (vLLM, dspark) differ: {diff}")
        layer = {k: getattr(cfg, k, None) for k in LAYER_FIELDS}
        layer["rope_theta"] = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
        mine = {k: getattr(c, k) for k in layer}
        expect(layer == mine, f"Qwen3 fields {layer} != dspark's {mine}")
        return f"{cfg.architectures[0]}, {len(want) + len(layer)} fields"

    def override():
        model, tok, spec = v["maybe_override_with_speculators"](str(folder), None, False)
        want = {"method": st["mtype"], "num_speculative_tokens": c.block_size, "model": str(folder)}
        got = {k: spec.get(k) for k in want}
        expect(got == want, f"{got} != {want}")
        expect(model == tok == vh.VERIFIER, f"verifier {model!r} / {tok!r}")
        st["n"] = spec["num_speculative_tokens"]
        return f"method {spec['method']}, num_speculative_tokens {st['n']}"

    def speculative():
        sc = vh.speculative_config(folder, st["mtype"], st["n"], st["target"])
        cfg = vh.vllm_config(st["target"], sc)
        hf = sc.draft_model_config.hf_config
        kind = {"dspark": "DSparkSpeculatorConfig", "dflash": "DFlashSpeculatorConfig"}[st["mtype"]]
        expect(
            type(sc.speculator_config).__name__ == kind, f"speculator {type(sc.speculator_config).__name__}"
        )
        queries = sc.speculator_config.num_lookahead_tokens
        expect(queries == c.block_slots, f"{queries} draft queries, dspark's block has {c.block_slots} slots")
        expect(v["dflash_has_any_non_causal"](hf), "vLLM would run the draft block causally")
        st["cfg"] = cfg
        return f"{hf.architectures[0]}, {kind}, {queries} queries, non-causal"

    def default_tokens():
        # num_speculative_tokens left out of --speculative-config: DSparkSpeculatorConfig takes block_size
        sc = vh.speculative_config(folder, "dspark", None, st["target"])
        n = sc.num_speculative_tokens
        if c.sample_from_anchor:
            expect(n == c.block_size, f"vLLM's default {n} != dspark's {c.block_size} drafts")
            return f"{n}"
        expect(n == c.block_slots, f"vLLM's default {n}")  # vLLM 0.34.0: block_size, one more than the drafts
        return f"{n} = block_size: one more than dspark's {c.block_size} drafts; pass num_speculative_tokens"

    def build():
        st["model"] = vh.build_model(st["cfg"])
        return type(st["model"]).__name__

    def loads():
        model, file = st["model"], tensors(folder)
        vh.poison(model)
        vh.load(model, st["cfg"], file)
        shared = {"model.mask_embedding"}  # DSpark masks through the vocabulary row (qwen3_dspark.py:344)
        if "embed_tokens.weight" not in file:
            shared.add("model.embed_tokens.weight")
        if "lm_head.weight" not in file:
            shared.add("lm_head.weight")
        left = sorted(set(vh.untouched(model)) - shared)
        expect(not left, f"vLLM parameters left unloaded: {left}")
        bad = vh.compare(model, file)
        expect(not bad, f"{bad}")
        st["loaded"] = True
        return f"{len(file)} tensors; from the target: {sorted(shared - {'model.mask_embedding'})}"

    def vocab():
        model = st["model"]
        ids = torch.arange(d.draft_vocab.numel())
        if hasattr(model, "map_draft_to_target"):  # Qwen3DSparkForCausalLM
            got = model.map_draft_to_target(ids)
        else:  # DFlashQwen3ForCausalLM.compute_logits scatters to arange + d2t (qwen3_dflash.py:938-939)
            got = ids + model.draft_id_to_target_id
        expect(torch.equal(got, d.draft_vocab.to(got.dtype)), "draft ids map to other target ids")
        return f"{ids.numel()} draft ids"

    def causal():
        flags = st["model"].get_draft_attn_causal()
        expect(not any(flags), f"causal per layer {flags}")
        return f"{len(flags)} layers"

    check(f"[{name}] dspark writes format='speculators'", write)
    if "mtype" not in st:
        return
    st["target"] = vh.target_config(target_dir)
    check(f"[{name}] vLLM get_config -> SpeculatorsConfig (update_{st['mtype']}): fields", parse)
    check(f"[{name}] vLLM maybe_override_with_speculators: method, tokens, verifier", override)
    if "n" not in st:
        return
    check(f"[{name}] vLLM SpeculativeConfig + VllmConfig: speculator, queries, causality", speculative)
    if st["mtype"] == "dspark":
        check(f"[{name}] vLLM default num_speculative_tokens (none given)", default_tokens)
    if "cfg" not in st:
        return
    check(f"[{name}] vLLM builds the registry's draft model class", build)
    if "model" not in st:
        return
    check(f"[{name}] vLLM load_weights: every tensor in its parameter, none left unloaded", loads)
    if d.draft_vocab is not None and "loaded" in st:
        check(f"[{name}] vLLM's d2t maps draft ids to the draft vocabulary", vocab)
    check(f"[{name}] vLLM get_draft_attn_causal: every draft layer non-causal", causal)


def check_refused(name: str, d: DSparkDrafter, target_dir: Path, out: Path, what: str) -> None:
    """A drafter vLLM cannot serve: dspark warns when writing it, and vLLM's loader refuses it loudly."""
    folder = out / name

    def write():
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            d.save_pretrained(folder, format="speculators", verifier=vh.VERIFIER)
        msgs = [str(w.message) for w in got if "vLLM" in str(w.message)]
        expect(msgs, "dspark wrote it without warning that vLLM cannot serve it")
        return msgs[0][:100]

    def refused():
        target = vh.target_config(target_dir)
        cfg = vh.vllm_config(target, vh.speculative_config(folder, "dspark", d.config.block_size, target))
        model = vh.build_model(cfg)
        try:
            vh.load(model, cfg, tensors(folder))
        except (ValueError, KeyError) as e:
            return f"{type(e).__name__}: {str(e)[:90]}"
        raise AssertionError("vLLM loaded it silently (as a vanilla head)")

    check(f"[{name}] dspark warns that vLLM 0.34.0 cannot serve {what}", write)
    if (folder / "config.json").is_file():
        check(f"[{name}] vLLM's loader refuses it loudly", refused)


def negative_controls(d: DSparkDrafter, target_dir: Path, out: Path) -> None:
    """The load check can fail: an unknown tensor is refused by vLLM; a missing one is left NaN and named."""
    folder = out / "neg"
    d.save_pretrained(folder, format="speculators", verifier=vh.VERIFIER)
    target = vh.target_config(target_dir)

    def fresh_config():  # one VllmConfig per model: each registers its attention layers by name
        return vh.vllm_config(target, vh.speculative_config(folder, "dspark", d.config.block_size, target))

    def unknown():
        cfg = fresh_config()
        file = {**tensors(folder), "markov_head.no_such_proj.weight": torch.zeros(2, 2)}
        try:
            vh.load(vh.build_model(cfg), cfg, file)
        except (ValueError, KeyError) as e:
            return f"{type(e).__name__}: {str(e)[:80]}"
        raise AssertionError("an unknown tensor name was accepted")

    def missing():
        file = tensors(folder)
        file.pop("norm.weight")
        cfg = fresh_config()
        model = vh.build_model(cfg)
        vh.poison(model)
        vh.load(model, cfg, file)
        left = vh.untouched(model)
        expect("model.norm.weight" in left, f"a missing norm.weight went unnoticed (untouched: {left})")
        return f"untouched: {left}"

    check("[negative control] vLLM's loader refuses an unknown tensor name", unknown)
    check("[negative control] a tensor missing from the file is caught", missing)


def run_cases(targets: dict, target_dirs: dict, out: Path) -> None:
    qwen, llama = targets["qwen3"], targets["llama"]

    torch.manual_seed(0)
    cases: list[tuple[str, str, Callable[[], DSparkDrafter]]] = [
        ("ds-vanilla-conf-full", "qwen3", lambda: random_drafter(qwen, block_size=4, markov_rank=8)),
        (
            "ds-vanilla-conf-vocab-llama",
            "llama",
            lambda: with_draft_vocab(random_drafter(llama, markov_rank=8)),
        ),
        (
            "ds-vanilla-conf-nomarkovfeat-vocab",
            "qwen3",
            lambda: with_draft_vocab(fresh_drafter(qwen, markov_rank=8, confidence_head_with_markov=False)),
        ),
        ("ds-markov-only", "qwen3", lambda: fresh_drafter(qwen, markov_rank=8, enable_confidence_head=False)),
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
            "ds-dflash-layout-vocab",
            "llama",
            lambda: with_draft_vocab(
                edited(
                    fresh_drafter(llama, markov_rank=0), llama, out / "src-dflash-v", sample_from_anchor=False
                )
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
        check_case(name, d, target_dirs[family], out)
    for head in ("gated", "rnn"):
        try:
            d = random_drafter(qwen, markov_rank=8, head=head)
        except Exception as e:
            check(f"[ds-{head}] build the dspark drafter", raiser(e))
            continue
        check_refused(f"ds-{head}", d, target_dirs["qwen3"], out, f"markov_head_type {head!r}")
    try:
        negative_controls(random_drafter(qwen, markov_rank=8), target_dirs["qwen3"], out)
    except Exception as e:
        check("[negative control] set up", raiser(e))


def main() -> int:
    try:
        vh.vllm_modules()
        import vllm.model_executor.models.qwen3_dspark  # noqa: F401
    except Exception as e:
        print(
            f"SKIP  vLLM cannot be imported ({type(e).__name__}: {e}); put its vllm/ folder and its "
            "dependencies on PYTHONPATH"
        )
        return 0
    import transformers
    import vllm

    where = Path(vllm.__file__).parent
    print(
        f"vLLM {vllm.__version__} ({where}), transformers {transformers.__version__}, torch {torch.__version__}"
    )
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning)
    vh.cpu_platform()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="dspark-vllm-") as tmp:
        out = Path(tmp)
        targets = {f: tiny_model(f, layers=5) for f in ("qwen3", "llama")}
        target_dirs = {}
        for f, t in targets.items():
            target_dirs[f] = out / f"target-{f}"
            t.save_pretrained(target_dirs[f])
        run_cases(targets, target_dirs, out)
    failed = RESULTS.count(False)
    print(f"{len(RESULTS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
