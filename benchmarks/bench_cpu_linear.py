# SPDX-License-Identifier: Apache-2.0
"""Few-row fp32 linear layers on CPU: ``dspark.models.cpu_linear.linear`` ((W · xᵀ)ᵀ) against ``F.linear``.

The weights are random fp32 matrices with the shapes of every linear layer of SmolLM2-135M (30 decoder layers:
q, k, v, o, gate, up, down; and the 49152 × 576 LM head; 537 MB, far more than the caches), so one call of each
path multiplies M rows by all of them once — what a decode (M = 1) or verify (M = 2–8 per request) step reads.
Both paths are forced (``max_rows`` large) so the table shows where the weight-stationary product pays; the
rows limit that :func:`dspark.models.cpu_linear.default_max_rows` picks comes from this benchmark (where it is
0, ``bench_few_row_linear.py`` times the path used instead).

python benchmarks/bench_cpu_linear.py [--quick] [--threads N] [--json out.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, parse_args, report, time_fn  # noqa: E402
from dspark.models import cpu_linear  # noqa: E402

H, INTER, KV, VOCAB = 576, 1536, 192, 49152
LAYER_SHAPES = [(H, H), (KV, H), (KV, H), (H, H), (INTER, H), (INTER, H), (H, INTER)]


def weights(layers: int, g: torch.Generator) -> list[torch.Tensor]:
    """fp32 ``[N, K]`` weights of ``layers`` SmolLM2-135M decoder layers and the LM head."""
    shapes = LAYER_SHAPES * layers + [(VOCAB, H)]
    return [torch.randn(n, k, generator=g) * k**-0.5 for n, k in shapes]


def main() -> None:
    args = parse_args(__doc__)
    if args.device != "cpu":
        print("bench_cpu_linear: CPU only (the weight-stationary path is a CPU fp32 choice)", file=sys.stderr)
        return
    g = torch.Generator().manual_seed(0)
    ws = weights(4 if args.quick else 30, g)
    budget = 0.3 if args.quick else 2.0
    row_counts = [1, 3, 8] if args.quick else [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    rows = []
    for m in row_counts:
        xs = {k: torch.randn(m, k, generator=g) for k in (H, INTER)}

        def op(m=m, xs=xs):
            return [cpu_linear.linear(xs[w.shape[1]], w, max_rows=m) for w in ws]

        def ref(xs=xs):
            return [F.linear(xs[w.shape[1]], w) for w in ws]

        with torch.no_grad():
            for a, b in zip(
                op(), ref(), strict=True
            ):  # correctness first: same products, other summation order
                torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
            t_op, t_ref = time_fn(op, "cpu", budget), time_fn(ref, "cpu", budget)
        limit = cpu_linear.default_max_rows()
        case = {"rows M": m, "used by default": "yes" if 1 <= m <= limit else "no"}
        rows.append(Row(case, "cpu", t_op, t_ref))
    n_w = sum(w.numel() for w in ws) * 4 / 1e6
    report(
        f"fp32 linear of M rows by {len(ws)} weights ({n_w:.0f} MB): (W · xᵀ)ᵀ (op) against F.linear (reference)",
        rows,
        args,
        ["rows M", "used by default"],
    )


if __name__ == "__main__":
    main()
