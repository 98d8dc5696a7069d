# SPDX-License-Identifier: Apache-2.0
"""One decoding round, top to bottom: look up → draft → Markov sample → confidence → plan → verify → accept → commit.

:func:`decode_round` is the algorithm (DESIGN §5, docs/decoder.md "One round"); the functions below it are its
steps, in order. :func:`prefill` puts new (or resumed) requests into the caches and draws their first tokens.
The scheduler that decides which requests run (admission, preemption, streaming) is ``decoder.py``.

Host reads: one per round after rejection sampling (accepted counts and tokens, NaN/inf flags, survival for the
stats), plus one for the plan when a planner mode other than ``full`` sets the verify lengths (they shape the
target's packed batch) or when lookup and drafter blocks are chosen between on the device. Draft tokens reach
the target without passing through the host; lookup proposals are made on the host and copied asynchronously.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from dspark.decoding.acceptance import AcceptanceTable
from dspark.decoding.inputs import SamplingConfig
from dspark.decoding.lookup import LookupConfig, LookupIndex
from dspark.decoding.lookup_corpus import LookupCorpus
from dspark.decoding.planner import Planner, finish_together_weights
from dspark.decoding.request import Request
from dspark.decoding.sampling import accept_drafts, sample_next
from dspark.decoding.sources import (
    DRAFTER_CLASS,
    DRAFTER_PROBE_ROUNDS,
    DrafterYield,
    LookupBlock,
    block_scores,
    copy_continuations,
    drafter_pays,
    drafter_survival,
    look_up,
    new_copy_index,
)
from dspark.decoding.stats import DSparkStats
from dspark.host_sync import HostReader, all_finite, rows_finite, sanitized, to_device
from dspark.models.drafter import DraftProposal, DSparkDrafter
from dspark.models.drafting import previous_tokens
from dspark.models.heads import MarkovSample
from dspark.models.target import TargetAdapter, TargetOutput


class Engine(Protocol):
    """What a round uses of the decoder (``DSparkDecoder`` is one)."""

    adapter: TargetAdapter
    drafter: DSparkDrafter | None
    planner: Planner
    gamma: int
    lookup_width: int  # lookup drafts per round (>= gamma)
    sts: Tensor | None
    sts_bias: Tensor | None
    taps: list[int]
    adaptive_slots: bool
    host: HostReader
    round_observer: Callable[[RoundRecord], None] | None
    lookup: LookupConfig | None  # lookup drafts on (the index's match rule), or off
    lookup_corpus: LookupCorpus | None  # finished requests' outputs, a second lookup source (or none)
    lookup_acceptance: AcceptanceTable | None  # lookup acceptance by (match class, position)
    draft_acceptance: AcceptanceTable | None  # the drafter's conditional acceptance by position
    drafter_yield: DrafterYield  # tokens and rows the drafter's blocks returned (whether it pays its time)
    drafter_skip_margin: float  # how far below a round without it the drafter must be predicted to be skipped


@dataclass
class CallState:
    """What one generate call carries from round to round.

    ``offset`` is the Philox round counter: every random draw of the call takes its own (:meth:`take_offset`),
    so no two draws share noise. ``slots``: drafts the next round drafts when ``adaptive_slots`` applies.
    """

    sampling: SamplingConfig
    drafting: bool  # speculative rounds with the drafter (a drafter, γ > 0 and speculative=True)
    stats: DSparkStats
    slots: int
    offset: int = 0
    lookup: bool = False  # lookup drafts (the decoder's ``lookup``, γ > 0 and speculative=True)
    rounds_without_drafter: int = 0  # consecutive rounds whose drafter was skipped (drafter_pays)
    finish_together: bool = False  # no prompt waits for a slot: plan for the running requests' last one

    def take_offset(self) -> int:
        self.offset += 1
        return self.offset - 1


@dataclass
class RoundRecord:
    """What one speculative round drafted, verified and accepted (passed to ``round_observer``).

    R requests, γ drafts, V vocab. The tensors are the decoder's own (do not modify them).

    Attributes
    ----------
    request_ids : list of int
        Each row's request id (its position in the ``generate`` call).
    conf_logit : Tensor or None
        ``(R, γ)`` float32 raw confidence logits (before STS); None without a confidence head.
    draft_tokens : Tensor
        ``(R, γ)`` int64 drafts.
    draft_logits : Tensor
        ``(R, γ, V)`` float32 Markov-corrected draft logits (``q = softmax(z / T)``); with lookup blocks wider
        than γ, ``draft_tokens`` is as wide as they are and ``draft_logits`` stays γ wide.
    target_logits : Tensor
        ``(sum(verify_len), V)`` target logits of the packed verify rows, before any sampling processor.
    qo_indptr : list of int
        ``R + 1`` offsets of each request's rows in ``target_logits`` (row ``k`` of request ``r`` scores draft
        ``k``; row ``verify_len[r] - 1`` is the bonus row).
    verify_len : Tensor
        ``(R,)`` int32 verified rows per request (anchor + admitted drafts).
    accepted : Tensor
        ``(R,)`` int32 accepted drafts per request.
    temperature : float
        Sampling temperature of the round (0 = greedy).
    """

    request_ids: list[int]
    conf_logit: Tensor | None
    draft_tokens: Tensor
    draft_logits: Tensor
    target_logits: Tensor
    qo_indptr: list[int]
    verify_len: Tensor
    accepted: Tensor
    temperature: float
    lookup_rows: list[bool] | None = None  # rows whose verified drafts were the lookup's (None: no lookup)


@dataclass
class RoundState:
    """The values one round's steps hand on (R requests, g drafted slots, V vocabulary)."""

    requests: list[Request]
    anchors: Tensor  # (R,) int64, host
    slots: int  # g: the round's draft width; 0 for a plain-decoding round
    draft_slots: int = 0  # slots the drafter drafts (<= g: lookup blocks may be wider than the drafter's)
    proposal: DraftProposal | None = None
    sample: MarkovSample | None = None
    draft_logits: Tensor | None = None  # (R, g, V) float32, finite (sanitised); None in greedy rounds
    draft_ok: Tensor | None = None  # 0-d bool (device): the drafter's logits were finite
    conf_logit: Tensor | None = None
    survival: Tensor | None = None  # (R, g) float32
    verify_len: Tensor | None = None  # (R,) int32, host
    budget: int = 0
    lookup: LookupBlock | None = None  # this round's lookup proposals (host)
    lookup_score: Tensor | None = (
        None  # (R,) host: the lookup blocks' predicted tokens per unit of verify cost
    )
    decided: list[bool] | None = None  # requests that take the lookup block whatever the drafter's confidence
    run_drafter: bool = False
    draft_tokens: Tensor | None = None  # (R, g) int64 on the device: the drafts verified (either source)
    one_hot: Tensor | None = None  # (R,) bool on the device: the request verifies its lookup block
    one_hot_host: list[bool] | None = None
    verify_cap: Tensor | None = None  # (R,) int32: 1 + the tokens the request's block holds
    target: TargetOutput | None = None
    accepted: Tensor | None = None  # (R,) int32, device
    out_tokens: Tensor | None = None  # (R, g + 1) int64, device
    accepted_host: list[int] = field(default_factory=list)
    tokens_host: list[list[int]] = field(default_factory=list)
    survival_host: list[list[float]] | None = None

    @property
    def ids(self) -> list[int]:
        return [r.rid for r in self.requests]


