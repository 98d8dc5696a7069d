# SPDX-License-Identifier: Apache-2.0
"""One drafter training step's sequence (``block_loss`` forward + backward) over a draft vocabulary of V' ids
against the same over the whole vocabulary (the reference column), on CPU.

Shapes as the bundled drafter's training: a random-weight target with SmolLM2-135M's config (hidden 576, vocab
49,152, tied embeddings), a 2-layer drafter with block 7, Markov rank 128 and a confidence head, a 450-token
sequence whose last 300 tokens are the response, 64 anchors; bf16 autocast and the compiled loss terms as
``dspark train fit --bf16`` runs them. Only the vocabulary-sized work depends on V'. ``p_lse`` "cached": the
target's log-normaliser comes with the sequence (feature caches built by ``dspark train features``), so ``p``
is a V'-column product; "computed": it is computed from the whole LM head each step (older caches).

python benchmarks/bench_train_step.py [--quick] [--threads N] [--json out.json] [--draft-vocabs 8192,16384]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_drafter import smollm2_target  # noqa: E402
from benchmarks.common import Row, parse_args, report, time_fn  # noqa: E402
from dspark import DSparkDrafter  # noqa: E402
from dspark.training.objective import block_loss, sample_anchors  # noqa: E402


def step_fn(drafter, seq: dict, lm_head: torch.Tensor, draft_ids: torch.Tensor | None, p_lse=None):
    def run():
        drafter.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lo = block_loss(
                drafter, **seq, compile_loss=True, lm_head=lm_head, draft_ids=draft_ids, p_lse=p_lse
            )
        lo.loss.backward()

    return run


@torch.no_grad()
def check_lse_paths_agree(drafter, seq: dict, ids: torch.Tensor, p_lse: torch.Tensor) -> None:
    """Before timing: the loss with the cached normaliser equals the one that computes it (fp32, no autocast)."""
    cached = block_loss(drafter, **seq, draft_ids=ids, p_lse=p_lse)
    computed = block_loss(drafter, **seq, draft_ids=ids)
    for k in ("l1", "ce", "bce"):
        a, b = getattr(cached, k), getattr(computed, k)
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-4):
            raise SystemExit(f"bench_train_step: {k} differs between cached and computed p_lse: {a} vs {b}")


def main() -> None:
    import argparse

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--draft-vocabs", default="8192,16384")
    known, rest = pre.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = parse_args(__doc__.splitlines()[0])
    sizes = [int(x) for x in known.draft_vocabs.split(",") if x]
    if args.quick:  # a smoke run: bf16 GEMMs are emulated (slow) on CPUs without AVX-512 BF16
        sizes = sizes[:1]
    target = smollm2_target()
    for p in target.parameters():
        p.requires_grad_(False)
    drafter = DSparkDrafter.from_config(target, block_size=7, num_layers=2, markov_rank=128)
    drafter.train()
    c = drafter.config
    gen = torch.Generator().manual_seed(0)
    S, resp, n_anchors = (48, 32, 8) if args.quick else (450, 300, 64)
    mask = torch.zeros(S, dtype=torch.bool)
    mask[S - resp :] = True
    seq = dict(
        features=torch.randn(S, len(c.target_layer_ids) * c.hidden_size, generator=gen).to(torch.bfloat16),
        last_hidden=torch.randn(S, c.hidden_size, generator=gen).to(torch.bfloat16),
        input_ids=torch.randint(0, c.vocab_size, (S,), generator=gen),
        loss_mask=mask,
        anchors=sample_anchors(mask, n_anchors, gen),
    )
    lm_head = drafter.lm_head_weight.detach().to(torch.bfloat16)
    full = step_fn(drafter, seq, lm_head, None)
    full()  # compile outside the timing
    t_full = time_fn(full, "cpu", 0.5 if args.quick else 8.0)
    p_lse = torch.logsumexp(seq["last_hidden"].float() @ drafter.lm_head_weight.detach().float().T, -1)
    rows = []
    for n in sizes:
        ids = torch.randperm(c.vocab_size, generator=gen)[:n].sort().values
        check_lse_paths_agree(drafter, seq, ids, p_lse)
        for lse in ("cached", "computed"):
            fn = step_fn(drafter, seq, lm_head, ids, p_lse if lse == "cached" else None)
            fn()
            t = time_fn(fn, "cpu", 0.5 if args.quick else 8.0)
            case = {"draft vocabulary": n, "p_lse": lse, "sequence": S, "anchors": n_anchors}
            rows.append(Row(case, "cpu", t, t_full))
    report(
        "drafter training step, draft vocabulary vs whole vocabulary",
        rows,
        args,
        ["draft vocabulary", "p_lse", "sequence", "anchors"],
    )


if __name__ == "__main__":
    main()
