# SPDX-License-Identifier: Apache-2.0
"""The engine's round, stage by stage, on randomly initialised targets of real shapes (no downloads).

    python benchmarks/bench_e2e_gpu.py --device cuda --json out/e2e_gpu.json --sps out/costs.json
    python benchmarks/bench_e2e_gpu.py --device cpu --quick          # CI: a scaled-down (A), under a minute

Models (random weights, seeded; nothing is downloaded):

- (A) a SmolLM2-135M-shaped Llama (30 layers, hidden 576, 9/3 heads x 64, intermediate 1536, V 49,152, tied
  embeddings; ``--a-dtype``, default float32) with a drafter of the bundled drafter's architecture (read from its
  ``config.json``: 2 layers, taps [1, 8, 14, 20, 27], Markov rank 128, confidence head) and its 8,192-id draft
  vocabulary;
- (B), CUDA only: a Qwen3-8B-shaped target (36 layers, hidden 4096, 32/8 heads x 128, intermediate 12288,
  V 151,936, bf16, created on the device) with a drafter of DeepSpec's Qwen3-8B shape (5 layers of the target's
  width, taps [1, 9, 17, 25, 33], vanilla Markov rank 256, confidence head), whole vocabulary.

``--quick`` replaces (A) by a scaled-down shape of the same family (4 layers, hidden 64, 4/2 heads x 16, V 512;
drafter 2 layers, taps [0, 1, 2], rank 32, a 1/6 draft vocabulary), skips (B), runs R in {1, 2} and a few
rounds, and still prints every column and runs the greedy canary. On CPU without ``--quick`` only (A) runs.

What one batch size R measures (all greedy, EOS ignored, R random prompts of ``--context`` tokens):

1. **DSpark rounds at fixed verify lengths** l in ``--verify-lens`` (default 1, 4, 8; γ = 7, so l = 8 verifies
   every draft and l = 1 the anchor alone). One ``generate`` call runs a schedule of rounds: warm-up rounds, then
   for each l a couple of untimed rounds and ``--rounds`` timed ones. The planner is the library's
   ``early_stop`` planner run for real every round (so the plan stage costs ``plan_verify`` plus the host read
   of its result), its verify lengths then replaced by l for every request (models.FixedVerifyPlanner); the
   drafter drafts all γ slots every round (``adaptive_slots=False``), so draft, Markov sampling and confidence
   cost the same at every l and the verify stage is what l changes. Random weights accept almost no drafts, so
   a round commits about one token per request whatever l is: the measured τ means nothing, the round cost is
   what is measured.
2. **Per stage** (draft = backbone + LM head, markov_sample, confidence, plan, verify, accept, commit; the LM
   head moves to markov_sample where it runs inside the draw: (B)'s fused op, and graph rounds): ms from
   CUDA events on CUDA (``perf_counter`` on CPU) around each stage of each round, read after the call (timing.py
   says how, without changing the library); inside verify, the ``paged_verify_attention`` calls (attention's
   share) and ``paged_kv_append``; inside commit, the drafter's ``append_context``. Also the whole round on the
   device clock and on the host clock, and host syncs per round (``decoder.host.syncs``; 2 here: the plan and
   the accepted tokens).
3. **Baselines at the same R**: the engine without a drafter (``DSparkDecoder(target, None)``: its median round
   is the plain step time) and HF ``generate`` (one unpadded batch; step = (t(N) - t(1)) / (N - 1), so the
   prefill cancels). HF's cache: ``static`` on CUDA (``cache_implementation="static"``, with
   ``disable_compile=True`` unless ``--hf-compile``: HF would otherwise compile the forward for every batch
   size, minutes for (B)); it falls back to ``dynamic`` and says so if static fails; ``dynamic`` on CPU.
   Peak device memory (``torch.cuda.max_memory_allocated``, weights included) of each method.
4. **Greedy canary**: the DSpark and plain-engine tokens must equal HF ``generate``'s greedy tokens for the same
   prompts (the target's own greedy decoding: the prompts have equal lengths, so no padding). Where a sequence
   parts from HF's, the target's logits of the two tokens at that point are compared (one HF forward of the
   common prefix): a gap within rounding (1e-3 in fp32; 0.1 in bf16) is a near-tie, counted and shown but not
   a failure; random weights make near-ties likelier than a trained model does. Any other difference on (A)
   exits with status 1 after the report is written; on (B) (bf16) it is reported only.
5. **CUDA graphs** (CUDA, unless ``--no-graphs``): both engine runs again with ``cuda_graphs=True`` (the
   target's decode / verify forwards replayed from graphs bucketed by request and token count, the drafter's
   block forward from graphs bucketed by request count; the untimed
   first rounds of each l capture them), without op marks; their round times against the eager runs, the
   graphs' captures and pool memory, and their tokens in the greedy canary.
6. **Cost table and projection**: the timed rounds become dspark's cost table (verify ms per (R, B = R·l),
   drafter round ms per R; ``--sps PATH`` writes it, loadable as ``sps_table`` by the planner; with two models
   the model's key is inserted before the suffix: ``costs.A.json``, ``costs.B.json``), and projected tokens/s
   at τ in ``--taus`` (default 1.5, 2, 3, 4) = R·τ / t_round(R, l) for τ ≤ l, beside the plain engine's
   R / t_plain and HF's R / t_step. The projection assumes that a round with higher acceptance costs what these
   rounds cost (commit appends a few more drafter rows then).

Estimated H200 run time of the default CUDA run (not measured on one yet): a few seconds to create each model,
then per batch size about 40 DSpark rounds, 40 plain rounds and three HF calls; 2-4 minutes in all.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import env_info  # noqa: E402
from benchmarks.e2e_gpu import report  # noqa: E402
from benchmarks.e2e_gpu.models import (  # noqa: E402
    GAMMA,
    FixedVerifyPlanner,
    ModelSpec,
    build_drafter,
    build_target,
    describe_drafter,
    model_specs,
    random_prompts,
)
from benchmarks.e2e_gpu.timing import Clock, instrumented, run_engine, run_hf, tie_gap  # noqa: E402

# logit gap under which two greedy decodings may part at a token without an error. The random targets' logits
# have a spread of 0.17 (quick) / 0.48 (A) with top-two gaps of typically 0.05-0.5; fp32 forwards that add in
# different orders differ by orders of magnitude less than 1e-3, bf16 / fp16 ones by about 1e-2
TIE_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.05}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="CI size: scaled-down (A) only, R 1 2, few rounds")
    ap.add_argument("--batch", type=int, nargs="+", default=None, help="R values (default 1 8 32 64)")
    ap.add_argument("--verify-lens", type=int, nargs="+", default=[1, 4, 8], help="fixed l (1 .. γ + 1)")
    ap.add_argument("--taus", type=float, nargs="+", default=[1.5, 2.0, 3.0, 4.0])
    ap.add_argument(
        "--context", type=int, default=None, help="prompt tokens (default 256 on CUDA, 64 on CPU, 16 quick)"
    )
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds per l (default 10, quick 2)")
    ap.add_argument(
        "--warmup", type=int, default=None, help="untimed rounds before each l (default 2, quick 1)"
    )
    ap.add_argument("--a-dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--hf-cache", default="auto", choices=["auto", "static", "dynamic"])
    ap.add_argument("--hf-compile", action="store_true", help="let HF compile the static-cache forward")
    ap.add_argument(
        "--models", nargs="+", default=None, choices=["A", "B"], help="default: A (and B on CUDA)"
    )
    ap.add_argument(
        "--op-marks",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="mark every attention / KV-append call inside verify (two marks per layer; default: on)",
    )
    ap.add_argument(
        "--no-graphs",
        dest="graphs",
        action="store_false",
        help="CUDA: skip the second pair of engine runs with the target's forwards in CUDA graphs",
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="every engine run with decoder.compile(target=True): the target's norms and MLPs, the drafter's "
        "dense modules (HF generate stays eager)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    ap.add_argument("--json", type=Path, default=None, help="write every number here")
    ap.add_argument("--sps", type=Path, default=None, help="write the measured cost table(s) here")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to run on cuda", file=sys.stderr)
        sys.exit(0)
    quick = args.quick
    args.batch = args.batch or ([1, 2] if quick else [1, 8, 32, 64])
    args.context = args.context or (16 if quick else 256 if args.device == "cuda" else 64)
    args.rounds = args.rounds if args.rounds is not None else (2 if quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if quick else 2)
    if min(args.batch) < 1 or args.rounds < 1 or args.warmup < 0 or args.context < 1:
        ap.error("--batch, --rounds and --context must be >= 1, --warmup >= 0")
    if not all(1 <= n <= GAMMA + 1 for n in args.verify_lens):
        ap.error(f"--verify-lens must lie in [1, {GAMMA + 1}]")
    if args.models and "B" in args.models and (args.device != "cuda" or quick):
        ap.error("model B (Qwen3-8B shape) runs on CUDA only, and not with --quick")
    return args


def schedule(args: argparse.Namespace) -> list[tuple[int, bool]]:
    """``(l, timed)`` per round: first-call warm-up, then per l its warm-up and timed rounds."""
    first = 1 if args.quick else 3
    out = [(max(args.verify_lens), False)] * first
    for n in args.verify_lens:
        out += [(n, False)] * args.warmup + [(n, True)] * args.rounds
    return out


def _gap(target, prompts, ref, i: int, pos: int, a: int, b: int) -> float:
    """The target's logit gap between tokens ``a`` and ``b`` where request ``i`` parted from ``ref`` at ``pos``."""
    return tie_gap(target, prompts[i], ref[i][:pos], a, b)


