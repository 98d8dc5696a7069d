# SPDX-License-Identifier: Apache-2.0
"""``DSparkDecoder``: batched, exact speculative generation for a Hugging Face causal LM and a DSpark drafter.

This file is the scheduler: it checks a call's inputs (``inputs.py``), admits waiting requests when the KV pool
can hold them, preempts the newest running request when the pool runs short, runs prefills and rounds
(``round.py``), streams committed tokens and releases finished requests. docs/decoder.md describes it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from dspark.decoding.acceptance import AcceptanceTable
from dspark.decoding.inputs import (
    SamplingConfig,
    as_float,
    as_int,
    chat_token_ids,
    encode_prompts,
    load_sts,
    resolve_sampling,
)
from dspark.decoding.lookup import LookupConfig, lookup_width
from dspark.decoding.lookup_corpus import LookupCorpus
from dspark.decoding.machine import warn_if_profiled_elsewhere
from dspark.decoding.planner import Planner, SpsTable
from dspark.decoding.request import GenerateOutput, Request, StreamEvent
from dspark.decoding.round import CallState, RoundRecord, decode_round, prefill, release
from dspark.decoding.sources import DRAFTER_SKIP_MARGIN, DRAFTER_SKIP_MARGIN_LOCAL, DrafterYield
from dspark.decoding.stats import DSparkStats
from dspark.decoding.stopping import StopCriteria, TextStream
from dspark.host_sync import HostReader
from dspark.kv import KVPoolExhausted
from dspark.models.compiling import compile_drafter, compile_target_blocks, restore_compiled
from dspark.models.drafter import DSparkDrafter
from dspark.models.drafter_graphs import DrafterGraphs
from dspark.models.pairing import target_text_config, validate_pairing
from dspark.models.target import TargetAdapter
from dspark.models.target_graphs import GraphBuckets

__all__ = ["DSparkDecoder", "GenerateOutput", "RoundRecord", "StreamEvent", "chat_token_ids"]

# the most drafts per round of lookup decoding without a drafter
LOOKUP_MAX_GAMMA = 64


class DSparkDecoder:
    """Speculative generation with a DSpark drafter that keeps the target's output distribution exactly.

    Parameters
    ----------
    target : transformers.PreTrainedModel
        The causal LM to accelerate (its attention is switched to dspark's paged backend once every argument
        has been checked; :meth:`close` restores it).
    drafter : DSparkDrafter or None
        A drafter paired with ``target`` (checked before anything runs). None: plain decoding through the same
        engine (continuous batching, paged KV, streaming), or lookup decoding with ``lookup``.
    planner : str or Planner
        ``"full"``, ``"threshold"``, ``"early_stop"`` (default) or ``"lagged_topk"``, or a ready Planner.
    sps_table : SpsTable, CostTable, dict, path or None
        Target cost curve for the planner (missing: every draft is verified). Profiled on this machine
        (``dspark profile``, or ``dspark.profiling.local_cost_table(target, drafter)``: cached); a table from
        another machine warns.
    sts : path, dict, sequence of float or None
        Per-position STS of the confidence head: SGLang's STS JSON (path or loaded dict; an optional
        ``"biases"`` list adds affine offsets, ``conf = sigmoid(logit / T + b)``) or a list of temperatures.
    block_size : int or None
        Drafts per round γ (default: the drafter's block size; at most that; without a drafter 0, or with
        ``lookup`` its ``max_tokens``, default 8, at most 64). A hybrid decoder's lookup blocks hold up to
        ``max_tokens`` (default 16) drafts, never fewer than γ (``decoder.lookup_width``).
    page_size : int
        KV page size of the target's paged cache.
    max_batch_size : int
        Requests decoded together; further prompts wait and are admitted as requests finish.
    tokenizer : optional
        Needed for string prompts, chat messages, stop strings and decoded text.
    threshold, lag : float, int
        Settings of the ``threshold`` and ``lagged_topk`` planner modes.
    max_kv_pages : int or None
        Cap on the target's KV pool. A request is admitted only when the pool can hold its prefill and one
        round; when running requests outgrow it, the newest is preempted and resumed once it fits again.
    round_observer : callable or None
        Called with a :class:`RoundRecord` after every speculative round (calibration data collection); may be
        set or cleared later through the attribute of the same name.
    linear_max_rows : int or None
        Few-row fp32 linears on CPU compute ``(W · xᵀ)ᵀ`` (see :class:`dspark.models.target.TargetAdapter`).
        ``None``: the adapter's default; ``0``: off.
    adaptive_slots : bool
        With a cost-driven plan (a confidence head and a planner mode other than ``full``), draft only as many
        slots as the previous round's plan used plus one (all γ in a call's first round). Changes cost, not the
        output distribution. Default on.
    lookup : bool or LookupConfig
        Lookup drafts: each request also proposes the tokens that followed the longest recent match of its own
        history (prompt + output; docs/lookup.md). With a drafter, each request verifies whichever block predicts
        more tokens per unit of verify cost (the choice never looks at a drafted token: exact); without one,
        this is prompt-lookup decoding. ``True``: ``LookupConfig()``. Default off.
    lookup_prior : path, dict or None
        Prior of the lookup acceptance by (match class, position): ``lookup_prior.json`` as ``dspark calibrate``
        writes it (next to ``sts.json``); None: a weak default. The decoder refines it online from every
        committed token.
    cuda_graphs : bool or GraphBuckets
        Replay the target's decode / verify forwards from CUDA graphs bucketed by request and token count
        (:class:`dspark.models.target.TargetAdapter`; prefills stay eager), and the drafter's block forward,
        LM head with Markov draw and confidence head from graphs bucketed by request count, and its context
        append from graphs bucketed by row count (:class:`dspark.models.drafter_graphs.DrafterGraphs`, its
        ``heads`` and ``context``). CUDA only; default off. ``decoder.adapter.graph_stats``,
        ``decoder.drafter_graphs.stats``, ``.heads.stats`` and ``.context.stats`` say what they did.
    measure_costs : bool
        Correct the cost table (``sps_table``, needed) with the verify and drafter times measured in each round,
        so that the planner prices this machine, context length and dtype rather than the profiled ones
        (:class:`dspark.decoding.measured_costs.MeasuredCosts`). CPU only (host times measure the device's work
        there). The output distribution is unchanged, but verify lengths then depend on timings, so a seeded
        sampled call is not reproducible run to run. Default off.
    finish_together : bool
        When no prompt waits for a slot, the call ends with the last running request: a cost-driven planner
        then spends verify rows on the requests predicted to finish last and lets those far ahead verify fewer
        (docs/decoder.md "When no prompt waits"). Shortens a batch's wall time, not any request's output
        distribution; ``False`` plans every round for throughput (e.g. when streams' own latencies matter).
        Default on.
    """

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: DSparkDrafter | None = None,
        planner: str | Planner = "early_stop",
        sps_table: SpsTable | dict | str | Path | None = None,
        sts: Any = None,
        block_size: int | None = None,
        page_size: int = 16,
        max_batch_size: int = 8,
        tokenizer: Any = None,
        threshold: float = 0.0,
        lag: int = 1,
        max_kv_pages: int | None = None,
        round_observer: Callable[[RoundRecord], None] | None = None,
        linear_max_rows: int | None = None,
        adaptive_slots: bool = True,
        lookup: bool | LookupConfig = False,
        lookup_prior: str | Path | dict | None = None,
        cuda_graphs: bool | GraphBuckets = False,
        measure_costs: bool = False,
        finish_together: bool = True,
    ) -> None:
        # every argument is checked before the target is touched (TargetAdapter switches its attention last)
        if drafter is not None:
            if not isinstance(drafter, DSparkDrafter):
                raise TypeError(f"drafter: expected a DSparkDrafter or None, got {type(drafter).__name__}")
            validate_pairing(drafter.config, target, tokenizer=tokenizer)
        lookup_config = _lookup_config(lookup)
        most = drafter.config.block_size if drafter is not None else 0
        default = most
        if drafter is None and lookup_config is not None:
            most, default = LOOKUP_MAX_GAMMA, lookup_width(lookup_config, 0, with_drafter=False)
        gamma = default if block_size is None else as_int("block_size", block_size, lo=0)
        if gamma > most:
            raise ValueError(
                f"block_size: must be in [0, {most}] (the drafter's block size; 0 without a drafter, "
                f"{LOOKUP_MAX_GAMMA} for lookup alone), got {gamma}"
            )
        width = gamma  # lookup drafts per round: γ, or a hybrid decoder's wider lookup blocks
        if drafter is not None and lookup_config is not None:
            width = lookup_width(lookup_config, gamma, with_drafter=True)
        lookup_table = _lookup_table(lookup_config, lookup_prior, max(width, 1))
        self.max_batch_size = as_int("max_batch_size", max_batch_size, lo=1)
        page_size = as_int("page_size", page_size, lo=1)
        if max_kv_pages is not None:
            max_kv_pages = as_int("max_kv_pages", max_kv_pages, lo=1)
        if not isinstance(measure_costs, bool):
            raise TypeError(f"measure_costs: expected a bool, got {type(measure_costs).__name__}")
        if not isinstance(finish_together, bool):
            raise TypeError(f"finish_together: expected a bool, got {type(finish_together).__name__}")
        measuring = measure_costs or (isinstance(planner, Planner) and planner.measured is not None)
        if measuring and _device_type(target) != "cpu":
            raise ValueError(
                "measure_costs: CPU targets only (round times are read on the host, which runs ahead of a GPU), "
                f"got a target on {_device_type(target)}"
            )
        if measure_costs and isinstance(planner, Planner):
            raise ValueError(
                "measure_costs: pass Planner(..., measure_costs=True) when giving a ready Planner"
            )
        if round_observer is not None and not callable(round_observer):
            raise TypeError(
                f"round_observer: expected a callable or None, got {type(round_observer).__name__}"
            )
        self.planner = (
            planner
            if isinstance(planner, Planner)
            # lookup decoding runs no drafter: a cost table prices its rounds by the verify alone
            else Planner(
                planner,
                sps_table,
                as_float("threshold", threshold),
                lag,
                draft_cost=drafter is not None,
                measure_costs=measure_costs,
            )
        )
        # the drafter's skip margin covers a cost table's error: smaller for a table profiled on this machine
        self.drafter_skip_margin = DRAFTER_SKIP_MARGIN
        if self.planner.cost_table is not None:
            metadata = self.planner.cost_table.metadata
            elsewhere = warn_if_profiled_elsewhere(metadata, _device(target))
            if metadata.get("device_name") and elsewhere is None:
                self.drafter_skip_margin = DRAFTER_SKIP_MARGIN_LOCAL
        sts_t, sts_b = load_sts(sts, max(gamma, 1))
        self.target = target
        self.drafter = drafter
        self.gamma = gamma
        self.lookup_width = width  # lookup drafts per round (>= γ; = γ without a drafter)
        self.tokenizer = tokenizer
        self.vocab_size = int(target_text_config(target).vocab_size)
        self.taps = list(drafter.config.target_layer_ids) if drafter is not None else []
        self.adaptive_slots = bool(adaptive_slots)
        self.finish_together = finish_together
        self.round_observer = round_observer
        self.max_positions = getattr(target_text_config(target), "max_position_embeddings", None)
        self.stats = DSparkStats(gamma=self.round_width)
        self.lookup = lookup_config
        self.lookup_acceptance = lookup_table
        # finished requests' outputs as a second lookup source (LookupConfig.corpus_tokens; None: off)
        self.lookup_corpus = (
            LookupCorpus(lookup_config.min_match, lookup_config.max_match, lookup_config.corpus_tokens)
            if lookup_config is not None and lookup_config.corpus_tokens
            else None
        )
        # the drafter's acceptance of slot j given the slots before it (scores its block against the lookup's)
        self.draft_acceptance = AcceptanceTable(1, max(gamma, 1))
        self.drafter_yield = DrafterYield()  # what its blocks returned: whether the drafter pays its time
        self.host = HostReader()  # every device -> host read of a round goes through it (counted)
        self._open_call = False  # a generate call (or stream) is running
        self.adapter = TargetAdapter(
            target,
            page_size=page_size,
            max_pages=max_kv_pages,
            linear_max_rows=linear_max_rows,
            cuda_graphs=cuda_graphs,
        )
        # the drafter's block forward in CUDA graphs too, with the target's buckets
        self.drafter_graphs = None
        self._compiled_target: list[torch.nn.Module] = []  # compile(target=True); close() restores them
        if drafter is not None and self.adapter.graphs is not None:
            self.drafter_graphs = drafter.graphs = DrafterGraphs(drafter, self.adapter.graphs.buckets)
        dev = self.adapter.device  # the STS vectors move to the device once, not every round
        self.sts = None if sts_t is None else sts_t.to(dev)
        self.sts_bias = None if sts_b is None else sts_b.to(dev)

    # ------------------------------------------------------------------ public API
    def fits_context(self, prompt_len: int, max_new_tokens: int) -> bool:
        """Whether a prompt of ``prompt_len`` tokens leaves room for ``max_new_tokens`` and a last verify block
        (``round_width + 1`` positions) within the target's ``max_position_embeddings`` (True when the target
        declares none)."""
        return (
            not self.max_positions or prompt_len + max_new_tokens + self.round_width + 1 <= self.max_positions
        )

    @property
    def round_width(self) -> int:
        """The most drafts one request verifies in a round: γ, or the lookup blocks' width when wider."""
        return max(self.gamma, self.lookup_width)

    def close(self) -> None:
        """Restore the target's attention implementation and its compiled modules, free the KV caches and the CUDA
        graphs (idempotent)."""
        self.adapter.close()
        restore_compiled(self._compiled_target)
        self._compiled_target = []
        if self.drafter_graphs is not None and self.drafter.graphs is self.drafter_graphs:
            self.drafter.graphs = None
        self.drafter_graphs = None

    def compile(self, target: bool = False, **options: Any) -> DSparkDecoder:
        """``torch.compile`` the drafter's dense per-row work, in place; returns ``self``.

        Compiled (``nn.Module.compile``, so parameter names and checkpoints are unchanged): every draft layer's
        norms and MLP, the final norm, and the context projection ``fc`` + ``hidden_norm``. The attention over
        the paged contexts, Markov sampling and confidence are custom ops and stay eager.
        Shapes vary with the number of requests, so ``dynamic=True`` is the default. ``options`` go to
        ``torch.compile`` (e.g. ``mode="max-autotune"``). Outputs are unchanged up to float rounding.

        ``target=True`` compiles the target's RMSNorm and MLP modules too (found by class name, as the HF
        Llama / Qwen / Mistral families name them; a model without them is left as it is): each norm becomes
        one fused kernel instead of about six, and the MLP's activation and product one, which matters where a
        forward is hundreds of small kernels (a GPU at small batches). :meth:`close` restores them.
        """
        opts = {"dynamic": True, **options}
        if target:
            self._compiled_target += compile_target_blocks(self.target, opts)
        if self.drafter is not None:
            compile_drafter(self.drafter, opts)
        return self

    def generate(
        self,
        prompts: Any,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        stop: Sequence[str] | str | None = None,
        seed: int = 0,
        generation_config: Any = None,
        stream: bool = False,
        speculative: bool = True,
    ) -> GenerateOutput | Iterator[StreamEvent]:
        """Generate continuations of one or several prompts.

        Parameters
        ----------
        prompts
            Token ids (a list of ints or a 1-D integer tensor), a batch of token-id lists of different lengths
            (or a 2-D tensor), a string, a list of strings, chat messages (``[{"role": ..., "content": ...}]``)
            or a list of those. Strings and messages go through the tokenizer's chat template.
        max_new_tokens, temperature, top_k, top_p, repetition_penalty, eos_token_id
            As in Hugging Face ``generate``; ``temperature`` 0 (default) is greedy, ``top_k`` 0 is off. Values
            not given are taken from ``generation_config`` (then from the target's), max_new_tokens defaulting
            to 128.
        stop : str or list of str
            Stop strings (need a tokenizer).
        seed : int
            Seed of the counter-based RNG in [0, 2**63): the same seed and prompts give the same output.
        stream : bool
            Return an iterator of :class:`StreamEvent` (committed tokens of each request as they come). One call
            runs at a time: another ``generate`` while a stream is open raises ``RuntimeError`` and leaves the
            stream intact (consume, ``close()`` or drop the stream first).
        speculative : bool
            False runs plain decoding through the same engine (γ = 0).

        Raises
        ------
        ValueError
            A bad argument (named), before any work.
        KVPoolExhausted
            After the other requests finished, when a request could never fit the KV pool (``max_kv_pages``);
            the exception's ``output`` holds every request's result (that one's finish reason is ``"error"``).
        RuntimeError
            NaN/inf logits (naming the stage), or a call while a stream is open.
        """
        self._check_no_open_call()
        gc = (
            generation_config
            if generation_config is not None
            else getattr(self.target, "generation_config", None)
        )
        sampling = resolve_sampling(
            gc,
            self.tokenizer,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=repetition_penalty,
            eos_token_id=eos_token_id,
            stop=stop,
            seed=seed,
        )
        reqs = self._make_requests(encode_prompts(prompts, self.tokenizer, self.vocab_size), sampling)
        drafting = bool(speculative) and self.drafter is not None and self.gamma > 0
        lookup = bool(speculative) and self.lookup is not None and self.gamma > 0
        call = CallState(
            sampling, drafting, DSparkStats(gamma=self.round_width), slots=self.gamma, lookup=lookup
        )
        events = self._run(reqs, call)
        if stream:
            return events
        try:
            for _ in events:
                pass
        except KVPoolExhausted as e:
            e.output = self._output(reqs, call)
            raise
        return self._output(reqs, call)

    # ------------------------------------------------------------------ inputs
    def _check_no_open_call(self) -> None:
        if self._open_call:
            raise RuntimeError(
                "generate: a stream of an earlier generate call is still open; consume it to the end, close it "
                "(stream.close()) or drop it before starting another call"
            )

    def _make_requests(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> list[Request]:
        reqs = []
        for i, p in enumerate(prompt_ids):
            if not self.fits_context(len(p), sampling.max_new_tokens):
                raise ValueError(
                    f"prompts[{i}]: {len(p)} prompt tokens + max_new_tokens {sampling.max_new_tokens} + "
                    f"{self.round_width + 1} positions for a round's verify block (anchor + drafts) exceed the "
                    f"target's context of {self.max_positions} positions (max_position_embeddings)"
                )
            stop = StopCriteria(sampling.max_new_tokens, sampling.eos, sampling.stop, self.tokenizer)
            stream = TextStream(self.tokenizer) if self.tokenizer is not None else None
            reqs.append(Request(i, i, p, stop, stream))  # rid = index: the i-th prompt's random stream
        return reqs

    def _output(self, reqs: list[Request], call: CallState) -> GenerateOutput:
        texts = None
        if self.tokenizer is not None:
            texts = [self.tokenizer.decode(r.generated, skip_special_tokens=True) for r in reqs]
        return GenerateOutput(
            sequences=[list(r.generated) for r in reqs],
            prompt_ids=[list(r.prompt) for r in reqs],
            texts=texts,
            finish_reasons=[r.finish_reason for r in reqs],
            stats=call.stats,
        )

    # ------------------------------------------------------------------ the scheduler
    def _run(self, reqs: list[Request], call: CallState) -> Iterator[StreamEvent]:
        self._check_no_open_call()  # a stream starts work at its first next()
        self._open_call = True
        waiting, active, failed = deque(reqs), [], []
        t_start = time.perf_counter()
        self.planner.reset()
        try:
            while waiting or active:
                self._admit(waiting, active, failed)
                fresh = [r for r in active if not r.started]
                if fresh:
                    prefill(self, call, fresh)
                elif active:
                    self._make_room(call, active, waiting, failed)
                    if active:
                        call.finish_together = self.finish_together and not waiting
                        self._round(call, active)
                for r in failed + active:
                    yield from r.events
                    r.events.clear()
                failed.clear()
                for r in active:
                    if r.done:
                        if self.lookup_corpus is not None and r.error is None:
                            self.lookup_corpus.add(r.generated)
                        self._release(r)
                active = [r for r in active if not r.done]
            lost = [r for r in reqs if r.error is not None]
            if lost:
                raise KVPoolExhausted("; ".join(f"prompts[{r.index}]: {r.error}" for r in lost))
        finally:
            for r in active:
                self._release(r)
            self._open_call = False
            call.stats.wall_seconds = time.perf_counter() - t_start
            self.stats.merge(call.stats)

    def _round(self, call: CallState, running: list[Request]) -> None:
        decode_round(self, call, running)

    def _release(self, r: Request) -> None:
        release(self, r)

    # ------------------------------------------------------------------ KV pages
    def _peak_tokens(self, r: Request) -> int:
        """Tokens ``r`` holds at the end of its next round if admitted now: prefill + anchor + ``round_width``
        drafts."""
        return len(r.prompt) + max(len(r.generated) - 1, 0) + self.round_width + 1

    def _round_pages(self, r: Request) -> int:
        """Pages a running request needs on top of what it holds for one more round (``round_width + 1``
        tokens)."""
        pool = self.adapter.pool
        return max(
            0, pool.pages_needed(pool.length(r.rid) + self.round_width + 1) - len(pool.block_table(r.rid))
        )

    def _spare_pages(self, active: list[Request]) -> float:
        """Pages not promised to the active requests' next step (inf for a pool without a cap)."""
        pool = self.adapter.pool
        if pool.max_pages is None:
            return float("inf")
        promised = sum(
            self._round_pages(r) if r.started else pool.pages_needed(self._peak_tokens(r)) for r in active
        )
        return pool.free_pages + (pool.max_pages - pool.total_pages) - promised

    def _admit(self, waiting: deque, active: list[Request], failed: list[Request]) -> None:
        """Move waiting requests (in order) to the batch while the pool can hold their prefill and a round."""
        pool = self.adapter.pool
        while waiting and len(active) < self.max_batch_size:
            r = waiting[0]
            need = pool.pages_needed(self._peak_tokens(r))
            if pool.max_pages is not None and need > pool.max_pages:  # not even an empty pool holds it
                waiting.popleft()
                self._fail(r, need, failed)
                continue
            if need > self._spare_pages(active):
                return
            active.append(waiting.popleft())

    def _make_room(
        self, call: CallState, active: list[Request], waiting: deque, failed: list[Request]
    ) -> None:
        """Preempt the newest running requests until the rest can run a round; a request alone that still does
        not fit is dropped with an error (the others go on)."""
        while active and self._spare_pages(active) < 0:
            victim = active[-1]  # the newest: it resumes from its committed tokens later
            active.remove(victim)
            self._release(victim)
            if active:
                waiting.appendleft(victim)
                call.stats.preemptions += 1
            else:
                need = self.adapter.pool.pages_needed(self._peak_tokens(victim))
                self._fail(victim, need, failed)

    def _fail(self, r: Request, need: int, failed: list[Request]) -> None:
        pool = self.adapter.pool
        r.fail(
            f"needs {need} KV pages of {pool.page_size} tokens for its prefill and one round "
            f"({self._peak_tokens(r)} tokens) but the pool holds at most {pool.max_pages} (max_kv_pages)"
        )
        failed.append(r)


def _device_type(model: torch.nn.Module) -> str:
    """Where the model's parameters live ("cpu" for a model without any)."""
    return _device(model).type


def _device(model: torch.nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return torch.device("cpu") if param is None else param.device


def _lookup_config(lookup: Any) -> LookupConfig | None:
    if isinstance(lookup, LookupConfig):
        return lookup
    if lookup is True:
        return LookupConfig()
    if lookup is False or lookup is None:
        return None
    raise TypeError(f"lookup: expected a bool or a LookupConfig, got {type(lookup).__name__}")


def _lookup_table(config: LookupConfig | None, prior: Any, gamma: int) -> AcceptanceTable | None:
    """The lookup acceptance table (classes of :func:`match_class`), from ``prior`` when given."""
    if config is None:
        if prior is not None:
            raise ValueError("lookup_prior: given without lookup (pass lookup=True or a LookupConfig)")
        return None
    if prior is not None and not isinstance(prior, (str, Path, dict)):
        raise TypeError(f"lookup_prior: expected a path, a dict or None, got {type(prior).__name__}")
    return AcceptanceTable.for_lookup(config, gamma, prior)
