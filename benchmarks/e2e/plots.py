# SPDX-License-Identifier: Apache-2.0
"""bench_e2e's plots: conditional acceptance per draft position, drafts verified per round, speedup."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.e2e.runners import HF, Case, Run
from dspark.decoding.stats import DSparkStats


def _pooled(runs: list[Run]) -> DSparkStats | None:
    """The stats of ``runs`` merged into one (None when none has stats)."""
    stats = [r.stats for r in runs if r.stats is not None]
    if not stats:
        return None
    total = DSparkStats(gamma=stats[0].gamma)
    for s in stats:
        total.merge(s)
    return total


def _wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (stays inside [0, 1], sane at 0 and n)."""
    p = successes / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def plots(cases: list[Case], out_dir: Path) -> list[Path]:
    """acceptance.png, verify_budget.png and speedup.png: one panel per (prompt set, temperature)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    out_dir.mkdir(parents=True, exist_ok=True)
    sets = list(dict.fromkeys(c.prompt_set for c in cases))
    temps = list(dict.fromkeys(c.temperature for c in cases))
    written = []

    def panels(title: str):
        # yields (case, axes) to draw on; the figure is saved once the caller's loop has drawn them all
        fig, axes = plt.subplots(
            len(sets), len(temps), figsize=(6 * len(temps), 4 * len(sets)), squeeze=False
        )
        fig.suptitle(title, fontsize="medium", wrap=True)
        for c in cases:
            ax = axes[sets.index(c.prompt_set)][temps.index(c.temperature)]
            ax.set_title(f"{c.prompt_set}, T = {c.temperature:g}", fontsize="medium")
            yield c, ax
        fig.tight_layout()
        path = out_dir / f"{title.split(':')[0]}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    def batch_axis(ax, runs: list[Run], ylabel: str) -> None:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r.batch for r in runs}) or [1])
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set(xlabel="batch size", ylabel=ylabel)
        ax.legend(fontsize="small")

    # (1) conditional acceptance per draft position, pooled over batch sizes; the full planner is uncensored
    for c, ax in panels(
        "acceptance: P(accept draft k | drafts before k accepted), full planner, 95% Wilson intervals"
    ):
        dspark_runs = [r for r in c.runs if r.method.startswith("DSpark") and "whole vocab" not in r.method]
        full = [r for r in dspark_runs if r.planner == "full"]
        for label, runs in (
            (
                "DSpark" if full else "DSpark (other planners: fewer late positions verified)",
                full or dspark_runs,
            ),
            ("DFlash", [r for r in c.runs if r.method.startswith("DFlash")]),
        ):
            st = _pooled(runs)
            if st is not None and st.gamma:
                # late positions are reached rarely: 95% Wilson intervals and the counts keep that visible
                ks = [k for k in range(st.gamma) if st.reached[k]]
                p = [st.conditional_acceptance[k] for k in ks]
                ci = [_wilson(st.accepted_at[k], st.reached[k]) for k in ks]
                x = [k + 1 for k in ks]
                bars = ax.errorbar(
                    x,
                    p,
                    yerr=[
                        [pk - lo for pk, (lo, _) in zip(p, ci, strict=True)],
                        [hi - pk for pk, (_, hi) in zip(p, ci, strict=True)],
                    ],
                    marker="o",
                    capsize=3,
                    label=label,
                )
                for xk, pk, k in zip(x, p, ks, strict=True):
                    ax.annotate(
                        f"{st.reached[k]}",
                        (xk, pk),
                        textcoords="offset points",
                        xytext=(5, 4),
                        fontsize="x-small",
                        color=bars[0].get_color(),
                    )
                ax.set_xticks(range(1, st.gamma + 1))
                ax.set_xlim(0.5, st.gamma + 0.5)
        ax.set(
            xlabel="draft position k (numbers: drafts that reached k)",
            ylabel="conditional acceptance",
            ylim=(0, 1.02),
        )
        ax.legend(fontsize="small")

    # (2) drafts admitted to verification per round against batch size, per planner
    for c, ax in panels("verify_budget: drafts verified per round"):
        spec = [r for r in c.runs if r.stats is not None and r.planner is not None]
        if spec:  # what verifying everything costs: batch x gamma
            bs = sorted({r.batch for r in spec})
            ax.plot(bs, [b * spec[0].stats.gamma for b in bs], color="0.7", linestyle=":", label="batch × γ")
        for method in dict.fromkeys(r.method for r in spec):
            rs = sorted((r for r in spec if r.method == method), key=lambda r: r.batch)
            ax.plot([r.batch for r in rs], [r.stats.mean_budget for r in rs], marker="o", label=method)
        batch_axis(ax, spec, "drafts / round")

    # (3) tokens/s over HF generate's at the same batch size
    for c, ax in panels("speedup: tokens per second relative to HF generate at the same batch size"):
        done = [r for r in c.runs if r.method != HF and r.ratio is not None]
        ax.axhline(1.0, color="0.7", linestyle=":", label="HF generate")
        for method in dict.fromkeys(r.method for r in done):
            rs = sorted((r for r in done if r.method == method), key=lambda r: r.batch)
            ax.plot([r.batch for r in rs], [r.ratio for r in rs], marker="o", label=method)
        batch_axis(ax, done, "× HF generate")
    return written