def run_model(spec: ModelSpec, args: argparse.Namespace, device: torch.device, clock: Clock) -> dict:
    """Every batch size on one model; returns its JSON section (with the Batch objects under ``_batches``)."""
    t0 = time.perf_counter()
    target = build_target(spec, device)
    drafter = build_drafter(spec, target)
    build_s = time.perf_counter() - t0
    planner = FixedVerifyPlanner(GAMMA)
    plan = schedule(args)
    # the first token comes from the prefill, so without accepted drafts every scheduled round runs at full R;
    # the margin keeps the last timed rounds at full R when a few drafts are accepted (rounds past the
    # schedule run untimed)
    new_tokens = len(plan) + 1 + len(plan) // 2 + 2
    vocab = int(spec.config["vocab_size"])
    cache = args.hf_cache if args.hf_cache != "auto" else ("static" if device.type == "cuda" else "dynamic")
    first_plain = 1 if args.quick else 3
    plain_plan = [(1, i >= first_plain) for i in range(new_tokens)]
    batches = []
    print(f"[{spec.key}] {spec.name}: built in {build_s:.1f} s", file=sys.stderr, flush=True)
    for R in args.batch:
        prompts = random_prompts(R, args.context, vocab, seed=R)
        comp = args.compile
        with instrumented(ops=args.op_marks):
            spec_run = run_engine(
                target, drafter, prompts, plan, new_tokens, clock, planner, compile_models=comp
            )
            plain_run = run_engine(target, None, prompts, plain_plan, new_tokens, clock, compile_models=comp)
        runs = {"dspark": spec_run.sequences, "plain": plain_run.sequences}
        graphs = None
        if args.graphs and device.type == "cuda":
            with instrumented(ops=False):  # no op marks: a replayed graph does not call the ops from Python
                g_spec = run_engine(
                    target,
                    drafter,
                    prompts,
                    plan,
                    new_tokens,
                    clock,
                    planner,
                    cuda_graphs=True,
                    compile_models=comp,
                )
                g_plain = run_engine(
                    target,
                    None,
                    prompts,
                    plain_plan,
                    new_tokens,
                    clock,
                    cuda_graphs=True,
                    compile_models=comp,
                )
            graphs = report.GraphRuns(
                report.cells(g_spec.rounds), report.cells(g_plain.rounds).get(1), g_spec, g_plain
            )
            runs.update({"dspark+graphs": g_spec.sequences, "plain+graphs": g_plain.sequences})
        # every decoder is closed: the target runs its own attention again
        hf = run_hf(target, prompts, new_tokens, cache, args.hf_compile)
        canary = report.canary(
            runs,
            hf.sequences,
            functools.partial(_gap, target, prompts, hf.sequences),
            TIE_TOLERANCE[spec.dtype],
            spec.canary_strict,
        )
        spec_cells = report.cells(spec_run.rounds)
        plain_cells = report.cells(plain_run.rounds)
        b = report.Batch(R, spec_cells, plain_cells.get(1), hf, spec_run, plain_run, canary, graphs)
        batches.append(b)
        if not canary["ok"]:
            # the whole record is in the JSON; the log gets one line
            print(
                f"!!! CANARY: {spec.key} R={R}: {report.canary_cell(canary, 0)}", file=sys.stderr, flush=True
            )
        print(
            f"[{spec.key}] R={R}: dspark {spec_run.wall_s:.1f} s ({spec_run.rounds_run} rounds), plain "
            f"{plain_run.wall_s:.1f} s, HF step {hf.step_ms:.2f} ms ({hf.cache})",
            file=sys.stderr,
            flush=True,
        )
    weights_mb = sum(p.numel() * p.element_size() for p in target.parameters()) / 2**20
    section = {
        "key": spec.key,
        "name": spec.name,
        "family": spec.family,
        "dtype": str(spec.dtype).removeprefix("torch."),
        "config": spec.config,
        "drafter": describe_drafter(drafter),
        "notes": spec.notes
        + (["engine runs compiled: decoder.compile(target=True), HF generate eager"] if args.compile else []),
        "weights_mb": weights_mb,
        "build_s": build_s,
        "context": args.context,
        "new_tokens": new_tokens,
        "gamma": GAMMA,
        "batches": [b.to_dict() for b in batches],
        "_batches": batches,
    }
    del target, drafter
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return section


