# SPDX-License-Identifier: Apache-2.0
"""End to end: plain decoding (HF generate) vs DSpark on the same prompts, in one process.

    python benchmarks/bench_e2e.py [--drafter PATH|random] [--prompts FILE.jsonl] [--n 8] [--max-new-tokens 64]
                                   [--batch 1 8] [--planner full] [--quick] [--json out.json]

Reports tokens/s and the ratio to HF greedy generate for the same prompts, tau, and the time breakdown of
DSpark's round. With a random (untrained) drafter tau is about 1: the ratio then measures dspark's round
overhead per committed token against plain decoding, not a speedup.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dspark import DSparkDecoder, DSparkDrafter  # noqa: E402
from dspark.cli import load_target  # noqa: E402
from dspark.decoding.decoder import chat_token_ids  # noqa: E402

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "prompts" / "humaneval.jsonl"


FALLBACK_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences what a hash map is.",
    "Write a function that checks whether a string is a palindrome.",
    "List three uses of the binary search algorithm.",
]


def read_prompts(path: Path, n: int) -> list[str]:
    if not path.is_file():
        print(f"(prompt file {path} not found: using {len(FALLBACK_PROMPTS)} built-in prompts)")
        return (FALLBACK_PROMPTS * n)[:n]
    out = []
    with open(path) as f:
        for line in f:
            out.append(json.loads(line)["turns"][0])
            if len(out) == n:
                break
    return out


def hf_generate(target, tok, prompts: list[list[int]], max_new: int, batch: int) -> tuple[int, float]:
    """Greedy HF generate with a DynamicCache, left-padded batches; returns (new tokens, seconds)."""
    tok.padding_side = "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    n_tokens, t0 = 0, time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        L = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (L - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in chunk])
        out = target.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=max_new,
            pad_token_id=pad,
            eos_token_id=None,
        )
        n_tokens += (out.shape[1] - L) * len(chunk)
    return n_tokens, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--drafter", default="random")
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--planner", default="full")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.quick:
        args.n, args.max_new_tokens, args.batch = 2, 16, [1, 2]
    torch.manual_seed(0)
    target, tok = load_target(args.target)
    target.to(args.device)
    if args.drafter == "random":
        drafter = DSparkDrafter.from_config(target, block_size=7, num_layers=1, markov_rank=64)
    else:
        drafter = DSparkDrafter.from_pretrained(args.drafter, target=target, tokenizer=tok)
    texts = read_prompts(args.prompts, args.n)
    prompts = [chat_token_ids(tok, t) for t in texts]
    rows = []
    for batch in args.batch:
        n_hf, s_hf = hf_generate(target, tok, prompts, args.max_new_tokens, batch)
        dec = DSparkDecoder(target, drafter, planner=args.planner, max_batch_size=batch, tokenizer=tok)
        try:
            t0 = time.perf_counter()
            out = dec.generate(prompts, max_new_tokens=args.max_new_tokens, eos_token_id=[])
            s_ds = time.perf_counter() - t0
        finally:
            dec.close()
        n_ds = sum(len(s) for s in out.sequences)
        st = out.stats
        row = {
            "batch": batch,
            "hf_tok_s": n_hf / s_hf,
            "dspark_tok_s": n_ds / s_ds,
            "ratio": (n_ds / s_ds) / (n_hf / s_hf),
            "tau": st.tau,
            "seconds": st.seconds,
        }
        rows.append(row)
    print(
        f"### end to end: {args.target}, drafter {args.drafter}, planner {args.planner}, greedy, "
        f"{args.n} prompts x {args.max_new_tokens} tokens, {torch.get_num_threads()} threads\n"
    )
    print(
        "| batch | HF generate tok/s | DSpark tok/s | ratio | tau | draft / plan / verify / accept / commit (s) |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        t = r["seconds"]
        br = " / ".join(f"{t[k]:.2f}" for k in ("draft", "plan", "verify", "accept", "commit"))
        print(
            f"| {r['batch']} | {r['hf_tok_s']:.1f} | {r['dspark_tok_s']:.1f} | {r['ratio']:.2f}x | {r['tau']:.2f} | {br} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
