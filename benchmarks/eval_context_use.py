# SPDX-License-Identifier: Apache-2.0
"""How much does a drafter use its context? Teacher-forced argmax match per draft slot on cached sequences, with
the target features as they are, all zero, shuffled over positions, or one position stale.

A drafter that reads the most recent context rows loses accuracy when they are shuffled or stale; one that
only picks up a bag-of-context topic (plus the Markov head's bigram) loses little. Sequences come from a
feature cache (``dspark train features``); blocks are the first ``--anchors`` anchors of each sequence.

    python benchmarks/eval_context_use.py runs/v3/dspark/final --features runs/feats_big
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

MODES = ("real", "zero", "shuffle", "stale")


def perturb(features: torch.Tensor, mode: str, gen: torch.Generator) -> torch.Tensor:
    """``features`` ``[S, m*H]`` as the mode asks (``stale``: every row replaced by the row before it)."""
    if mode == "zero":
        return torch.zeros_like(features)
    if mode == "shuffle":
        return features[torch.randperm(features.shape[0], generator=gen)]
    if mode == "stale":
        return torch.cat([features[:1], features[:-1]])
    return features


@torch.no_grad()
def slot_match(drafter, cache, indices, mode: str, anchors: int, seed: int = 0) -> list[float]:
    """Per-slot rate at which the drafter's argmax equals the next response token, over ``indices``."""
    from dspark.training.objective import block_hidden, block_labels

    g = drafter.config.block_size
    gen = torch.Generator().manual_seed(seed)
    match, count = torch.zeros(g), torch.zeros(g)
    for i in indices:
        s = cache[i]
        m, ids = s.loss_mask.bool(), s.input_ids
        a = torch.nonzero(m[:-1] & m[1:]).view(-1)[:anchors]
        hidden = block_hidden(drafter, perturb(s.features.float(), mode, gen), ids, a)
        U = F.linear(hidden, drafter.lm_head_weight)
        labels, inside, prev = block_labels(ids, m, a, g)
        z = U if drafter.markov_head is None else drafter.markov_head(U, prev, hidden)
        hit = (z.argmax(-1) == labels) & inside
        match += hit.float().sum(0)
        count += inside.float().sum(0)
    return (match / count.clamp_min(1)).tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drafter", help="a drafter checkpoint folder")
    ap.add_argument("--features", default="runs/feats_big", help="a feature cache folder")
    ap.add_argument("--every", type=int, default=71, help="use every N-th cached sequence")
    ap.add_argument("--limit", type=int, default=20, help="at most this many sequences")
    ap.add_argument("--anchors", type=int, default=128, help="anchors per sequence")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from dspark.models.drafter import DSparkDrafter
    from dspark.models.loading import load_smollm2
    from dspark.training.features import FeatureCache

    target, _ = load_smollm2(with_tokenizer=False)
    drafter = DSparkDrafter.from_pretrained(a.drafter, target=target).float().eval()
    cache = FeatureCache(a.features)
    idx = list(range(0, len(cache), a.every))[: a.limit]
    for mode in MODES:
        rates = slot_match(drafter, cache, idx, mode, a.anchors)
        print(
            json.dumps({"mode": mode, "sequences": len(idx), "match": [round(r, 3) for r in rates]}),
            flush=True,
        )


if __name__ == "__main__":
    main()
