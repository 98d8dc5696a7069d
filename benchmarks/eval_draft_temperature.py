# SPDX-License-Identifier: Apache-2.0
"""Would drafting from a sharper or flatter law raise sampled acceptance? Offline, from served rounds.

    python benchmarks/eval_draft_temperature.py PROMPTS_DIR/mt-bench.jsonl PROMPTS_DIR/humaneval.jsonl \
        [--drafter PATH] [--limit 12] [--max-new-tokens 256] [--temperature 1] [--scales 0.7 0.8 0.9 1 1.1 1.25]

Speculative sampling is exact for any draft law q, so a drafter could draw from ``softmax(z / (T·s))`` instead
of ``softmax(z / T)`` (with the rejection step reading that same law) if some scale ``s`` accepted more. Every
verified slot ``k`` of the served rounds (``full`` planner: all γ drafts verified) gives its acceptance
``a_k(s) = Σ_x min(p(x), q_s(x))`` with the target's row ``p`` at ``T``, for each ``s``; the table shows the
per-slot means and the chain's ``τ = 1 + Σ_k Π_{j ≤ k} a_j``. Slots after the first are conditioned on the
drafts actually drawn (at ``s = 1``), so the later slots are an estimate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import env_info  # noqa: E402
from dspark import DSparkDecoder, DSparkDrafter  # noqa: E402
from dspark.decoding.inputs import chat_token_ids  # noqa: E402
from dspark.models.bundled import DEFAULT_DRAFTER, DRAFTERS_DIR  # noqa: E402
from dspark.models.loading import load_target  # noqa: E402
from dspark.prompts import read_prompt_file  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompts", nargs="+", type=Path)
    ap.add_argument("--drafter", default=str(DRAFTERS_DIR / DEFAULT_DRAFTER))
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--scales", type=float, nargs="+", default=[0.7, 0.8, 0.9, 1.0, 1.1, 1.25])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.temperature <= 0:
        raise SystemExit("--temperature: the draft law only matters when sampling (> 0)")
    torch.set_num_threads(args.threads)
    target, tok = load_target("smollm2")
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=target, tokenizer=tok)
    gamma = drafter.config.block_size
    sums = torch.zeros(len(args.scales), gamma, dtype=torch.float64)
    counts = torch.zeros(gamma, dtype=torch.float64)

    def observe(rec) -> None:
        z, rows, T = rec.draft_logits.float(), rec.target_logits.float(), rec.temperature
        for r, n in enumerate(rec.verify_len.tolist()):
            for k in range(n - 1):
                p = torch.softmax(rows[rec.qo_indptr[r] + k] / T, -1)
                for i, s in enumerate(args.scales):
                    sums[i, k] += torch.minimum(p, torch.softmax(z[r, k] / (T * s), -1)).sum().item()
                counts[k] += 1

    for path in args.prompts:
        prompts = [chat_token_ids(tok, x.text) for x in read_prompt_file(path, limit=args.limit)]
        dec = DSparkDecoder(target, drafter, planner="full", round_observer=observe, max_batch_size=8)
        try:
            dec.generate(prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=0)
        finally:
            dec.close()
    env = env_info("cpu")
    print(f"{env['cpu']['model']}; torch {torch.__version__}; {args.threads} threads; T = {args.temperature}")
    print(f"verified slots: {counts.tolist()}\n")
    print("| scale s | " + " | ".join(f"slot {k + 1}" for k in range(gamma)) + " | chain τ |")
    print("|---|" + "---|" * (gamma + 1))
    mean = sums / counts.clamp_min(1)
    for i, s in enumerate(args.scales):
        tau, run = 1.0, 1.0
        for k in range(gamma):
            run *= float(mean[i, k])
            tau += run
        print(f"| {s:g} | " + " | ".join(f"{float(a):.3f}" for a in mean[i]) + f" | {tau:.3f} |")


if __name__ == "__main__":
    main()