def print_model(section: dict, args: argparse.Namespace, clock: Clock) -> None:
    batches = section["_batches"]
    d = section["drafter"]
    print(
        f"## ({section['key']}) {section['name']}, {section['dtype']}, {args.device}, "
        f"{torch.get_num_threads()} threads\n\n"
        f"Drafter: {d['layers']} layers, γ = {d['block_size']}, taps {d['target_layer_ids']}, Markov rank "
        f"{d['markov_rank']}, draft vocabulary {d['draft_vocab'] or 'whole'}, random weights. "
        f"{args.context}-token random prompts, {section['new_tokens']} new tokens, greedy, EOS ignored. "
        + " ".join(f"{n}." for n in section["notes"])
        + "\n"
    )
    print(report.stage_table(batches, clock.kind) + "\n")
    print(
        "Baselines at the same batch (step time = one token per request; peak = max allocated, weights in)\n"
    )
    print(report.baseline_table(batches) + "\n")
    graphs = report.graphs_table(batches)
    if graphs is not None:
        print("The target's forwards replayed from CUDA graphs (`cuda_graphs=True`) against eager\n")
        print(graphs + "\n")
    print("Measured cost table (written by --sps)\n")
    print(report.cost_markdown(batches) + "\n")
    print(report.projection_markdown(section["projection"], args.taus) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("dspark.planner").setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()
    device = torch.device(args.device)
    clock = Clock(device)
    dtype_a = getattr(torch, args.a_dtype)
    specs = [
        s for s in model_specs(args.quick, args.device, dtype_a) if not args.models or s.key in args.models
    ]
    t_start = time.perf_counter()
    sections = []
    with torch.no_grad():
        for spec in specs:
            section = run_model(spec, args, device, clock)
            batches = section["_batches"]
            meta = report.cost_metadata(device, section, args.context, args.rounds)
            table = report.cost_table(batches, GAMMA, meta)
            section["cost_table"] = table.to_dict() if table is not None else None
            section["sps"] = table.to_sps().to_dict() if table is not None else None
            section["projection"] = report.projection(batches, args.taus)
            print_model(section, args, clock)
            if args.sps and table is not None:
                path = report.sps_path(args.sps, spec.key, len(specs) > 1)
                path.parent.mkdir(parents=True, exist_ok=True)
                table.save_json(path)
                print(f"wrote {path}")
            sections.append(section)
    wall = time.perf_counter() - t_start
    failed = [
        (s["key"], b.R, b.canary)
        for s in sections
        for b in s["_batches"]
        if not b.canary["ok"] and b.canary["strict"]
    ]
    env = env_info(args.device)
    env["timer"] = clock.kind
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
    print(f"total wall time {wall:.1f} s ({env['cpu']['model']}, {args.device})")
    if args.json:
        payload = {
            "env": env,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "wall_s": wall,
            "canary_ok": not failed,
            "models": [{k: v for k, v in s.items() if k != "_batches"} for s in sections],
        }
        report.write_json(args.json, payload)
        print(f"wrote {args.json}")
    if failed:
        raise SystemExit(
            f"greedy canary FAILED: DSpark / plain tokens differ from the target's greedy ones: {failed}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
