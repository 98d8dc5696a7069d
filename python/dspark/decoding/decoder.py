# SPDX-License-Identifier: Apache-2.0
"""``DSparkDecoder``: batched, exact speculative generation for a Hugging Face causal LM and a DSpark drafter.

One round for the R active requests (docs/decoder.md):

1. the drafter drafts γ tokens per request from its context (backbone, Markov sampling, confidence);
2. the planner picks each request's verify length from the survival (``plan_verify``);
3. the target runs once on the packed ``[anchor, x_1 .. x_{l_r}]`` of every request (paged KV);
4. ``rejection_sample`` accepts a prefix of each request's drafts and emits a correction or bonus token;
5. commit: the target KV is cut back to the committed tokens, the drafter context gets their target features,
   stop rules are applied, finished requests free their state and waiting requests are admitted.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dspark.decoding.planner import Planner, SpsTable
from dspark.decoding.stats import DSparkStats
from dspark.decoding.stopping import StopCriteria, TextStream
from dspark.host_sync import HostReader, all_finite, sanitized, to_device
from dspark.kv import KVPoolExhausted
from dspark.models.drafter import DSparkDrafter
from dspark.models.pairing import validate_pairing
from dspark.models.target import TargetAdapter
from dspark.ops import rejection_sample


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
    text (when a tokenizer is known), ``finish_reasons[i]`` one of ``"eos"``, ``"stop"``, ``"length"``.
    """

    sequences: list[list[int]]
    prompt_ids: list[list[int]]
    texts: list[str] | None
    finish_reasons: list[str]
    stats: DSparkStats


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
        ``(R, γ, V)`` float32 Markov-corrected draft logits (``q = softmax(z / T)``).
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


@dataclass(eq=False)  # identity comparison: requests are compared in list operations
class _Request:
    index: int
    rid: int
    prompt: list[int]
    stop: StopCriteria
    stream: TextStream | None
    anchor: int = -1
    started: bool = False  # the prompt (and any resumed tokens) are in the KV caches
    events: list[StreamEvent] = field(default_factory=list)

    @property
    def generated(self) -> list[int]:
        return self.stop.generated


def chat_token_ids(tokenizer: Any, prompt: str | list[dict]) -> list[int]:
    """Token ids of a user message (a string) or a chat, through the tokenizer's chat template."""
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def _sts_vector(values: Any, gamma: int, what: str) -> Tensor:
    try:
        t = torch.as_tensor(values, dtype=torch.float32).reshape(-1)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"sts: {what} must be a list of numbers ({e})") from None
    if t.numel() < gamma:
        raise ValueError(f"sts: {t.numel()} {what} for block size {gamma}; need one per draft position")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"sts: {what} must be finite")
    return t[:gamma].contiguous()


def _load_sts(sts: Any, gamma: int) -> tuple[Tensor | None, Tensor | None]:
    """``(temperatures, biases)`` ``(γ,)`` float32 from an STS JSON path, its dict or a list of temperatures.

    ``biases`` (affine STS offsets, an extension of SGLang's format) is None when the file has none."""
    if sts is None:
        return None, None
    where = ""
    if isinstance(sts, (str, Path)):
        where = f" ({sts})"
        try:
            sts = json.loads(Path(sts).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"sts: cannot read STS JSON{where}: {e}") from e
        if not isinstance(sts, dict):
            raise ValueError(f"sts: the STS JSON{where} must be an object with a 'temperatures' list")
    biases = None
    if isinstance(sts, dict):
        if "temperatures" not in sts:
            raise ValueError(f"sts: no 'temperatures' list{where} (SGLang's STS JSON expected)")
        if sts.get("biases") is not None:
            biases = _sts_vector(sts["biases"], gamma, "biases")
        sts = sts["temperatures"]
    t = _sts_vector(sts, gamma, "temperatures")
    if bool((t <= 0).any()):
        raise ValueError("sts: temperatures must be finite and > 0")
    return t, biases


