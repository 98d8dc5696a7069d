# SPDX-License-Identifier: Apache-2.0
"""How much does a drafter use its context? Teacher-forced argmax match per draft slot on cached sequences, with
the target features as they are, all zero, shuffled over positions, or one position stale.

A drafter that reads the most recent context rows loses accuracy when they are shuffled or stale; one that
only picks up a bag-of-context topic (plus the Markov head's bigram) loses little. Sequences come from a
feature cache (``dspark train features``); blocks are the first ``--anchors`` anchors of each sequence.

``--attention`` also prints, per drafter layer, where the block's queries attend: the share of attention on
context row ``a - 1`` (the latest target state), on the last 8 context rows and on the block itself.
``--markov-scales`` prints the match with the Markov head's bias scaled (``z = U + s·B``; 0 reads the drafter's
own logits ``U`` alone), on the features as cached.
``--ngram`` prints the baseline a drafter has to beat: the argmax match of n-gram count tables (1–3 previous
tokens) built on the response tokens of the cached sequences outside the held-out split (every 13th, as in
``train_init_ab.py``) and measured on the held-out ones.

    python benchmarks/eval_context_use.py runs/v3/dspark/final --features runs/feats_big --attention --ngram
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
def slot_match(
    drafter, cache, indices, mode: str, anchors: int, seed: int = 0, markov_scales: tuple[float, ...] = (1.0,)
) -> list[list[float]]:
    """Per-slot rate at which the drafter's argmax equals the next response token, over ``indices``.

    One list of rates per entry of ``markov_scales``, each multiplying the Markov head's bias ``B = z − U``
    (1: the drafter as trained); the drafter's forward runs once for all of them.
    """
    from dspark.training.objective import block_hidden, block_labels, packed_copy_inputs

    g = drafter.config.block_size
    gen = torch.Generator().manual_seed(seed)
    match, count = torch.zeros(len(markov_scales), g), torch.zeros(g)
    for i in indices:
        s = cache[i]
        m, ids = s.loss_mask.bool(), s.input_ids
        a = torch.nonzero(m[:-1] & m[1:]).view(-1)[:anchors]
        hidden = block_hidden(drafter, perturb(s.features.float(), mode, gen), ids, a)
        U = F.linear(hidden, drafter.lm_head_weight)
        # as served greedy: the copy head's bonus (and greedy table) at each slot's copied token
        if drafter.copy_head is not None:
            copy = packed_copy_inputs(drafter.config, [ids], [a], U.device)
            U = drafter.copy_head.add_greedy_bonus(drafter.copy_head.add_to_logits(U, hidden, *copy), *copy)
        labels, inside, prev = block_labels(ids, m, a, g)
        z = U if drafter.markov_head is None else drafter.markov_head(U, prev, hidden)
        for k, scale in enumerate(markov_scales):
            zs = z if scale == 1.0 else U + scale * (z - U)
            match[k] += ((zs.argmax(-1) == labels) & inside).float().sum(0)
        count += inside.float().sum(0)
    return (match / count.clamp_min(1)).tolist()


def _recording(fn, store: dict, key: str):
    """``fn`` that also appends each result to ``store[key]``."""

    def run(*args):
        out = fn(*args)
        store[key].append(out)
        return out

    return run


@torch.no_grad()
def attention_shares(drafter, cache, indices, anchors: int) -> list[dict]:
    """Per layer: mean attention share of the block queries on context row ``a-1``, the last 8 rows, the block.

    Runs :func:`block_hidden` with each layer's ``project_q`` / ``project_kv`` wrapped to keep the rotated
    queries and keys (block keys first, then the context's: ``block_hidden``'s order), then recomputes the
    softmax with its mask.
    """
    from dspark.training.objective import block_hidden

    c = drafter.config
    g, scale = c.block_size, c.head_dim**-0.5
    sums = torch.zeros(len(drafter.layers), 3)
    for i in indices:
        s = cache[i]
        m = s.loss_mask.bool()
        a = torch.nonzero(m[:-1] & m[1:]).view(-1)[:anchors]
        S, n = s.input_ids.numel(), a.numel() * g
        got: list[dict] = [{"q": [], "k": []} for _ in drafter.layers]
        for layer, store in zip(drafter.layers, got, strict=True):
            at = layer.self_attn
            at.project_q = _recording(at.project_q, store, "q")
            at.project_kv = _recording(at.project_kv, store, "k")
        try:
            block_hidden(drafter, s.features.float(), s.input_ids, a)
        finally:
            for layer in drafter.layers:
                del layer.self_attn.project_q, layer.self_attn.project_kv
        anchor_of = a.repeat_interleave(g).unsqueeze(1)  # [n, 1]
        col = torch.arange(S).unsqueeze(0)
        own = torch.arange(a.numel()).repeat_interleave(g)
        visible = torch.cat([col < anchor_of, own.unsqueeze(1) == own.unsqueeze(0)], 1)  # [n, S + n]
        for li, (layer, store) in enumerate(zip(drafter.layers, got, strict=True)):
            (kb, _), (kc, _) = store["k"]
            k = torch.cat([kc, kb], 0).repeat_interleave(layer.self_attn.heads // layer.self_attn.kv_heads, 1)
            p = (torch.einsum("nhd,mhd->hnm", store["q"][0], k) * scale).masked_fill(~visible, float("-inf"))
            p = p.softmax(-1)  # [heads, n, S + n]
            last = p[:, torch.arange(n), anchor_of.view(-1) - 1].mean()
            last8 = (p[:, :, :S] * ((col >= anchor_of - 8) & (col < anchor_of))).sum(-1).mean()
            sums[li] += torch.stack([last, last8, p[:, :, S:].sum(-1).mean()])
    sums /= max(len(indices), 1)
    return [
        {"layer": li, "row_a-1": round(r[0], 3), "last_8_rows": round(r[1], 3), "block": round(r[2], 3)}
        for li, r in enumerate(sums.tolist())
    ]


def ngram_baselines(cache, ns: tuple[int, ...] = (1, 2, 3), hold_every: int = 13) -> dict[int, float]:
    """Held-out argmax match of ``n``-previous-token count tables built on the other sequences' responses."""
    from collections import Counter, defaultdict

    hold = set(range(0, len(cache), hold_every))
    seqs = [
        (i in hold, ids.tolist(), torch.nonzero(m).view(-1).tolist())
        for i, (ids, m) in enumerate(cache.tokens())
    ]
    out = {}
    for n in ns:
        table: dict[tuple, Counter] = defaultdict(Counter)
        for held, ids, pos in seqs:
            for t in pos if not held else ():
                if t >= n:
                    table[tuple(ids[t - n : t])][ids[t]] += 1
        hit = total = 0
        for held, ids, pos in seqs:
            for t in pos if held else ():
                if t >= n:
                    c = table.get(tuple(ids[t - n : t]))
                    hit += bool(c) and c.most_common(1)[0][0] == ids[t]
                    total += 1
        out[n] = hit / max(total, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drafter", help="a drafter checkpoint folder")
    ap.add_argument("--features", default="runs/feats_big", help="a feature cache folder")
    ap.add_argument("--start", type=int, default=0, help="first cached sequence (e.g. past those trained on)")
    ap.add_argument("--every", type=int, default=71, help="use every N-th cached sequence")
    ap.add_argument("--limit", type=int, default=20, help="at most this many sequences")
    ap.add_argument("--anchors", type=int, default=128, help="anchors per sequence")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--modes", nargs="*", choices=MODES, default=list(MODES), help="context perturbations to run"
    )
    ap.add_argument("--attention", action="store_true", help="also print where the block attends, per layer")
    ap.add_argument("--ngram", action="store_true", help="also print the n-gram count-table baselines")
    ap.add_argument(
        "--markov-scales",
        type=float,
        nargs="*",
        default=[],
        help="also print the match with the Markov bias scaled by each of these (0: the drafter's U alone)",
    )
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from dspark.models.drafter import DSparkDrafter
    from dspark.models.loading import load_smollm2
    from dspark.training.features import FeatureCache

    target, _ = load_smollm2(with_tokenizer=False)
    drafter = DSparkDrafter.from_pretrained(a.drafter, target=target).float().eval()
    cache = FeatureCache(a.features)
    idx = list(range(a.start, len(cache), a.every))[: a.limit]
    for mode in a.modes:
        (rates,) = slot_match(drafter, cache, idx, mode, a.anchors)
        print(
            json.dumps({"mode": mode, "sequences": len(idx), "match": [round(r, 3) for r in rates]}),
            flush=True,
        )
    if a.markov_scales:
        by_scale = slot_match(drafter, cache, idx, "real", a.anchors, markov_scales=tuple(a.markov_scales))
        for scale, rates in zip(a.markov_scales, by_scale, strict=True):
            print(json.dumps({"markov_scale": scale, "match": [round(r, 3) for r in rates]}), flush=True)
    if a.attention:
        for row in attention_shares(drafter, cache, idx, min(a.anchors, 64)):
            print(json.dumps({"attention": row}), flush=True)
    if a.ngram:
        for n, rate in ngram_baselines(cache).items():
            print(json.dumps({"ngram": n, "held_out_match": round(rate, 3)}), flush=True)


if __name__ == "__main__":
    main()
