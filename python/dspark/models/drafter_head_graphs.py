# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs for a draft round's heads: the LM head with the Markov draw, and the confidence head
(docs/drafter.md, "CUDA graphs").

After the block forward (``drafter_graphs``), a round's sampling step is the LM head, the copy head's bonuses
and the Markov draw, and its scoring step the confidence head: a few dozen small launches, which cost more than
their work at small batches. :class:`DraftHeadGraphs` captures ``DSparkDrafter.draw`` (the LM head included:
``propose`` leaves ``U`` to it, ``defers_lm_head``) and ``DSparkDrafter.confidence`` once per request bucket and
slot count, and replays them:

* every input is copied into a static buffer before the replay (queued on the stream, no sync); the rows of a
  bucket past the batch hold zeros (hidden states, anchors, request keys, previous tokens) and no copy (-1,
  class 0), and their outputs are dropped;
* the round's Philox offset lives in a ``(1,)`` device counter that the Markov ops read (``round_offset``),
  refilled before each replay: a captured launch keeps its scalar arguments, so an offset passed as an int would
  draw the captured round's noise again in every later round;
* the temperature and the seed are part of a sampling graph's key (the same in every round of a ``generate``
  call); a per-request temperature tensor, a gated or RNN Markov head (drawn step by step in PyTorch, with an
  int offset) and batches past the largest bucket run eagerly.

A failed capture turns these graphs off with a warning (``stats.disabled``); the block-forward graphs keep their
own stats and stay on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dspark.host_sync import to_device
from dspark.models.heads import MarkovSample, VanillaMarkovHead
from dspark.models.target_graphs import GraphBuckets, GraphSet, GraphStats