def decode_round(engine: Engine, call: CallState, requests: list[Request]) -> None:
    """One round for the running ``requests``: each step is one call, timed under its stage name."""
    stats = call.stats
    drafted = drafted_slots(engine, call)
    width = engine.lookup_width if call.lookup else drafted
    r = RoundState(requests, torch.tensor([q.anchor for q in requests]), width, drafted)
    draft_offset = call.take_offset() if r.slots else 0
    if r.slots:
        with stats.stage("lookup"):
            look_up_drafts(engine, call, r)
    if r.run_drafter:
        with stats.stage("draft"):
            feed_pending_context(engine, r.requests)
            r.proposal = engine.drafter.propose(
                r.ids,
                r.anchors,
                num_positions=r.draft_slots,
                **copy_continuations(engine.drafter.config, r.requests),
            )
        with stats.stage("markov_sample"):
            markov_sample(engine, call.sampling, draft_offset, r)
        with stats.stage("confidence"):
            confidence(engine, r)
    if r.slots:
        with stats.stage("plan"):
            choose_sources(engine, r)
            plan(engine, call, r)
    else:  # plain decoding: the anchor row alone
        r.verify_len = torch.ones(len(requests), dtype=torch.int32)
    accept_offset = call.take_offset()
    with stats.stage("verify"):
        verify(engine, r)
    with stats.stage("accept"):
        accept(engine, call.sampling, accept_offset, r)
    observe(engine, call.sampling, r)
    measure_costs(engine, call, r)
    with stats.stage("commit"):
        commit(engine, call, r)