class DSparkDecoder:
    """Speculative generation with a DSpark drafter that keeps the target's output distribution exactly.

    Parameters
    ----------
    target : transformers.PreTrainedModel
        The causal LM to accelerate (its attention is switched to dspark's paged backend; :meth:`close`
        restores it).
    drafter : DSparkDrafter
        A drafter paired with ``target`` (checked before anything runs).
    planner : str or Planner
        ``"full"``, ``"threshold"``, ``"early_stop"`` (default) or ``"lagged_topk"``, or a ready Planner.
    sps_table : SpsTable, dict, path or None
        Target cost curve for the planner (missing: every draft is verified).
    sts : path, dict, sequence of float or None
        Per-position STS of the confidence head: SGLang's STS JSON (path or loaded dict; an optional
        ``"biases"`` list adds affine offsets, ``conf = sigmoid(logit / T + b)``) or a list of temperatures.
    block_size : int or None
        Drafts per round γ (default: the drafter's block size; at most that).
    page_size : int
        KV page size of the target's paged cache.
    max_batch_size : int
        Requests decoded together; further prompts wait and are admitted as requests finish.
    tokenizer : optional
        Needed for string prompts, chat messages, stop strings and decoded text.
    max_kv_pages : int or None
        Cap on the target's KV pool; when it runs out the newest request is preempted and resumed later.
    round_observer : callable or None
        Called with a :class:`RoundRecord` after every speculative round (calibration data collection); may be
        set or cleared later through the attribute of the same name.
    linear_max_rows : int or None
        Few-row fp32 linears on CPU compute ``(W · xᵀ)ᵀ`` (faster with MKL; see
        :class:`dspark.models.target.TargetAdapter`). ``None``: the adapter's default; ``0``: off.
    adaptive_slots : bool
        With a cost-driven plan (a confidence head and a planner mode other than ``full``), draft only as many
        slots as the previous round's plan used plus one: ``min(γ, max verify length)`` of that round (all γ in
        a generate call's first round). A plan that used every drafted slot widens the next round by one. The
        drafts of the first slots do not depend on how many are drafted, so this changes cost, not output
        distribution. Default on; False always drafts γ slots.
    """

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: DSparkDrafter,
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
    ) -> None:
        validate_pairing(drafter.config, target, tokenizer=tokenizer)
        gamma = drafter.config.block_size if block_size is None else int(block_size)
        if not 0 <= gamma <= drafter.config.block_size:
            raise ValueError(
                f"block_size: must be in [0, {drafter.config.block_size}] (the drafter's), got {gamma}"
            )
        if int(max_batch_size) < 1:
            raise ValueError(f"max_batch_size: must be >= 1, got {max_batch_size}")
        self.target = target
        self.drafter = drafter
        self.gamma = gamma
        self.tokenizer = tokenizer
        self.max_batch_size = int(max_batch_size)
        self.planner = (
            planner if isinstance(planner, Planner) else Planner(planner, sps_table, threshold, lag)
        )
        self.adapter = TargetAdapter(
            target, page_size=page_size, max_pages=max_kv_pages, linear_max_rows=linear_max_rows
        )
        sts_t, sts_b = _load_sts(sts, max(gamma, 1))  # on the device once, not copied every round
        self.sts = None if sts_t is None else sts_t.to(self.adapter.device)
        self.sts_bias = None if sts_b is None else sts_b.to(self.adapter.device)
        self.taps = list(drafter.config.target_layer_ids)  # -1: the embedding output (TargetAdapter taps it)
        self.stats = DSparkStats(gamma=gamma)
        self._offset = 0
        self.adaptive_slots = bool(adaptive_slots)
        self._slots = gamma  # slots the next round drafts when adaptive_slots applies
        self.max_positions = getattr(target.config, "max_position_embeddings", None)
        self.round_observer = round_observer
        self.host = HostReader()  # every device -> host read of a round goes through it (counted)

    # ------------------------------------------------------------------ public API
    def fits_context(self, prompt_len: int, max_new_tokens: int) -> bool:
        """Whether a prompt of ``prompt_len`` tokens leaves room for ``max_new_tokens`` and a last verify block
        within the target's ``max_position_embeddings`` (always True when the target declares none)."""
        return not self.max_positions or prompt_len + max_new_tokens + self.gamma + 1 <= self.max_positions

    def close(self) -> None:
        """Restore the target's attention implementation and free the KV caches."""
        self.adapter.close()

    def compile(self, **options: Any) -> DSparkDecoder:
        """``torch.compile`` the drafter's dense per-row work, in place; returns ``self``.

        Compiled (``nn.Module.compile``, so parameter names and checkpoints are unchanged): every draft layer's
        norms and MLP, the final norm, and the context projection ``fc`` + ``hidden_norm``. The attention over
        each request's context, Markov sampling and confidence are custom ops / ragged loops and stay eager.
        Shapes vary with the number of requests, so ``dynamic=True`` is the default. ``options`` go to
        ``torch.compile`` (e.g. ``mode="max-autotune"``). Outputs are unchanged up to float rounding.
        """
        opts = {"dynamic": True, **options}
        d = self.drafter
        for layer in d.layers:
            layer.input_layernorm.compile(**opts)
            layer.post_attention_layernorm.compile(**opts)
            layer.mlp.compile(**opts)
        for m in (d.norm, d.fc, d.hidden_norm):
            m.compile(**opts)
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
            Token ids (a list of ints or a 1-D tensor), a batch of token-id lists of different lengths, a string,
            a list of strings, chat messages (``[{"role": ..., "content": ...}, ...]``) or a list of those.
            Strings and messages go through the tokenizer's chat template (as a single user turn for strings).
        max_new_tokens, temperature, top_k, top_p, repetition_penalty, eos_token_id
            As in Hugging Face ``generate``; ``temperature`` 0 (default) is greedy. Values not given are taken
            from ``generation_config`` (then from the target's), with max_new_tokens defaulting to 128.
        stop : str or list of str
            Stop strings (need a tokenizer).
        seed : int
            Seed of the counter-based RNG: the same seed and prompts give the same output.
        stream : bool
            Return an iterator of :class:`StreamEvent` (committed tokens of each request as they come).
        speculative : bool
            False runs plain decoding through the same engine (γ = 0).
        """
        cfg = self._resolve_config(
            generation_config,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            repetition_penalty,
            eos_token_id,
            stop,
        )
        prompt_ids = self._encode_prompts(prompts)
        reqs = self._make_requests(prompt_ids, cfg)
        events = self._run(reqs, cfg, int(seed), speculative and self.gamma > 0)
        if stream:
            return events
        for _ in events:
            pass
        texts = None
        if self.tokenizer is not None:
            texts = [self.tokenizer.decode(r.generated, skip_special_tokens=True) for r in reqs]
        return GenerateOutput(
            sequences=[list(r.generated) for r in reqs],
            prompt_ids=[list(r.prompt) for r in reqs],
            texts=texts,
            finish_reasons=[r.stop.finish_reason or "length" for r in reqs],
            stats=self._last_stats,
        )

    # ------------------------------------------------------------------ inputs
    def _resolve_config(self, gc, max_new_tokens, temperature, top_k, top_p, repetition_penalty, eos, stop):
        gc = gc if gc is not None else getattr(self.target, "generation_config", None)

        def pick(value, name, default):
            if value is not None:
                return value
            v = getattr(gc, name, None) if gc is not None else None
            return default if v is None else v

        do_sample = getattr(gc, "do_sample", None) if gc is not None else None
        if temperature is None:
            temperature = pick(None, "temperature", 1.0) if do_sample else 0.0
        cfg = {
            "max_new_tokens": int(pick(max_new_tokens, "max_new_tokens", 128)),
            "temperature": float(temperature),
            "top_k": int(top_k)
            if top_k is not None
            else (int(getattr(gc, "top_k", 0) or 0) if do_sample else 0),
            "top_p": float(top_p)
            if top_p is not None
            else (float(getattr(gc, "top_p", 1.0) or 1.0) if do_sample else 1.0),
            "repetition_penalty": float(pick(repetition_penalty, "repetition_penalty", 1.0)),
            "stop": [stop] if isinstance(stop, str) else list(stop or pick(None, "stop_strings", []) or []),
        }
        if cfg["max_new_tokens"] < 1:
            raise ValueError(f"max_new_tokens: must be >= 1, got {cfg['max_new_tokens']}")
        if cfg["temperature"] < 0 or cfg["temperature"] != cfg["temperature"]:
            raise ValueError(f"temperature: must be >= 0, got {cfg['temperature']}")
        if not 0 < cfg["top_p"] <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {cfg['top_p']}")
        if cfg["repetition_penalty"] <= 0:
            raise ValueError(f"repetition_penalty: must be > 0, got {cfg['repetition_penalty']}")
        eos = pick(eos, "eos_token_id", None)
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        cfg["eos"] = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
        if cfg["stop"] and self.tokenizer is None:
            raise ValueError("stop: stop strings need the decoder's tokenizer")
        return cfg

    def _encode_prompts(self, prompts: Any) -> list[list[int]]:
        if isinstance(prompts, Tensor):
            prompts = prompts.tolist() if prompts.dim() == 2 else [prompts.tolist()]
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], dict)
        ):
            prompts = [prompts]
        elif isinstance(prompts, list) and prompts and isinstance(prompts[0], int):
            prompts = [prompts]
        if not isinstance(prompts, list) or not prompts:
            raise ValueError(
                "prompts: expected token ids, a list of token-id lists, strings or chat messages"
            )
        out = []
        for i, p in enumerate(prompts):
            if isinstance(p, Tensor):
                p = p.tolist()
            if isinstance(p, (str, list)) and (isinstance(p, str) or (p and isinstance(p[0], dict))):
                if self.tokenizer is None:
                    raise ValueError(f"prompts[{i}]: text or chat prompts need the decoder's tokenizer")
                p = chat_token_ids(self.tokenizer, p)
            p = [int(t) for t in p]
            if not p:
                raise ValueError(f"prompts[{i}]: the prompt is empty")
            V = self.drafter.config.vocab_size
            if min(p) < 0 or max(p) >= V:
                raise ValueError(f"prompts[{i}]: token ids must be in [0, {V})")
            out.append(p)
        return out

    def _make_requests(self, prompt_ids: list[list[int]], cfg: dict) -> list[_Request]:
        reqs = []
        for i, p in enumerate(prompt_ids):
            if not self.fits_context(len(p), cfg["max_new_tokens"]):
                raise ValueError(
                    f"prompts[{i}]: {len(p)} prompt tokens + max_new_tokens {cfg['max_new_tokens']} exceed the "
                    f"target's context of {self.max_positions} positions"
                )
            stop = StopCriteria(cfg["max_new_tokens"], cfg["eos"], cfg["stop"], self.tokenizer)
            stream = TextStream(self.tokenizer) if self.tokenizer is not None else None
            # the request id keys the request's caches and its random stream: the i-th prompt of every call
            # draws the same numbers for the same seed, whatever else is in the batch
            reqs.append(_Request(i, i, p, stop, stream))
        return reqs

    # ------------------------------------------------------------------ the engine
    def _run(self, reqs: list[_Request], cfg: dict, seed: int, speculative: bool) -> Iterator[StreamEvent]:
        stats = DSparkStats(gamma=self.gamma)
        self._last_stats = stats
        waiting = deque(reqs)
        active: list[_Request] = []
        t_start = time.perf_counter()
        self.planner.reset()
        self._offset = 0
        self._slots = self.gamma
        try:
            while waiting or active:
                while waiting and len(active) < self.max_batch_size:
                    active.append(waiting.popleft())
                fresh = [r for r in active if not r.started]
                if fresh:
                    self._with_preemption(lambda f=fresh: self._prefill(f, cfg, seed, stats), active, waiting)
                else:
                    self._with_preemption(
                        lambda a=active: self._round(a, cfg, seed, speculative, stats), active, waiting
                    )
                for r in active:
                    yield from r.events
                    r.events.clear()
                    if r.stop.finished:
                        self._release(r)
                active = [r for r in active if not r.stop.finished]
        finally:
            for r in active:
                self._release(r)
            stats.wall_seconds = time.perf_counter() - t_start
            self.stats.merge(stats)

    def _with_preemption(self, step, active: list[_Request], waiting: deque) -> None:
        while True:
            try:
                step()
                return
            except KVPoolExhausted:
                running = [r for r in active if r.started]
                if len(running) <= 1:
                    raise
                victim = running[-1]  # the newest: it resumes from its committed tokens later
                self._release(victim)
                victim.started = False
                active.remove(victim)
                waiting.appendleft(victim)

    def _release(self, r: _Request) -> None:
        if r.rid in self.adapter.pool:
            self.adapter.finish(r.rid)
        self.drafter.finish(r.rid)

    def _features(self, out, rows: Tensor) -> Tensor:
        rows = to_device(rows, out.hidden[self.taps[0]].device)  # a CPU index would copy (and sync) per layer
        return torch.cat([out.hidden[layer][rows] for layer in self.taps], -1)

    def _sample_params(self, rs: list[_Request], cfg: dict, dev) -> dict:
        R = len(rs)
        kw: dict[str, Any] = {}
        if cfg["top_k"] > 0:
            kw["top_k"] = torch.full((R,), cfg["top_k"], dtype=torch.int64, device=dev)
        if cfg["top_p"] < 1.0:
            kw["top_p"] = torch.full((R,), cfg["top_p"], dtype=torch.float32, device=dev)
        if cfg["repetition_penalty"] != 1.0:
            seqs = [r.prompt + r.generated for r in rs]
            kw["repetition_penalty"] = torch.full(
                (R,), cfg["repetition_penalty"], dtype=torch.float32, device=dev
            )
            kw["penalty_tokens"] = to_device([t for s in seqs for t in s], dev, torch.int64)
            ptr = [0]
            for s in seqs:
                ptr.append(ptr[-1] + len(s))
            kw["penalty_indptr"] = to_device(ptr, dev, torch.int64)
        return kw

    def _accept(self, logits, qo, q, tokens, verify_len, rs, cfg, seed) -> tuple[Tensor, Tensor, Tensor]:
        """Rejection sampling; ``(accepted, out_tokens, logits_finite)``, all on the device (nothing read)."""
        dev = logits.device
        R = len(rs)
        temp = torch.full((R,), cfg["temperature"], dtype=torch.float32, device=dev)
        rids = to_device([r.rid for r in rs], dev, torch.int64)
        offset = self._offset
        self._offset += 1
        logits = logits.float()
        finite = all_finite(logits)
        # NaN/inf rows would make the sampler's output meaningless; they are replaced here so it runs safely and
        # the round is failed on the host (before anything is committed) from the ``finite`` flag
        logits = sanitized(logits, finite)
        accepted, out_tokens = rejection_sample(
            logits,
            to_device(qo, dev, torch.int32),
            q,
            tokens,
            to_device(verify_len, dev, torch.int32),
            temp,
            seed,
            offset,
            rids,
            **self._sample_params(rs, cfg, dev),
        )
        return accepted, out_tokens, finite

    def _prefill(self, rs: list[_Request], cfg: dict, seed: int, stats: DSparkStats) -> None:
        """Put prompts (and, for preempted requests, their committed tokens) in the caches; draw first tokens."""
        batch = []
        for r in rs:
            self.adapter.add_request(r.rid)
            toks = r.prompt + r.generated[:-1]
            batch.append((r.rid, toks, "last"))
        t0 = time.perf_counter()
        out = self.adapter.forward(batch, layers=self.taps)
        stats.add_time("verify", time.perf_counter() - t0)
        feats = self._features(out, torch.arange(out.qo_indptr[-1]))
        sizes = [out.qo_indptr[i + 1] - out.qo_indptr[i] for i in range(len(rs))]
        self.drafter.append_context([r.rid for r in rs], list(feats.split(sizes)), positions=[0] * len(rs))
        for r in rs:
            r.started = True
        idx = [i for i, r in enumerate(rs) if not r.generated]
        new = [rs[i] for i in idx]
        if new:
            logits = torch.cat([out.request_logits(i) for i in idx])
            V = logits.shape[-1]
            dummy_q = torch.zeros(len(new), 1, V, dtype=torch.float32, device=logits.device)
            dummy_x = torch.zeros(len(new), 1, dtype=torch.int64, device=logits.device)
            vl = torch.ones(len(new), dtype=torch.int32)
            _, out_tokens, finite = self._accept(
                logits, list(range(len(new) + 1)), dummy_q, dummy_x, vl, new, cfg, seed
            )
            out_tokens, finite = self.host.fetch(out_tokens[:, 0], finite)
            if not bool(finite):
                raise RuntimeError("target verify: the target produced NaN/inf logits")
            for j, r in enumerate(new):
                self._commit(r, [int(out_tokens[j])])
        for r in rs:
            if r.generated and not r.stop.finished:
                r.anchor = r.generated[-1]

    def _commit(self, r: _Request, tokens: list[int]) -> list[int]:
        kept = r.stop.commit(tokens)
        text = r.stream.push(kept, final=r.stop.finished) if r.stream is not None else None
        r.events.append(StreamEvent(r.index, kept, text, r.stop.finished, r.stop.finish_reason))
        return kept

    def _round(self, rs: list[_Request], cfg: dict, seed: int, speculative: bool, stats: DSparkStats) -> None:
        """draft -> Markov sampling -> plan -> one ragged verify -> rejection sampling -> commit.

        Host reads: one per round (accepted counts and tokens, NaN flags, survival for the stats), plus one for
        the plan when a planner mode other than ``full`` decides the verify lengths (they shape the target's
        packed batch). Draft tokens go to the target without passing through the host.
        """
        rs = [r for r in rs if r.started and not r.stop.finished]
        if not rs:
            return
        R, g = len(rs), self.gamma
        dev = self.adapter.device
        anchors = torch.tensor([r.anchor for r in rs], dtype=torch.int64)
        survival = conf_logit = None
        q_finite = None
        t0 = time.perf_counter()
        if speculative:
            adaptive = (
                self.adaptive_slots
                and self.drafter.confidence_head is not None
                and self.planner.effective_mode != "full"
            )
            g = self._slots if adaptive else g
            d = self.drafter.draft(
                [r.rid for r in rs],
                anchors,
                cfg["temperature"],
                seed,
                self._offset,
                None if self.sts is None else self.sts[:g],
                sts_bias=None if self.sts_bias is None else self.sts_bias[:g],
                num_positions=g,  # a shorter γ than the drafter's block skips the unused slots' sampling
            )
            self._offset += 1
            V = self.drafter.config.vocab_size
            q = d.draft_logits.float()  # [R, g, V]: the drafter drafted g slots
            # the NaN/inf flag is read with the round's results; q is sanitised so the round can run
            q_finite = all_finite(q)
            q = sanitized(q, q_finite).contiguous()
            drafts = d.tokens.clamp(0, V - 1)
            t1 = time.perf_counter()
            stats.add_time("markov_sample", d.markov_seconds)
            stats.add_time("draft", t1 - t0 - d.markov_seconds)
            full = torch.full((R,), g + 1, dtype=torch.int32)
            if d.survival is not None:
                survival = d.survival.contiguous()
                conf_logit = d.conf_logit
                plan = self.planner.plan(survival, [r.rid for r in rs])
                if plan.mode == "full":  # every draft is verified: nothing to read
                    verify_len, budget = full, R * g
                else:
                    verify_len, budget_t = self.host.fetch(plan.verify_len, plan.budget)
                    budget = int(budget_t)
                    if adaptive:  # next round: one slot past the most this plan verified, at most γ
                        self._slots = min(self.gamma, int(verify_len.max()))
            else:  # no confidence head (DFlash): nothing to plan with
                verify_len, budget = full, R * g
            t0 = time.perf_counter()
            stats.add_time("plan", t0 - t1)
            # [R, 1 + γ] on the device
            rows = torch.cat([to_device(anchors, drafts.device)[:, None], drafts], 1)
        else:
            V = self.drafter.config.vocab_size
            drafts = torch.zeros(R, 1, dtype=torch.int64, device=dev)
            q = torch.zeros(R, 1, V, dtype=torch.float32, device=dev)
            verify_len, budget = torch.ones(R, dtype=torch.int32), 0
            rows = anchors[:, None]
        lens = verify_len.tolist()  # a CPU tensor here
        batch = [(r.rid, rows[i, : lens[i]], "all") for i, r in enumerate(rs)]
        out = self.adapter.forward(batch, layers=self.taps)
        t1 = time.perf_counter()
        stats.add_time("verify", t1 - t0)
        accepted, out_tokens, l_finite = self._accept(
            out.logits, out.qo_indptr, q, drafts, verify_len, rs, cfg, seed
        )
        acc_h, tokens_h, l_ok, q_ok, surv_h = self.host.fetch(
            accepted, out_tokens, l_finite, q_finite, survival
        )
        if q_ok is not None and not bool(q_ok):
            raise RuntimeError("draft: the drafter produced NaN/inf logits")
        if not bool(l_ok):
            raise RuntimeError("target verify: the target produced NaN/inf logits")
        t0 = time.perf_counter()
        stats.add_time("accept", t0 - t1)
        if speculative and self.round_observer is not None:
            self.round_observer(
                RoundRecord(
                    [r.index for r in rs],
                    conf_logit,
                    drafts,
                    q,
                    out.logits,
                    list(out.qo_indptr),
                    verify_len,
                    accepted,
                    cfg["temperature"],
                )
            )
            t0 = time.perf_counter()  # the observer's time is not the commit's
        acc = acc_h.tolist()
        emitted_rows = tokens_h.tolist()
        emitted, cont_ids, cont_rows = [], [], []
        for i, r in enumerate(rs):
            a = acc[i]
            committed_len = self.adapter.length(r.rid) - lens[i] + 1 + a  # anchor + accepted drafts
            self.adapter.truncate(r.rid, committed_len)
            kept = self._commit(r, emitted_rows[i][: a + 1])
            emitted.append(len(kept))
            if not r.stop.finished:
                cont_ids.append(r.rid)
                cont_rows.append((out.qo_indptr[i], a + 1))
                r.anchor = kept[-1]
        if cont_ids:  # one batched append of the committed rows' target features
            feats = self._features(out, torch.cat([torch.arange(s, s + n) for s, n in cont_rows]))
            self.drafter.append_context(cont_ids, list(feats.split([n for _, n in cont_rows])))
        stats.record_round(lens, acc, emitted, surv_h.tolist() if surv_h is not None else None, budget)
        stats.add_time("commit", time.perf_counter() - t0)
