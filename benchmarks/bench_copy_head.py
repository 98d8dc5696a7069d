# SPDX-License-Identifier: Apache-2.0
"""Draft-round cost of a drafter with a copy head against one without, on CPU, in one process.

Each case times one whole draft round as the decoder runs it for R requests with ``--context`` committed
context rows each: the copy continuations from each request's ``LookupIndex`` (for the drafter that reads
them), then ``draft`` (backbone, LM head, copy bonus, Markov sampling, confidence). The two drafters alternate
rep by rep; the table gives medians and the median of the per-rep ratios.

    python benchmarks/bench_copy_head.py [--base DRAFTER] [--new DRAFTER] [--batch 1 8] [--context 256]
        [--reps 9] [--threads 1] [--json out.json] [--quick]

``--new`` defaults to the bundled drafter (which has a copy head), ``--base`` to the same checkpoint with its
copy head left out. Before timing, both drafters draft with no copies and must give the same tokens (the head
adds nothing without a copy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import cpu_description  # noqa: E402
from dspark import DSparkDrafter  # noqa: E402
from dspark.decoding.sources import copy_proposal, new_copy_index  # noqa: E402
from dspark.models.loading import load_smollm2  # noqa: E402


def without_copy_head(path: Path, out: Path) -> Path:
    """A copy of the drafter folder ``path`` in ``out`` with the copy head left out (config and tensors)."""
    import shutil

    from safetensors.torch import save_file

    from dspark.models.checkpoint import read_tensors

    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("copy_head", None)
    cfg.pop("copy_greedy_bias", None)
    if not cfg.get("copy_channel"):
        for key in ("copy_min_match", "copy_max_match", "copy_extent_bounds"):
            cfg.pop(key, None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = {k: v.contiguous() for k, v in read_tensors(path).items() if not k.startswith("copy_head.")}
    save_file(tensors, str(out / "model.safetensors"))
    if (path / "draft_vocab.json").is_file():
        shutil.copy(path / "draft_vocab.json", out / "draft_vocab.json")
    return out


def same_drafts_without_copies(base: DSparkDrafter, new: DSparkDrafter, features: torch.Tensor) -> None:
    """Both drafters draft the same tokens when no request has a copy (checked before timing)."""
    outs = []
    for d in (base, new):
        d.finish_all()
        d.append_context([0, 1], [features, features[: len(features) // 2]])
        kw = {"copy_continuations": [[], []], "copy_matches": [0, 0]} if d.config.uses_copies else {}
        outs.append(d.draft([0, 1], torch.tensor([5, 9]), 0.0, seed=0, **kw).tokens)
        d.finish_all()
    if not torch.equal(*outs):
        raise SystemExit(f"bench_copy_head: the drafters differ without copies: {outs[0]} vs {outs[1]}")


def round_seconds(drafter: DSparkDrafter, R: int, features: torch.Tensor, history: list[int]) -> float:
    """Seconds of one draft round for R requests (contexts appended beforehand, not timed)."""
    c = drafter.config
    ids = list(range(R))
    drafter.finish_all()
    drafter.append_context(ids, [features] * R)
    indexes = []
    if c.uses_copies:
        for _ in ids:
            indexes.append(new_copy_index(c, history))
    anchors = torch.full((R,), history[-1], dtype=torch.int64)
    t0 = time.perf_counter()
    kw = {}
    if c.uses_copies:
        pairs = [copy_proposal(ix, c.block_size) for ix in indexes]
        kw = {"copy_continuations": [p for p, _ in pairs], "copy_matches": [m for _, m in pairs]}
    drafter.draft(ids, anchors, 0.0, seed=0, **kw)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--base", default=None, help="drafter folder without a copy head (default: --new without it)"
    )
    ap.add_argument("--new", default=None, help="drafter folder with one (default: the bundled drafter)")
    ap.add_argument("--quick", action="store_true", help="a CI-sized run: batch 1, 32 context rows, 2 reps")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if a.quick:
        a.batch, a.context, a.reps = [1], min(a.context, 32), 2
    torch.set_num_threads(a.threads)
    if a.new is None:
        from dspark.models.bundled import bundled_drafter

        a.new = bundled_drafter().path
    tmp = tempfile.TemporaryDirectory()
    if a.base is None:
        a.base = without_copy_head(Path(a.new), Path(tmp.name) / "base")
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
    same_drafts_without_copies(drafters["base"], drafters["new"], features)
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