def drafted_slots(engine: Engine, call: CallState) -> int:
    """Slots to draft: 0 without drafting; γ for lookup alone; with a drafter, a cost-driven plan and
    ``adaptive_slots``, one past the last plan's longest verify (the first slots' drafts do not depend on how
    many are drafted)."""
    if not call.drafting:
        return engine.gamma if call.lookup else 0
    adaptive = (
        engine.adaptive_slots
        and engine.drafter.confidence_head is not None
        and engine.planner.effective_mode != "full"
    )
    return call.slots if adaptive else engine.gamma


def look_up_drafts(engine: Engine, call: CallState, r: RoundState) -> None:
    """Each request's lookup proposal (history only) and whether the drafter runs: not when every request's
    lookup block beats even a drafter certain of its first slot, nor when the drafter's predicted tokens do not
    pay its time (docs/lookup.md "Choosing"). A round with neither source is a plain round (``slots = 0``)."""
    r.run_drafter = call.drafting
    if call.lookup:
        r.lookup = look_up(r.requests, r.slots, engine.lookup_acceptance)
    if not call.drafting:
        return
    if r.lookup is not None:
        rates = engine.planner.relative_rates(len(r.requests), r.slots)
        sure = drafter_survival(torch.ones(len(r.requests)), engine.draft_acceptance, r.draft_slots, r.slots)
        r.lookup_score = block_scores(r.lookup.survival, rates)
        wins = r.lookup_score > block_scores(sure, rates)
        r.decided = [bool(w) and n > 0 for w, n in zip(wins.tolist(), r.lookup.lengths, strict=True)]
        r.run_drafter = not all(r.decided)
    if r.run_drafter and call.rounds_without_drafter + 1 < DRAFTER_PROBE_ROUNDS:
        r.run_drafter = drafter_pays(
            engine.planner,
            engine.drafter_yield,
            len(r.requests),
            r.slots,
            r.lookup,
            r.decided,
            engine.drafter_skip_margin,
        )
    call.rounds_without_drafter = 0 if r.run_drafter else call.rounds_without_drafter + 1
    if not r.run_drafter and r.lookup is None:
        r.slots = 0


def markov_sample(engine: Engine, sampling: SamplingConfig, offset: int, r: RoundState) -> None:
    """Draw the drafts; ``q`` is what they were drawn from. NaN/inf drafter logits are flagged (read with the
    round's results) and zeroed so that the ops run; the round then fails naming the draft stage.

    A greedy round builds no ``q``: its rows accept by argmax match and read none, and over a draft vocabulary
    ``q`` would be ``R × g × V`` floats, written, checked and padded every round for nothing (unless a
    ``round_observer`` records it)."""
    p = r.proposal
    # the CPU op checks its input's values; on CUDA (and where the LM head is fused with the draw, U is never
    # apart from z) a NaN in U reaches q, which is checked
    check_base = p.base_logits is not None and p.base_logits.device.type == "cpu"
    if check_base:
        base_ok = all_finite(p.base_logits)
        p.base_logits = sanitized(p.base_logits, base_ok)
    r.sample = engine.drafter.sample(p, sampling.temperature, sampling.seed, offset, whole_vocab=False)
    z = r.sample.logits.float()  # (R, g, V'): finite here iff finite over V (outside: a finite constant)
    z_ok = all_finite(z)
    r.draft_ok = base_ok & z_ok if check_base else z_ok
    if sampling.temperature == 0 and engine.round_observer is None:
        r.draft_logits = None
    else:
        r.draft_logits = engine.drafter.whole_vocab_logits(sanitized(z, z_ok)).contiguous()


