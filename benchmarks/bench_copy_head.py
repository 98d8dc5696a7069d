# SPDX-License-Identifier: Apache-2.0
"""Draft-round cost of a drafter with a copy head against one without, on CPU, in one process.

Each case times one whole draft round as the decoder runs it for R requests with ``--context`` committed
context rows each: the copy continuations from each request's ``LookupIndex`` (for the drafter that reads
them), then ``draft`` (backbone, LM head, copy bonus, Markov sampling, confidence). The two drafters alternate
rep by rep; the table gives medians and the median of the per-rep ratios.

    python benchmarks/bench_copy_head.py --base python/dspark/assets/drafters/smollm2-135m-instruct \
        --new runs/ship/drafter [--batch 1 8] [--context 256] [--reps 9] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import cpu_description  # noqa: E402
from dspark import DSparkDrafter  # noqa: E402
from dspark.decoding.lookup import LookupConfig, LookupIndex  # noqa: E402
from dspark.models.loading import load_smollm2  # noqa: E402


def round_seconds(drafter: DSparkDrafter, R: int, features: torch.Tensor, history: list[int]) -> float:
    """Seconds of one draft round for R requests (contexts appended beforehand, not timed)."""
    c = drafter.config
    ids = list(range(R))
    drafter.finish_all()
    drafter.append_context(ids, [features] * R)
    indexes = []
    if c.uses_copies:
        for _ in ids:
            index = LookupIndex(LookupConfig(c.copy_min_match, c.copy_max_match))
            index.extend(history)
            indexes.append(index)
    anchors = torch.full((R,), history[-1], dtype=torch.int64)
    t0 = time.perf_counter()
    kw = {}
    if c.uses_copies:
        conts = [ix.propose(c.block_size) for ix in indexes]
        kw = {
            "copy_continuations": conts,
            "copy_matches": [ix.match_length if ct else 0 for ix, ct in zip(indexes, conts, strict=True)],
        }
    drafter.draft(ids, anchors, 0.0, seed=0, **kw)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="drafter folder without a copy head")
    ap.add_argument("--new", required=True, help="drafter folder with one")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target, _ = load_smollm2(with_tokenizer=False)
    dt = getattr(torch, a.dtype)
    drafters = {
        "base": DSparkDrafter.from_pretrained(a.base, target=target, dtype=dt).eval(),
        "new": DSparkDrafter.from_pretrained(a.new, target=target, dtype=dt).eval(),
    }
    g = torch.Generator().manual_seed(0)
    m = drafters["base"].config.num_taps * drafters["base"].config.hidden_size
    features = torch.randn(a.context, m, generator=g).to(dt)
    # a repetitive history, so that the copy index has a match (its look-up is timed)
    phrase = torch.randint(3, 8000, (24,), generator=g).tolist()
    history = (phrase * (a.context // 24 + 1))[: a.context + 1]
    rows = []
    cpu = cpu_description()
    print(
        f"CPU: {cpu['model']} [{' '.join(cpu['flags'])}]; torch {torch.__version__}; {a.threads} thread(s); drafters in {a.dtype}"
    )
    print("| batch | base ms | copy head ms | ratio (median of per-rep ratios) |")
    print("|---|---|---|---|")
    for R in a.batch:
        for d in drafters.values():  # warm-up
            round_seconds(d, R, features, history)
        times: dict[str, list[float]] = {"base": [], "new": []}
        for _ in range(a.reps):
            for name, d in drafters.items():
                times[name].append(round_seconds(d, R, features, history))
        ratio = statistics.median(n / b for n, b in zip(times["new"], times["base"], strict=True))
        row = {
            "batch": R,
            "base_ms": 1e3 * statistics.median(times["base"]),
            "new_ms": 1e3 * statistics.median(times["new"]),
            "ratio": ratio,
        }
        rows.append(row)
        print(f"| {R} | {row['base_ms']:.1f} | {row['new_ms']:.1f} | {ratio:.3f} |", flush=True)
    if a.json:
        args = {k: str(v) for k, v in vars(a).items()}
        a.json.write_text(json.dumps({"cpu": cpu, "args": args, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
