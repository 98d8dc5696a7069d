# SPDX-License-Identifier: Apache-2.0
"""Training curves from ``train_log.jsonl`` files: loss and τ estimate per step, one line per run."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path


def read_log(path: str | os.PathLike) -> list[dict]:
    """Rows of a trainer log; a resumed run's repeated steps keep their last value."""
    rows: dict[int, dict] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            rows[int(r["step"])] = r
    return [rows[k] for k in sorted(rows)]


def plot_curves(logs: Mapping[str, str | os.PathLike], out_png: str | os.PathLike) -> None:
    """Save a two-panel PNG (total loss; τ estimate ``1 + Σ cumprod(1 - L1/2)``) for the named runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, path in logs.items():
        rows = read_log(path)
        steps = [r["step"] for r in rows]
        a.plot(steps, [r["loss"] for r in rows], label=name)
        b.plot(steps, [r["tau_estimate"] for r in rows], label=name)
    a.set_title("training loss (each run's own objective)")
    b.set_title("τ estimate from the training batches")
    for ax in (a, b):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