def confidence(engine: Engine, r: RoundState) -> None:
    """Survival ``(R, g)`` of the drafts from the confidence head (none for a drafter without one)."""
    g = r.draft_slots
    sts = None if engine.sts is None else engine.sts[:g]
    bias = None if engine.sts_bias is None else engine.sts_bias[:g]
    scored = engine.drafter.score(
        r.proposal.hidden,
        r.sample.prev_emb,
        sts,
        bias,
        prev_tokens=previous_tokens(r.proposal.anchors, r.sample.tokens),
        copy=r.proposal.copy,
    )
    if scored is not None:
        r.conf_logit, _, survival = scored
        ok = all_finite(survival)  # NaN survival (from NaN drafter states) fails the round like NaN logits
        r.draft_ok = r.draft_ok & ok
        r.survival = sanitized(survival, ok).contiguous()


def choose_sources(engine: Engine, r: RoundState) -> None:
    """Per request, the block it verifies — the lookup's or the drafter's — and that block's survival.

    The drafter's block is scored from its first slot's survival (the anchor's) and the drafter's conditional
    acceptance after it, never from its drafted tokens (DESIGN §4.5); a request takes the block with the larger
    predicted tokens per unit of verify cost. Chosen on the device: no host read here.
    """
    if r.lookup is None:  # the drafter's block for every request
        r.draft_tokens = r.sample.tokens
        return
    R, g, lk = len(r.requests), r.slots, r.lookup
    dev = r.sample.tokens.device if r.run_drafter else engine.adapter.device
    has_block = [n > 0 for n in lk.lengths]
    lookup_tokens = to_device(lk.tokens, dev)
    lookup_survival = to_device(lk.survival, dev)
    if not r.run_drafter:  # every request takes its lookup block (or none: it verifies the anchor alone)
        r.one_hot_host = has_block
        r.one_hot = to_device(has_block, dev, torch.bool)
        r.draft_tokens, r.survival = lookup_tokens, lookup_survival
        r.verify_cap = torch.tensor([n + 1 for n in lk.lengths], dtype=torch.int32)  # host: known here
        return
    d = r.draft_slots
    first = r.survival[:, 0] if r.survival is not None else None
    if first is None:  # no confidence head: the drafter's first slot is scored by its history
        first = engine.draft_acceptance.survival([DRAFTER_CLASS], [1], 1)[0].to(dev).expand(R)
    drafter_block = drafter_survival(first, engine.draft_acceptance, d, g)
    rates = engine.planner.relative_rates(R, g)
    better = to_device(r.lookup_score, dev) > block_scores(drafter_block, rates)
    use = (better & to_device(has_block, dev, torch.bool)) | to_device(r.decided, dev, torch.bool)
    r.one_hot = use
    lookup_cap = to_device([n + 1 for n in lk.lengths], dev, torch.int32)
    r.verify_cap = torch.where(use, lookup_cap, torch.full_like(lookup_cap, d + 1))
    own_tokens, own = r.sample.tokens, r.survival if r.survival is not None else drafter_block[:, :d]
    if d < g:  # the drafter drafted fewer slots than the lookup proposes: pad (never verified: verify_cap);
        # its logits stay d wide (``accept`` widens them only as far as a verified lookup block reaches)
        own_tokens = torch.nn.functional.pad(own_tokens, (0, g - d))
        own = torch.nn.functional.pad(own, (0, g - d))
    r.draft_tokens = torch.where(use[:, None], lookup_tokens, own_tokens)
    r.survival = torch.where(use[:, None], lookup_survival, own).contiguous()


