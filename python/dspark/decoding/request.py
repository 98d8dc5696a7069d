# SPDX-License-Identifier: Apache-2.0
"""A request in flight and what a generate call hands back: stream events and the final output."""

from __future__ import annotations

from dataclasses import dataclass, field

from dspark.decoding.lookup import LookupIndex
from dspark.decoding.stats import DSparkStats
from dspark.decoding.stopping import StopCriteria, TextStream


@dataclass
class StreamEvent:
    """Tokens a request committed in one round (never rolled back later)."""

    index: int  # the request's position in the generate() call
    tokens: list[int]
    text: str | None
    finished: bool
    finish_reason: str | None


@dataclass
class GenerateOutput:
    """Result of :meth:`DSparkDecoder.generate` (lists in prompt order).

    ``sequences[i]`` are the generated token ids of prompt ``i`` (without the prompt), ``texts[i]`` their decoded
    text (when a tokenizer is known), ``finish_reasons[i]`` one of ``"eos"``, ``"stop"``, ``"length"`` (or
    ``"error"`` for a request the KV pool could never hold, see docs/decoder.md).
    """

    sequences: list[list[int]]
    prompt_ids: list[list[int]]
    texts: list[str] | None
    finish_reasons: list[str]
    stats: DSparkStats


@dataclass(eq=False)  # identity comparison: requests are compared in list operations
class Request:
    """One prompt of a generate call while it is decoded.

    ``rid`` keys the request's KV pages, its drafter context and its random stream (the i-th prompt of every call
    draws the same numbers for the same seed, whatever else is in the batch). ``started``: the prompt and the
    committed tokens but the last (the anchor) are in the caches.
    """

    index: int
    rid: int
    prompt: list[int]
    stop: StopCriteria
    stream: TextStream | None
    anchor: int = -1
    started: bool = False
    error: str | None = None  # why the request was dropped (it never fitted the KV pool)
    events: list[StreamEvent] = field(default_factory=list)
    lookup: LookupIndex | None = None  # prompt + committed tokens, indexed for lookup drafts (lookup on)
    copy_index: LookupIndex | None = None  # the same for a drafter's copy channel (its own match rule)
    # target features of rows committed in rounds the drafter skipped, fed to its context before it next drafts
    pending_context: list = field(default_factory=list)
    commits: int = 0  # rounds (prefill included) that committed tokens of this request

    @property
    def remaining_tokens(self) -> int:
        """Tokens it may still emit before ``max_new_tokens`` (an EOS or stop string may end it sooner)."""
        return max(self.stop.max_new_tokens - len(self.generated), 0)

    @property
    def tokens_per_round(self) -> float:
        """Tokens committed per round so far, with one round of one token as a prior (1.0 before any)."""
        return (len(self.generated) + 1) / (self.commits + 1)

    @property
    def generated(self) -> list[int]:
        return self.stop.generated

    @property
    def done(self) -> bool:
        return self.stop.finished or self.error is not None

    @property
    def finish_reason(self) -> str:
        return "error" if self.error is not None else (self.stop.finish_reason or "length")

    def commit(self, tokens: list[int]) -> list[int]:
        """Apply the stop rules to this round's tokens, queue their stream event; returns the tokens kept."""
        kept = self.stop.commit(tokens)
        self.commits += 1
        for index in (self.lookup, self.copy_index):
            if index is not None:
                index.extend(kept)
        if not self.stop.finished:
            self.anchor = kept[-1]
        text = self.stream.push(kept, final=self.stop.finished) if self.stream is not None else None
        self.events.append(StreamEvent(self.index, kept, text, self.stop.finished, self.stop.finish_reason))
        return kept

    def fail(self, error: str) -> None:
        """Drop the request with ``error``; its stream gets a last, empty event."""
        self.error = error
        self.events.append(StreamEvent(self.index, [], "" if self.stream else None, True, "error"))