class DraftHeadGraphs:
    """Captured sampling and confidence steps of one ``DSparkDrafter`` (see the module docstring).

    Parameters
    ----------
    drafter, buckets, capture
        As ``DrafterGraphs`` takes them (it builds these graphs as its ``heads``).
    """

    def __init__(self, drafter: Any, buckets: GraphBuckets, capture: bool = True) -> None:
        self.drafter = drafter  # on CUDA where capture: DrafterGraphs, which builds these, checks it
        self.buckets = buckets
        self.capture = bool(capture)
        self.stats = GraphStats()
        self.counter = torch.zeros(1, dtype=torch.int64, device=drafter.device)  # the round's Philox offset
        self._buffers: dict[tuple[str, int], Tensor] = {}
        self._tables, self._tables_key = None, None  # the draft vocabulary's tables the graphs read
        self._graphs = GraphSet(buckets.max_graphs, drafter.device, self.stats)
        # the fused Markov ops read the counter; the gated / RNN heads draw with an int offset
        head = drafter.markov_head
        self._counter_draws = head is None or isinstance(head, VanillaMarkovHead)

    @property
    def active(self) -> bool:
        """Whether rounds are replayed (False once a capture failed)."""
        return self.stats.disabled is None

    def reset(self) -> None:
        """Drop every captured graph (the next round of each bucket captures again)."""
        self._graphs.clear()

    def sample(
        self, proposal: Any, temperature: float | Tensor, seed: int, offset: int
    ) -> MarkovSample | None:
        """``DSparkDrafter.draw(proposal, temperature, seed, offset)`` replayed (captured first if needed), or None
        to run it eagerly. Returns copies that stay valid after the next replay."""
        p = proposal
        reason = self._eager_reason(p.hidden.shape[0])
        if reason is None and (isinstance(temperature, Tensor) or isinstance(offset, Tensor)):
            reason = "tensor argument"
        elif reason is None and not self._counter_draws:
            reason = "markov head"
        elif reason is None and p.base_logits is not None:  # proposed while these graphs were off
            reason = "logits given"
        if reason is not None:
            self.stats.count_eager(reason)
            return None
        R, g = p.hidden.shape[:2]
        r_b = self._bucket(R)
        self._follow_vocab_tables()
        copy = None
        if p.copy is not None:
            copy = (
                self._put("copy_tokens", g, p.copy[0], r_b, -1),
                self._put("copy_match", g, p.copy[1], r_b, 0),
            )
        static = dataclasses.replace(
            p,
            request_ids=self._put("request_ids", g, p.request_ids, r_b, 0),
            anchors=self._put("anchors", g, p.anchors, r_b, 0),
            hidden=self._put("hidden", g, p.hidden, r_b, 0),
            copy=copy,
        )
        self._refill_counter(int(offset))
        t, s = float(temperature), int(seed)
        key = ("sample", r_b, g, t, s, copy is None)
        out = self._run(key, lambda: self.drafter.draw(static, t, s, self.counter))
        if out is None:
            return None
        return MarkovSample(out.tokens[:R].clone(), out.logits[:R].clone(), out.prev_emb[:R].clone())

    def score(
        self,
        hidden: Tensor,
        prev_emb: Tensor,
        sts_temperature: Tensor | None,
        sts_bias: Tensor | None,
        prev_tokens: Tensor | None,
        copy: tuple[Tensor, Tensor] | None,
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        """``DSparkDrafter.confidence(...)`` (same arguments) replayed, or None to run it eagerly. Returns
        copies of ``(conf_logit, conf, survival)`` ``(R, g)``."""
        reason = self._eager_reason(hidden.shape[0])
        if reason is not None:
            self.stats.count_eager(reason)
            return None
        R, g = hidden.shape[:2]
        r_b = self._bucket(R)
        h = self._put("hidden", g, hidden, r_b, 0)
        e = self._put("prev_emb", g, prev_emb, r_b, 0)
        prev = None if prev_tokens is None else self._put("prev_tokens", g, prev_tokens, r_b, 0)
        cp = None
        if copy is not None:
            cp = (self._put("copy_tokens", g, copy[0], r_b, -1), self._put("copy_match", g, copy[1], r_b, 0))
        sts = None if sts_temperature is None else self._put_vector("sts_temperature", sts_temperature)
        bias = None if sts_bias is None else self._put_vector("sts_bias", sts_bias)
        key = ("score", r_b, g, sts is None, bias is None, prev is None, cp is None)
        out = self._run(key, lambda: self.drafter.confidence(h, e, sts, bias, prev, cp))
        if out is None:
            return None
        return tuple(t[:R].clone() for t in out)

    # ---- internals ----------------------------------------------------------------------------------------------
    def _follow_vocab_tables(self) -> None:
        """Drop the graphs when the draft vocabulary's gathered tables were rebuilt (the weights changed) or
        reallocated (an eager round past the largest bucket grew them): the sampling graphs hold their
        addresses. Room for the largest bucket is made first, so that no captured round grows them."""
        tables = self.drafter._vocab_tables()
        if tables is not None:
            tables.reserve(self.buckets.requests[-1])
        key = None if tables is None else (id(tables), tables.buffers_key)
        if key != self._tables_key:
            self._graphs.clear()
            self._tables, self._tables_key = tables, key  # kept alive: id() stays unique while compared

    def _refill_counter(self, offset: int) -> None:
        self.counter.fill_(offset)  # queued on the stream like the replay that reads it

    def _eager_reason(self, R: int) -> str | None:
        if not self.active:
            return "disabled"
        return "too large" if self._bucket(R) is None else None

    def _bucket(self, R: int) -> int | None:
        return next((b for b in self.buckets.requests if b >= R), None)

    def _run(self, key: tuple, fn: Callable[[], Any]) -> Any | None:
        """Replay (capture first) the graph of ``key``, or with ``capture=False`` run ``fn`` on the buffers."""
        out = self._graphs.replay(key, fn) if self.capture else fn()
        if out is not None:
            self.stats.replays += 1
        return out

    def _put(self, name: str, g: int, x: Tensor, r_b: int, pad: int) -> Tensor:
        """``x`` ``(R, ...)`` copied into the static buffer ``(name, g)``, rows ``R .. r_b - 1`` set to ``pad``;
        returns the buffer's first ``r_b`` rows. A buffer of another shape or dtype is replaced, and the graphs
        that read the old one are dropped."""
        shape = (self.buckets.requests[-1], *x.shape[1:])
        buf = self._buffers.get((name, g))
        if buf is None or buf.shape != shape or buf.dtype != x.dtype:
            if buf is not None:
                self._graphs.clear()
            buf = torch.zeros(shape, dtype=x.dtype, device=self.drafter.device)
            self._buffers[(name, g)] = buf
        R = x.shape[0]
        buf[:R].copy_(x)
        buf[R:r_b].fill_(pad)
        return buf[:r_b]

    def _put_vector(self, name: str, x: Tensor) -> Tensor:
        """A ``(g,)`` float32 vector (the STS parameters) in its static buffer."""
        x = to_device(x.reshape(-1), self.drafter.device, torch.float32)
        buf = self._buffers.get((name, x.shape[0]))
        if buf is None:
            buf = torch.zeros_like(x)
            self._buffers[(name, x.shape[0])] = buf
        buf.copy_(x)
        return buf