def plan(engine: Engine, call: CallState, r: RoundState) -> None:
    """Verify lengths (anchor + admitted drafts) from the survival, at most each block's length; every draft
    without a confidence head or lookup. When the running requests are the call's last (``finish_together``),
    a cost-driven plan weighs each request's survival by how likely it is to finish last
    (:func:`finish_together_weights`: history only)."""
    R, g = len(r.requests), r.slots
    r.verify_len, r.budget = torch.full((R,), g + 1, dtype=torch.int32), R * g
    if r.survival is None:  # nothing to plan with (DFlash)
        return
    survival = r.survival
    if call.finish_together and engine.planner.cost_driven:
        weights = finish_together_weights(
            [q.remaining_tokens for q in r.requests], [q.tokens_per_round for q in r.requests]
        )
        survival = survival * to_device(weights, survival.device)[:, None]
    result = engine.planner.plan(survival, r.ids, drafter=r.run_drafter)
    if result.mode == "full" and r.verify_cap is None:  # every draft is verified: nothing to read
        return
    verify_len, budget, cap = result.verify_len, result.budget, r.verify_cap
    if cap is not None:  # a lookup block may hold fewer than g drafts
        if result.mode == "full" and r.one_hot_host is not None:  # lengths and sources on the host: no read
            r.verify_len, r.budget = cap, int(cap.sum()) - R
            return
        full = result.mode == "full"
        verify_len = cap if full else torch.minimum(verify_len, to_device(cap, verify_len.device))
        budget = verify_len.sum() - R
    one_hot = r.one_hot if r.one_hot_host is None else None  # chosen on the device: read with the plan
    r.verify_len, budget, one_hot_h = engine.host.fetch(verify_len, budget, one_hot)
    r.verify_len = r.verify_len.to(torch.int32)
    r.budget = int(budget)
    if one_hot_h is not None:
        r.one_hot_host = one_hot_h.tolist()
    if engine.adaptive_slots and r.run_drafter:  # next round: one past the most this plan verified, at most γ
        own = [v for i, v in enumerate(r.verify_len.tolist()) if not (r.one_hot_host and r.one_hot_host[i])]
        if own:  # the drafter's blocks only: lookup blocks do not widen the drafter's
            call.slots = min(engine.gamma, max(own))


def verify(engine: Engine, r: RoundState) -> None:
    """One target forward over every request's ``[anchor, x_1 .. x_{l-1}]`` (paged KV, ragged)."""
    lens = r.verify_len.tolist()
    rows = r.anchors[:, None]
    if r.slots:
        rows = torch.cat([to_device(r.anchors, r.draft_tokens.device)[:, None], r.draft_tokens], 1)
    batch = [(rid, rows[i, : lens[i]], "all") for i, rid in enumerate(r.ids)]
    r.target = engine.adapter.forward(batch, layers=engine.taps)


def accept(engine: Engine, sampling: SamplingConfig, offset: int, r: RoundState) -> None:
    """Rejection sampling of the drafts (a plain draw from ``p`` without drafts), then the round's one read.

    Fails the round before anything is committed when the drafter's logits, or a target row whose value the
    committed tokens depend on (rows up to and including the first rejection or the bonus row), are NaN/inf.
    """
    logits = r.target.logits
    finite = rows_finite(logits)
    if logits.device.type == "cpu":  # the CPU op checks its rows' values: a non-finite row is zeroed first
        logits = sanitized(logits.float(), finite)
    # On other devices the op reads the rows in the target's dtype, without a cast or a sanitising copy of
    # the (N, V) logits: a non-finite row spoils only its own request's tokens, and the round fails from
    # `finite` (below) before committing any of them.
    R, V, g, dev = len(r.requests), logits.shape[-1], r.slots, logits.device
    # None: lookup only, or a greedy round (its rows read no q)
    q = r.draft_logits if g else torch.empty(R, 0, V, dtype=torch.float32, device=dev)
    drafts = r.draft_tokens.clamp(0, V - 1) if g else torch.empty(R, 0, dtype=torch.int64, device=dev)
    if q is not None and q.shape[1] < g:  # hybrid: lookup blocks wider than the drafter's (R, d, V) logits
        # slots past the widest verified block are never read
        w = max(int(r.verify_len.max()) - 1, q.shape[1])
        q = torch.nn.functional.pad(q, (0, 0, 0, w - q.shape[1])) if w > q.shape[1] else q
        drafts = drafts[:, :w]  # lookup rows' q is not read (one-hot), so zero padding is never used
    histories = [q_.prompt + q_.generated for q_ in r.requests]
    r.accepted, r.out_tokens = accept_drafts(
        logits,
        r.target.qo_indptr,
        q,
        drafts,
        r.verify_len,
        sampling,
        offset,
        r.ids,
        histories,
        r.one_hot if q is not None else None,  # no q: every row is one-hot, or greedy (reads no q)
    )
    acc, tokens, finite_h, draft_ok, surv = engine.host.fetch(
        r.accepted, r.out_tokens, finite, r.draft_ok, r.survival
    )
    if draft_ok is not None and not bool(draft_ok):
        raise RuntimeError("draft: the drafter produced NaN/inf logits")
    r.accepted_host, r.tokens_host = acc.tolist(), tokens.tolist()
    qo = r.target.qo_indptr
    for i, a in enumerate(r.accepted_host):
        if not bool(finite_h[qo[i] : qo[i] + a + 1].all()):
            raise RuntimeError(
                f"target verify: the target produced NaN/inf logits (request {r.requests[i].index}, a row its "
                "next tokens depend on)"
            )
    r.survival_host = surv.tolist() if surv is not None else None


