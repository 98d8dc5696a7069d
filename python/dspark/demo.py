# SPDX-License-Identifier: Apache-2.0
"""``dspark demo``: SmolLM2-135M-Instruct with the bundled drafter: plain decoding, DSpark and hybrid rounds.

For each prompt the target first answers with plain greedy decoding (Hugging Face ``generate`` with its
KV cache), then DSparkDecoder answers the same prompt with the bundled drafter, its STS temperatures and SPS
cost curve (DSpark alone), then with hybrid rounds (the drafter and lookup drafts from the prompt and answer,
``lookup=True``), then the same engine without drafts. Greedy DSpark and hybrid must reproduce plain decoding
token for token; the table shows the speed-ups, τ (tokens emitted per round) of DSpark and hybrid, and the share
of the hybrid's tokens that came from lookup drafts.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence

import torch

DEMO_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Explain what a hash map is and when to use one, in a short paragraph.",
    "Write a Python function is_palindrome(s) that ignores case and spaces, and two asserts that test it.",
)


def _plain(target, tok, ids: list[int], max_new_tokens: int) -> tuple[list[int], float]:
    inp = torch.tensor([ids])
    t0 = time.perf_counter()
    out = target.generate(
        inp,
        attention_mask=torch.ones_like(inp),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        top_k=None,
        top_p=None,
    )
    return out[0, len(ids) :].tolist(), time.perf_counter() - t0


def _timed_generate(dec, ids: list[int], max_new_tokens: int, speculative: bool = True):
    """(tokens, seconds, stats) of one greedy request."""
    t0 = time.perf_counter()
    out = dec.generate([ids], max_new_tokens=max_new_tokens, speculative=speculative)
    return out.sequences[0], time.perf_counter() - t0, out.stats


def fast_drafter_dtype(target_dtype: torch.dtype) -> torch.dtype:
    """bf16 where the CPU multiplies it in hardware and fp32 has no faster path, else the target's dtype.

    With AMX, or with AVX-512 BF16 where fp32 few-row linears take the weight-stationary path (AMD EPYC), the
    drafter's vocabulary-sized GEMMs are several times faster in bf16. Where they take the
    ``dspark::few_row_linear`` op instead (an Intel Xeon with AVX-512 BF16 and no AMX), fp32 was as fast or
    faster (a round of the bundled drafter at 1 / 8 requests: 13.4 / 26.2 ms fp32, 14.1 / 30.0 ms bf16).
    Exactness does not depend on the drafter's precision: the verifier uses the distribution the drafts were
    sampled from.
    """
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    avx_bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
    if amx or (avx_bf16 and not _fp32_few_row_op()):
        return torch.bfloat16
    return target_dtype


def _say_if_profiled_elsewhere(table) -> None:
    """One line when the bundled cost table was profiled on another machine, with the demo's remedy."""
    from dspark.decoding.machine import profiled_elsewhere

    elsewhere = profiled_elsewhere(getattr(table, "metadata", {}), torch.device("cpu"))
    if elsewhere:
        print(
            f"note: the bundled cost table was profiled {elsewhere}; `dspark demo --costs auto` profiles this "
            "machine once (about a minute) and caches it"
        )


def _fp32_few_row_op() -> bool:
    """Whether fp32 few-row linears go through ``dspark::few_row_linear`` here (see ``cpu_linear``)."""
    from dspark.models import cpu_linear

    return cpu_linear.default_max_rows() == 0 and cpu_linear._simd_x86()


