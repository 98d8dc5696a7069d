# SPDX-License-Identifier: Apache-2.0
"""A PNG of a :class:`CostTable`: verify ms against B (one line per R), drafter ms against R, the SPS curve."""

from __future__ import annotations

from pathlib import Path

from dspark.decoding.tables import CostTable


def save_plot(table: CostTable, path: str | Path, title: str | None = None) -> Path:
    """Draw ``table`` into a PNG (matplotlib, Agg backend).

    Parameters
    ----------
    table : CostTable
        The measurements.
    path : str or Path
        Output file.
    title : str or None
        Figure title; default the target name, device and context length from the metadata.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    ImportError
        When matplotlib is not installed (``pip install matplotlib``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta = table.metadata
    if title is None:
        title = (
            f"{meta.get('target', 'target')} on {meta.get('device', '?')} ({meta.get('threads', '?')} threads), "
            f"context {meta.get('context_length', '?')}"
        )
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    ax = axes[0]
    for r in table.batch_sizes:
        pts = [(v.batch_tokens, v.ms) for v in table.verify if v.num_requests == r]
        ax.plot([b for b, _ in pts], [ms for _, ms in pts], marker="o", ms=3, label=f"R = {r}")
    ax.set(xlabel="packed verify tokens B", ylabel="verify forward (ms)", title="target verify")
    ax.legend()
    ax.grid(alpha=0.3)

    ax = axes[1]
    if table.draft:
        rs = [d.num_requests for d in table.draft]
        ax.plot(rs, [d.ms for d in table.draft], marker="o", label="round (draft + append)")
        if all(d.draft_ms is not None for d in table.draft):
            ax.plot(rs, [d.draft_ms for d in table.draft], marker=".", ls="--", label="draft()")
        ax.set_xticks(rs)
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no drafter measured", ha="center", va="center", transform=ax.transAxes)
    ax.set(xlabel="requests R", ylabel="drafter (ms)", title="drafter round")
    ax.grid(alpha=0.3)

    ax = axes[2]
    for r in table.batch_sizes:
        sps = table.to_sps(r)
        ax.plot(sps.sample_batch_tokens, sps.sample_steps_per_sec, label=f"R = {r}")
    sps = table.to_sps()
    ax.plot(sps.sample_batch_tokens, sps.sample_steps_per_sec, color="k", ls=":", label="1-D export")
    ax.set(xlabel="packed verify tokens B", ylabel="rounds / s", title="SPS (draft + verify)")
    ax.legend()
    ax.grid(alpha=0.3)

    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