def observe(engine: Engine, sampling: SamplingConfig, r: RoundState) -> None:
    """Hand the round to ``round_observer`` (calibration data) after a speculative round."""
    if engine.round_observer is None or not r.run_drafter:
        return
    engine.round_observer(
        RoundRecord(
            [q.index for q in r.requests],
            r.conf_logit,
            r.draft_tokens,
            r.draft_logits,
            r.target.logits,
            list(r.target.qo_indptr),
            r.verify_len,
            r.accepted,
            sampling.temperature,
            r.one_hot_host,
        )
    )


def measure_costs(engine: Engine, call: CallState, r: RoundState) -> None:
    """Hand the planner this round's host times when it measures costs: verify + accept (both grow with the
    verified rows) and, when the drafter ran, its stages."""
    if engine.planner.measured is None or not (call.drafting or call.lookup):
        return
    last = call.stats.last_seconds
    draft_ms = None
    if r.run_drafter:
        draft_ms = 1000.0 * sum(last[s] for s in ("draft", "markov_sample", "confidence"))
    verify_ms = 1000.0 * (last["verify"] + last["accept"])
    engine.planner.observe(len(r.requests), int(r.verify_len.sum()), verify_ms, draft_ms)


def commit(engine: Engine, call: CallState, r: RoundState) -> None:
    """Cut the target KV back to the committed tokens, apply the stop rules, feed the drafter the target
    features of the committed rows (held while it is skipped), record the round."""
    lens = r.verify_len.tolist()
    emitted, cont, cont_rows = [], [], []
    for i, req in enumerate(r.requests):
        a = r.accepted_host[i]
        committed_len = engine.adapter.length(req.rid) - lens[i] + 1 + a  # anchor + accepted drafts
        engine.adapter.truncate(req.rid, committed_len)
        kept = req.commit(r.tokens_host[i][: a + 1])  # extends the request's lookup index too
        emitted.append(len(kept))
        learn_acceptance(engine, r, i, kept, lens[i])
        if not req.done:
            cont.append(req)
            cont_rows.append((r.target.qo_indptr[i], a + 1))
    if call.drafting and cont:  # the committed rows' target features, gathered in one index
        rows = torch.tensor([s + j for s, n in cont_rows for j in range(n)], dtype=torch.int64)
        feats = target_features(engine, r.target, rows).split([n for _, n in cont_rows])
        for req, f in zip(cont, feats, strict=True):
            req.pending_context.append(f)
        # one batched append after a drafter round; after a round without it the rows wait for the next
        # one (many rounds, one append), up to PENDING_CONTEXT_ROWS per request
        full = [q for q in cont if sum(len(f) for f in q.pending_context) >= PENDING_CONTEXT_ROWS]
        feed_pending_context(engine, cont if r.run_drafter else full)
    call.stats.record_round(lens, r.accepted_host, emitted, r.survival_host, r.budget, sources(r))


# rows a request's pending context may hold before they are appended without waiting for the drafter
PENDING_CONTEXT_ROWS = 64


def feed_pending_context(engine: Engine, requests: list[Request]) -> None:
    """Append the rows committed while the drafter was skipped to its contexts (one batched call)."""
    waiting = [req for req in requests if req.pending_context]
    if waiting:
        feats = [torch.cat(req.pending_context) for req in waiting]
        engine.drafter.append_context([req.rid for req in waiting], feats)
        for req in waiting:
            req.pending_context.clear()