def run_demo(
    prompts: Sequence[str] = DEMO_PROMPTS,
    *,
    max_new_tokens: int = 128,
    planner: str = "early_stop",
    dtype: torch.dtype | None = None,
    drafter_dtype: torch.dtype | None = None,
    costs: str = "bundled",
    show_answers: bool = True,
) -> list[dict]:
    """Run the demo and print the answers and the comparison table; returns one row per prompt.

    ``dtype`` is the target's (default float32). Plain decoding and DSpark both run in it. In
    float32 greedy DSpark reproduces plain decoding token for token. In bfloat16 the verify forward (several
    tokens at once) and the decode step round differently, so near-ties can go the other way and the texts can
    part, while each is still the target's greedy choice under its own forward (docs/decoder.md).
    ``drafter_dtype`` defaults to :func:`fast_drafter_dtype`. ``costs`` is the planner's cost table:
    ``"bundled"`` (the drafter's, profiled on the machine its metadata names) or ``"auto"`` (this machine's:
    :func:`dspark.profiling.local_cost_table`, profiled once and cached).
    """
    if costs not in ("bundled", "auto"):
        raise ValueError(f"costs: expected 'bundled' or 'auto', got {costs!r}")
    from dspark import DSparkDecoder, build_info
    from dspark.decoding.inputs import chat_token_ids
    from dspark.models.bundled import load_bundled_drafter
    from dspark.models.loading import load_smollm2

    info = build_info()
    print(f"dspark {info['version']} · torch {torch.__version__} · {torch.get_num_threads()} CPU threads")
    dtype = dtype or torch.float32
    drafter_dtype = drafter_dtype or fast_drafter_dtype(dtype)
    name = lambda d: str(d).removeprefix("torch.")  # noqa: E731
    print(
        f"loading SmolLM2-135M-Instruct ({name(dtype)}) and the bundled drafter ({name(drafter_dtype)}) ...",
        flush=True,
    )
    target, tok = load_smollm2(dtype=dtype)
    drafter, bundle = load_bundled_drafter(target, tok, dtype=drafter_dtype)
    c = drafter.config
    print(
        f"drafter {bundle.name}: {c.num_hidden_layers} layers, block {c.block_size}, Markov rank {c.markov_rank}, "
        f"taps {c.target_layer_ids}, "
        + (
            "whole vocabulary"
            if drafter.draft_vocab is None
            else f"{drafter.draft_vocab.numel()}-id draft vocabulary"
        )
        + f"; planner {planner}"
        + (", STS" if bundle.sts_for(0.0) else "")
        + (", SPS table" if bundle.sps else "")
    )
    # plain decoding first: the decoder switches the target's attention to dspark's paged backend
    warm = chat_token_ids(tok, "Hi")
    _plain(target, tok, warm, 4)
    ids_all = [chat_token_ids(tok, text) for text in prompts]
    plain_runs = [_plain(target, tok, ids, max_new_tokens) for ids in ids_all]
    if costs == "auto":
        from dspark.profiling.local import local_cost_table

        sps = local_cost_table(target, drafter)
        print(f"cost table of this machine: {sps.metadata['cache_path']}")
    else:
        from dspark.profiling import load

        sps = load(bundle.sps) if bundle.sps else None  # read once: checked here, priced by both decoders
        if sps is not None:
            _say_if_profiled_elsewhere(sps)
    settings = dict(
        planner=planner,
        sps_table=sps,
        sts=str(bundle.sts_for(0.0)) if bundle.sts_for(0.0) else None,  # the demo decodes greedily
        tokenizer=tok,
    )
    prior = bundle.lookup_prior
    with warnings.catch_warnings():  # said once above, with the demo's own remedy
        warnings.filterwarnings("ignore", message="sps_table: the cost table was profiled")
        dec = DSparkDecoder(target, drafter, **settings)
        hyb = DSparkDecoder(
            target, drafter, lookup=True, lookup_prior=str(prior) if prior else None, **settings
        )
    rows = []
    try:
        dec.generate([warm], max_new_tokens=4)
        hyb.generate([warm], max_new_tokens=4)
        for i, (text, ids, (plain, s_plain)) in enumerate(zip(prompts, ids_all, plain_runs, strict=True)):
            seq, s_ds, st = _timed_generate(dec, ids, max_new_tokens)
            hybrid, s_hyb, st_hyb = _timed_generate(hyb, ids, max_new_tokens)
            # the same engine without drafts: what speculation itself adds
            engine, s_engine, _ = _timed_generate(dec, ids, max_new_tokens, speculative=False)
            row = {
                "prompt": text,
                "plain_tok_s": len(plain) / s_plain,
                "engine_tok_s": len(engine) / s_engine,
                "dspark_tok_s": len(seq) / s_ds,
                "hybrid_tok_s": len(hybrid) / s_hyb,
                "tau": st.tau,
                "hybrid_tau": st_hyb.tau,
                "lookup_share": st_hyb.sources.get("lookup", {}).get("token_share", 0.0),
                "mean_verify_len": st.mean_verify_len,
                "identical": seq == plain,
                "hybrid_identical": hybrid == plain,
                "engine_identical": engine == plain,
                "tokens": len(seq),
            }
            row["speedup"] = row["dspark_tok_s"] / row["plain_tok_s"]
            row["speedup_vs_engine"] = row["dspark_tok_s"] / row["engine_tok_s"]
            row["hybrid_speedup"] = row["hybrid_tok_s"] / row["plain_tok_s"]
            rows.append(row)
            if show_answers:
                print(f"\n── prompt {i + 1}: {text}\n{tok.decode(hybrid, skip_special_tokens=True).strip()}")
    finally:
        hyb.close()
        dec.close()
    print(
        "\n(plain: Hugging Face generate; engine: dspark's engine without drafts; DSpark: the engine with the "
        "drafter; hybrid: the drafter and lookup drafts from the prompt and answer, the better block per round)"
    )
    print(
        "| # | tokens | plain tok/s | engine tok/s | DSpark tok/s | hybrid tok/s | speed-up (hybrid) "
        "| DSpark over engine | τ DSpark | τ hybrid | lookup share | same tokens as plain |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        same = "yes" if r["identical"] and r["hybrid_identical"] else "NO"
        print(
            f"| {i + 1} | {r['tokens']} | {r['plain_tok_s']:.1f} | {r['engine_tok_s']:.1f} | {r['dspark_tok_s']:.1f} "
            f"| {r['hybrid_tok_s']:.1f} | {r['hybrid_speedup']:.2f}x | {r['speedup_vs_engine']:.2f}x "
            f"| {r['tau']:.2f} | {r['hybrid_tau']:.2f} | {100 * r['lookup_share']:.0f}% | {same} |"
        )
    tp = sum(r["tokens"] for r in rows)
    sp = sum(r["tokens"] / r["plain_tok_s"] for r in rows)
    se = sum(r["tokens"] / r["engine_tok_s"] for r in rows)
    sd = sum(r["tokens"] / r["dspark_tok_s"] for r in rows)
    sh = sum(r["tokens"] / r["hybrid_tok_s"] for r in rows)
    print(
        f"\nall prompts (greedy, batch 1): plain {tp / sp:.1f} tok/s, engine {tp / se:.1f}, DSpark {tp / sd:.1f}, "
        f"hybrid {tp / sh:.1f} tok/s: hybrid speed-up {sp / sh:.2f}x over plain, {se / sh:.2f}x over the engine "
        f"without drafts, {sd / sh:.2f}x over DSpark alone"
    )
    return rows
