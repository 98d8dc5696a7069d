# SPDX-License-Identifier: Apache-2.0
"""A/B of drafter warm starts, learning rates and loss weights on SmolLM2-135M-Instruct.

A short :func:`dspark.training.trainer.train` run on a feature cache (``dspark train features``), then the
teacher-forced greedy acceptance on held-out cached sequences (every 13th one, never trained on): held-out
τ (T = 0) = 1 + the mean number of leading slots whose argmax equals the target's greedy token, over blocks whose
γ labels all lie inside the response. One JSON line per run is appended to ``--results``.

    python benchmarks/train_init_ab.py norm_lr3 --features runs/feats --init norm --lr 3e-3 --steps 60

``--input-scaling`` trains on features scaled per channel to a common RMS (``mean(rms) / rms``, measured on every
23rd cached sequence) and evaluates on the same scaled features; a deployed drafter would fold the scale into
``fc``'s columns. Unlike ``--feature-scaling`` (which only rescales ``fc``'s initial columns) this also
equalises Adam's effective step per input channel.

``--context taps+last`` / ``last`` add or substitute the target's final-normed hidden as a context feature (a
diagnostic: not a servable tap); ``--kl W`` adds the forward-KL term with weight ``W``; ``--markov-init bigram``
starts the Markov head as the training responses' bigram model (docs/training.md has the results).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F


def held_out_tau(drafter, cache, indices: list[int]) -> tuple[float, list[float]]:
    """Greedy τ and the per-slot argmax match rate, teacher forced, over ``indices`` of ``cache``."""
    from dspark.training.objective import block_hidden, block_labels

    g = drafter.config.block_size
    lead_sum, blocks = 0.0, 0
    match, count = torch.zeros(g), torch.zeros(g)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for i in indices:
            s = cache[i]
            m, ids = s.loss_mask.bool(), s.input_ids
            anchors = torch.nonzero(m[:-1] & m[1:]).view(-1)
            hidden = block_hidden(drafter, s.features, ids, anchors)
            U = F.linear(hidden, drafter.lm_head_weight)
            labels, inside, prev = block_labels(ids, m, anchors, g)
            z = U.float() if drafter.markov_head is None else drafter.markov_head(U, prev, hidden)
            hit = (z.argmax(-1) == labels) & inside
            lead = hit.long().cumprod(1).sum(1)
            full = inside.all(1)
            lead_sum += float(lead[full].sum())
            blocks += int(full.sum())
            match += hit.float().sum(0)
            count += inside.float().sum(0)
    return 1.0 + lead_sum / max(blocks, 1), (match / count.clamp_min(1)).tolist()


class MappedFeatures:
    """A feature cache whose samples' features go through :meth:`features` (everything else is the cache's)."""

    def __init__(self, cache) -> None:
        self.cache = cache

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, i: int):
        s = self.cache[i]
        return replace(s, features=self.features(s))

    def __getattr__(self, name: str):
        return getattr(self.cache, name)

    def features(self, s) -> torch.Tensor:
        raise NotImplementedError


class ScaledFeatures(MappedFeatures):
    """Features multiplied by a fixed per-channel scale ``[m*H]``."""

    def __init__(self, cache, scale: torch.Tensor) -> None:
        super().__init__(cache)
        self.scale = scale

    def features(self, s) -> torch.Tensor:
        return (s.features.float() * self.scale).to(s.features.dtype)


class ContextFeatures(MappedFeatures):
    """Context rows are the taps then the target's final-normed hidden (``taps+last``), or that hidden alone
    (``last``): a diagnostic of which target state the drafter can use. The final-normed hidden is not a
    servable tap (the decoder taps layers below the last one)."""

    def __init__(self, cache, mode: str) -> None:
        super().__init__(cache)
        self.mode = mode

    def features(self, s) -> torch.Tensor:
        last = s.last_hidden.to(s.features.dtype)
        return last if self.mode == "last" else torch.cat([s.features, last], -1)

    @property
    def layer_ids(self) -> list[int]:
        # labels only (the config needs one id per H-wide block of features): the real ids, then the next ones
        ids = self.cache.layer_ids
        return ids[-1:] if self.mode == "last" else ids + [ids[-1] + 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name")
    ap.add_argument("--features", default="runs/feats")
    ap.add_argument("--out", default="runs/exp")
    ap.add_argument("--results", default="runs/exp/results.jsonl")
    ap.add_argument("--init", default="random", choices=("random", "norm", "early", "late"))
    ap.add_argument("--feature-scaling", action="store_true")
    ap.add_argument("--input-scaling", action="store_true")
    ap.add_argument("--context", default="taps", choices=("taps", "taps+last", "last"))
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--ce", type=float, default=0.1)
    ap.add_argument("--l1", type=float, default=0.9)
    ap.add_argument("--kl", type=float, default=0.0)
    ap.add_argument("--markov-init", default="random", choices=("random", "bigram"))
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--seqs", type=int, default=2)
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rank", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from dspark.models.drafter import DSparkDrafter
    from dspark.models.loading import load_smollm2
    from dspark.training.features import FeatureCache
    from dspark.training.init import bigram_markov_init, feature_rms, init_from_target
    from dspark.training.objective import LossWeights
    from dspark.training.trainer import TrainConfig, train

    target, _ = load_smollm2(with_tokenizer=False)
    for p in target.parameters():
        p.requires_grad_(False)
    cache = FeatureCache(a.features)
    if a.context != "taps":
        cache = ContextFeatures(cache, a.context)
    if a.input_scaling:
        rms = feature_rms([cache[i].features for i in range(0, len(cache), 23)]).clamp_min(1e-3)
        cache = ScaledFeatures(cache, rms.mean() / rms)
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_config(
        target, num_layers=a.layers, markov_rank=a.rank, target_layer_ids=cache.layer_ids
    )
    rms = feature_rms([cache[i].features for i in range(min(64, len(cache)))]) if a.feature_scaling else None
    init_from_target(drafter, target, a.init, rms)
    hold = list(range(0, len(cache), 13))
    train_idx = [i for i in range(len(cache)) if i not in set(hold)]
    if a.markov_init == "bigram":
        bigram_markov_init(drafter.markov_head, cache.tokens(train_idx))
    cfg = TrainConfig(
        steps=a.steps,
        batch_seqs=a.seqs,
        num_anchors=a.anchors,
        lr=a.lr,
        bf16=True,
        compile_loss=True,
        log_every=10,
        save_every=10**9,
        weights=LossWeights(ce=a.ce, l1=a.l1, kl=a.kl),
    )
    t0 = time.time()
    logs = train(drafter, cache, cfg, Path(a.out) / a.name, indices=train_idx, resume=False, progress=False)
    seconds = time.time() - t0
    drafter.eval()
    tau0, match = held_out_tau(drafter, cache, hold)
    res = {
        "name": a.name,
        "init": a.init,
        "feature_scaling": a.feature_scaling,
        "input_scaling": a.input_scaling,
        "context": a.context,
        "lr": a.lr,
        "ce": a.ce,
        "kl": a.kl,
        "markov_init": a.markov_init,
        "steps": a.steps,
        "seqs": a.seqs,
        "train_s": round(seconds),
        "last_loss": logs[-1]["loss"],
        "tau0": round(tau0, 4),
        "match": [round(x, 3) for x in match],
    }
    print(json.dumps(res))
    Path(a.results).parent.mkdir(parents=True, exist_ok=True)
    with open(a.results, "a") as f:
        f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
