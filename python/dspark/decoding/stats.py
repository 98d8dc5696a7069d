# SPDX-License-Identifier: Apache-2.0
"""Speculative-decoding statistics: acceptance, verify budget, calibration and time, per call and lifetime."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

# "lookup" (the lookup proposals and the source choice) runs first in a round; it is listed last so that the
# drafter stages keep their places
STAGES = ("draft", "markov_sample", "confidence", "plan", "verify", "accept", "commit", "lookup")


@dataclass
class DSparkStats:
    """Counters of a stream of speculative rounds (one request-round = one request in one round).

    ``tau`` follows DeepSpec: emitted tokens per request-round, bonus included (a round cut by EOS counts the
    tokens it kept). Acceptance is reported per draft position ``k`` (0-based) both unconditionally
    (``accept_rate_at[k]``: the fraction of request-rounds that verified draft ``k`` and accepted it along with
    all before it) and conditionally (``conditional_acceptance[k]``: accepted ``k`` given that draft ``k`` was
    verified and every earlier draft accepted). Calibration compares the planner's predicted survival with the
    realised prefix acceptance on **uncensored** request-rounds only (every draft verified), where the outcome
    of every position is observed.
    """

    gamma: int
    rounds: int = 0
    request_rounds: int = 0
    emitted_tokens: int = 0
    verified_drafts: int = 0
    rejected_drafts: int = 0
    budget_total: int = 0
    accepted_hist: list[int] = field(default_factory=list)
    reached: list[int] = field(default_factory=list)  # draft k verified with all earlier drafts accepted
    accepted_at: list[int] = field(default_factory=list)  # draft k accepted (so all earlier too)
    verified_at: list[int] = field(default_factory=list)  # draft k verified
    calib_rows: int = 0
    predicted_survival_sum: list[float] = field(default_factory=list)
    realised_survival_sum: list[float] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    wall_seconds: float = 0.0
    preemptions: int = 0  # running requests preempted (KV pool short) and resumed later
    # per draft source ("dspark", "lookup", "none") of rounds with lookup on: request-rounds, emitted tokens,
    # verified drafts, accepted drafts kept
    by_source: dict[str, list[int]] = field(default_factory=dict)
    # host seconds of each stage's latest ``with`` body (what the planner's measured costs read)
    last_seconds: dict[str, float] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.gamma < 0:
            raise ValueError(f"DSparkStats: gamma must be >= 0, got {self.gamma}")
        g = self.gamma
        for name, length, zero in (
            ("accepted_hist", g + 1, 0),
            ("reached", g, 0),
            ("accepted_at", g, 0),
            ("verified_at", g, 0),
            ("predicted_survival_sum", g, 0.0),
            ("realised_survival_sum", g, 0.0),
        ):
            if not getattr(self, name):
                setattr(self, name, [zero] * length)

    # ------------------------------------------------------------------ recording
    def record_round(
        self,
        verify_len: Sequence[int],
        accepted: Sequence[int],
        emitted: Sequence[int],
        survival: Sequence[Sequence[float]] | None = None,
        budget: int | None = None,
        sources: Sequence[str] | None = None,
    ) -> None:
        """Add one round of R requests.

        Parameters
        ----------
        verify_len : per request, target rows verified (1 + drafts verified), in [1, gamma + 1].
        accepted : per request, drafts accepted (<= verify_len - 1).
        emitted : per request, tokens committed this round (accepted + 1, fewer when EOS / a stop cut it).
        survival : per request, the planner's predicted survival ``a_k`` for k < gamma (for calibration).
        budget : drafts the planner admitted this round (defaults to sum(verify_len - 1)).
        sources : per request, where its drafts came from ("dspark", "lookup" or "none"); None: not tracked.
        """
        g = self.gamma
        if not (len(verify_len) == len(accepted) == len(emitted)):
            raise ValueError("DSparkStats.record_round: verify_len, accepted and emitted differ in length")
        self.rounds += 1
        for i, (vl, acc, em) in enumerate(zip(verify_len, accepted, emitted, strict=True)):
            vl, acc, em = int(vl), int(acc), int(em)
            if not (1 <= vl <= g + 1 and 0 <= acc <= vl - 1 and 0 <= em <= acc + 1):
                raise ValueError(
                    f"DSparkStats.record_round: inconsistent request {i}: verify_len={vl}, accepted={acc}, "
                    f"emitted={em} (gamma={g})"
                )
            self.request_rounds += 1
            self.emitted_tokens += em
            if sources is not None:
                c = self.by_source.setdefault(str(sources[i]), [0, 0, 0, 0])
                c[0] += 1
                c[1] += em
                c[2] += vl - 1
                c[3] += min(acc, em)
            self.verified_drafts += vl - 1
            self.rejected_drafts += vl - 1 - acc
            self.accepted_hist[acc] += 1
            for k in range(vl - 1):
                self.verified_at[k] += 1
                if k <= acc:
                    self.reached[k] += 1
                if k < acc:
                    self.accepted_at[k] += 1
            if survival is not None and vl == g + 1:
                row = survival[i]
                self.calib_rows += 1
                for k in range(g):
                    self.predicted_survival_sum[k] += float(row[k])
                    self.realised_survival_sum[k] += 1.0 if k < acc else 0.0
        self.budget_total += int(budget) if budget is not None else sum(int(v) - 1 for v in verify_len)

    def add_time(self, stage: str, seconds: float) -> None:
        self._check_stage(stage)
        self.seconds[stage] += float(seconds)

    @contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        """Add the host time of the ``with`` body to ``stage`` (one of :data:`STAGES`)."""
        self._check_stage(stage)  # before the body runs
        t0 = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - t0
            self.seconds[stage] += elapsed
            self.last_seconds[stage] = elapsed

    def _check_stage(self, stage: str) -> None:
        if stage not in self.seconds:
            raise ValueError(f"DSparkStats: unknown stage {stage!r}; stages are {STAGES}")

    def merge(self, other: DSparkStats) -> DSparkStats:
        """Add ``other``'s counters into this one (same gamma); returns self."""
        if other.gamma != self.gamma:
            raise ValueError(f"DSparkStats.merge: gamma {other.gamma} != {self.gamma}")
        for name in (
            "rounds",
            "request_rounds",
            "emitted_tokens",
            "verified_drafts",
            "rejected_drafts",
            "preemptions",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.budget_total += other.budget_total
        self.calib_rows += other.calib_rows
        self.wall_seconds += other.wall_seconds
        for name in (
            "accepted_hist",
            "reached",
            "accepted_at",
            "verified_at",
            "predicted_survival_sum",
            "realised_survival_sum",
        ):
            setattr(
                self, name, [a + b for a, b in zip(getattr(self, name), getattr(other, name), strict=True)]
            )
        for k, v in other.seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v
        for k, v in other.by_source.items():
            mine = self.by_source.setdefault(k, [0, 0, 0, 0])
            self.by_source[k] = [a + b for a, b in zip(mine, v, strict=True)]
        return self

    # ------------------------------------------------------------------ derived
    @property
    def tau(self) -> float:
        return self.emitted_tokens / self.request_rounds if self.request_rounds else 0.0

    @property
    def mean_verify_len(self) -> float:
        return 1.0 + self.verified_drafts / self.request_rounds if self.request_rounds else 0.0

    @property
    def mean_budget(self) -> float:
        return self.budget_total / self.rounds if self.rounds else 0.0

    @property
    def accept_rate_at(self) -> list[float]:
        return [a / v if v else float("nan") for a, v in zip(self.accepted_at, self.verified_at, strict=True)]

    @property
    def conditional_acceptance(self) -> list[float]:
        return [a / r if r else float("nan") for a, r in zip(self.accepted_at, self.reached, strict=True)]

    @property
    def calibration(self) -> dict[str, list[float]]:
        n = self.calib_rows
        nan = float("nan")
        return {
            "predicted": [s / n if n else nan for s in self.predicted_survival_sum],
            "realised": [s / n if n else nan for s in self.realised_survival_sum],
        }

    @property
    def sources(self) -> dict[str, dict[str, float]]:
        """Per draft source: request-rounds, ``tau`` (tokens per request-round), ``acceptance`` (accepted / verified
        drafts) and ``token_share`` (its accepted drafts over all emitted tokens); ``"target"`` is the share the
        target drew itself (corrections and bonus tokens). Empty without lookup."""
        if not self.by_source:
            return {}
        total = max(1, self.emitted_tokens)
        out: dict[str, dict[str, float]] = {}
        for k, (rounds, em, ver, acc) in sorted(self.by_source.items()):
            out[k] = {
                "request_rounds": rounds,
                "tau": em / rounds if rounds else float("nan"),
                "acceptance": acc / ver if ver else float("nan"),
                "token_share": acc / total,
            }
        drafted = sum(c[3] for c in self.by_source.values())
        out["target"] = {"token_share": (self.emitted_tokens - drafted) / total}
        return out

    @property
    def tokens_per_second(self) -> float:
        return self.emitted_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "gamma": self.gamma,
            "rounds": self.rounds,
            "request_rounds": self.request_rounds,
            "emitted_tokens": self.emitted_tokens,
            "tau": self.tau,
            "accepted_hist": list(self.accepted_hist),
            "accept_rate_at": self.accept_rate_at,
            "conditional_acceptance": self.conditional_acceptance,
            "mean_verify_len": self.mean_verify_len,
            "mean_budget_per_round": self.mean_budget,
            "verified_drafts": self.verified_drafts,
            "rejected_drafts": self.rejected_drafts,
            "preemptions": self.preemptions,
            "calibration_rows": self.calib_rows,
            "calibration": self.calibration,
            "tokens_per_second": self.tokens_per_second,
            "wall_seconds": self.wall_seconds,
            "seconds": dict(self.seconds),
            "sources": self.sources,
        }

    def to_json(self) -> str:
        # NaN is not JSON: unobserved positions become null
        def clean(x):
            if isinstance(x, float) and x != x:
                return None
            if isinstance(x, list):
                return [clean(v) for v in x]
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            return x

        return json.dumps(clean(self.to_dict()), indent=2)

    def summary(self) -> str:
        """A few human-readable lines."""
        cond = " ".join("-" if c != c else f"{c:.2f}" for c in self.conditional_acceptance)
        total = sum(self.seconds.values())
        parts = (
            ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in self.seconds.items() if v > 0)
            if total
            else "-"
        )
        return (
            f"tau {self.tau:.2f} tokens/round over {self.request_rounds} request-rounds "
            f"({self.emitted_tokens} tokens, {self.tokens_per_second:.1f} tok/s)\n"
            f"verify: {self.mean_verify_len:.2f} rows/request, budget {self.mean_budget:.1f} drafts/round, "
            f"{self.rejected_drafts} of {self.verified_drafts} verified drafts rejected\n"
            f"conditional acceptance by position: {cond}\n"
            + "".join(
                f"{k}: {v['request_rounds']} request-rounds, tau {v['tau']:.2f}, "
                f"{100 * v['token_share']:.0f}% of tokens\n"
                for k, v in self.sources.items()
                if k != "target"
            )
            + f"time: {parts}"
        )
