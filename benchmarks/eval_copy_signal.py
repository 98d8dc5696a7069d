# SPDX-License-Identifier: Apache-2.0
"""How much a copy channel could learn from a feature cache: the 2-3-token lookup continuation's first token
against the target's argmax at every response anchor.

    python benchmarks/eval_copy_signal.py CACHE [CACHE ...] [--every 10] [--limit 40] [--min-match 2 --max-match 3]

Per cache: anchors looked at, the share with a match, the share of those where the copy equals the target's
argmax (from the cached final hidden and the target's LM head) and the text's next token, and the product — the
anchors a copy is right for. Training data for a copy channel needs this close to what the serving distribution
gives (docs/training.md, "Drafter v2 A/Bs").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dspark.decoding.lookup import LookupConfig, LookupIndex  # noqa: E402
from dspark.models.loading import load_target  # noqa: E402
from dspark.training.features import FeatureCache  # noqa: E402


def copy_signal(cache: FeatureCache, head: torch.Tensor, every: int, limit: int, cfg: LookupConfig) -> dict:
    n = has = right = text = 0
    for i in list(range(0, len(cache), every))[:limit]:
        s = cache[i]
        anchors = torch.nonzero(s.loss_mask[:-1] & s.loss_mask[1:]).view(-1)
        argmax = (s.last_hidden[anchors].float() @ head.T).argmax(-1)  # the target's next token after a
        ids = s.input_ids.tolist()
        index, done = LookupIndex(cfg), 0
        for k, a in enumerate(anchors.tolist()):
            index.extend(ids[done : a + 1])
            done = a + 1
            cont = index.propose(1)
            n += 1
            if cont:
                has += 1
                right += int(cont[0] == int(argmax[k]))
                text += int(cont[0] == ids[a + 1])
    return {
        "anchors": n,
        "match_share": round(has / max(n, 1), 3),
        "copy_is_target_argmax": round(right / max(has, 1), 3),
        "copy_is_text": round(text / max(has, 1), 3),
        "anchors_copy_right": round(right / max(n, 1), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("caches", nargs="+", help="feature cache folders (dspark train features)")
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--every", type=int, default=1, help="use every N-th cached sequence")
    ap.add_argument("--limit", type=int, default=40, help="at most this many sequences per cache")
    ap.add_argument("--min-match", type=int, default=2)
    ap.add_argument("--max-match", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target, _ = load_target(a.target, with_tokenizer=False)
    head = target.get_output_embeddings().weight.detach().float()
    cfg = LookupConfig(a.min_match, a.max_match)
    for path in a.caches:
        print(json.dumps({"cache": path, **copy_signal(FeatureCache(path), head, a.every, a.limit, cfg)}))


if __name__ == "__main__":
    main()