def learn_acceptance(engine: Engine, r: RoundState, i: int, kept: list[int], verify_len: int) -> None:
    """Update the acceptance tables from request ``i``'s committed tokens: the lookup's from what its proposal
    would have matched (whichever block was verified: the committed tokens follow the target's law), the
    drafter's from its verified block."""
    if r.lookup is not None and r.lookup.lengths[i]:
        engine.lookup_acceptance.observe_continuation(r.lookup.classes[i], r.lookup.proposals[i], kept)
    lookup_row = r.one_hot_host is not None and r.one_hot_host[i]
    if r.run_drafter and not lookup_row:
        engine.draft_acceptance.observe(DRAFTER_CLASS, verify_len - 1, r.accepted_host[i])
        engine.drafter_yield.observe(len(kept), verify_len)


def sources(r: RoundState) -> list[str] | None:
    """Each request's block this round: "lookup", "dspark" or "none" (None for a round without lookup)."""
    if r.lookup is None:
        return None
    own = "dspark" if r.run_drafter else "none"  # a round whose drafter was skipped drafted nothing
    looked = ["corpus" if c else "lookup" for c in r.lookup.from_corpus]
    return [looked[i] if h else own for i, h in enumerate(r.one_hot_host)]


def target_features(engine: Engine, out: TargetOutput, rows: Tensor) -> Tensor:
    """The drafter's input features ``(n, m·H)``: the tapped layers' outputs of the target at ``rows``."""
    rows = to_device(rows, out.hidden[engine.taps[0]].device)  # a CPU index would copy (and sync) per layer
    return torch.cat([out.hidden[layer][rows] for layer in engine.taps], -1)


def prefill(engine: Engine, call: CallState, requests: list[Request]) -> None:
    """Put the requests' prompts (and, for resumed ones, their committed tokens) into the caches; draw the first
    token of the new ones from ``p``. A failure leaves no trace of these requests in the caches."""
    try:
        for req in requests:
            if call.lookup and req.lookup is None:  # the index outlives a preemption, as the history does
                req.lookup = LookupIndex(engine.lookup, engine.lookup_corpus)
                req.lookup.extend(req.prompt + req.generated)
            if call.drafting and req.copy_index is None and engine.drafter.config.uses_copies:
                req.copy_index = new_copy_index(engine.drafter.config, req.prompt + req.generated)
            engine.adapter.add_request(req.rid)
        with call.stats.stage("verify"):
            batch = [(req.rid, req.prompt + req.generated[:-1], "last") for req in requests]
            out = engine.adapter.forward(batch, layers=engine.taps if call.drafting else ())
        if call.drafting:
            feats = target_features(engine, out, torch.arange(out.qo_indptr[-1]))
            sizes = [out.qo_indptr[i + 1] - out.qo_indptr[i] for i in range(len(requests))]
            engine.drafter.append_context(
                [q.rid for q in requests], list(feats.split(sizes)), [0] * len(sizes)
            )
        new = [i for i, req in enumerate(requests) if not req.generated]
        if new:  # one logit row per request; slices, not a list index (a host index would sync on CUDA)
            logits = (
                out.logits if len(new) == len(requests) else torch.cat([out.request_logits(i) for i in new])
            )
            draw_first_tokens(engine, call, [requests[i] for i in new], logits)
    except BaseException:
        for req in requests:
            release(engine, req)
        raise
    for req in requests:
        req.started = True
        if req.generated and not req.done:
            req.anchor = req.generated[-1]


def draw_first_tokens(engine: Engine, call: CallState, requests: list[Request], logits: Tensor) -> None:
    """Each new request's first token, drawn from ``p`` of its last prompt row."""
    logits = logits.float()
    finite = all_finite(logits)
    offset = call.take_offset()
    histories = [q.prompt for q in requests]
    tokens = sample_next(
        sanitized(logits, finite), call.sampling, offset, [q.rid for q in requests], histories
    )
    tokens, finite = engine.host.fetch(tokens, finite)
    if not bool(finite):
        raise RuntimeError("target verify: the target produced NaN/inf logits")
    for req, tok in zip(requests, tokens.tolist(), strict=True):
        req.commit([tok])


def release(engine: Engine, req: Request) -> None:
    """Free the request's KV pages and drafter context (it keeps its committed tokens)."""
    if req.rid in engine.adapter.pool:
        engine.adapter.finish(req.rid)
    if engine.drafter is not None:
        engine.drafter.finish(req.rid)
    req.pending_context.clear()  # a resumed request's context is rebuilt from its committed tokens
    req.started = False
