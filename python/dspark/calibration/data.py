# SPDX-License-Identifier: Apache-2.0
"""Uncensored calibration data: raw confidence logits and acceptance labels of every draft position.

:func:`collect_calibration_data` generates with the ``full`` planner, so the target scores every draft of every
round and the label of each position is known whether or not an earlier draft was rejected. Per round and
request it records the raw confidence logits ``c_k`` and, for each draft position ``k``:

* ``accept_prob[k] = Σ_v min(p_k(v), q_k(v))`` with ``p_k = softmax(target logits / T)`` at the target row that
  scores draft ``k`` (given the drafted prefix) and ``q_k = softmax(draft logits / T)``: the probability that the
  rejection sampler accepts draft ``k`` once its prefix is accepted (one minus the total variation distance);
* ``greedy_match[k] = 1[x_k == argmax p_k]`` (SGLang's label);
* ``accepted``: how many drafts the rejection sampler really accepted in that round (the realised prefix).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dspark.decoding.decoder import DSparkDecoder, RoundRecord
from dspark.decoding.inputs import encode_prompts
from dspark.decoding.planner import Planner

LABELS = ("prob", "greedy")


def accept_prob_labels(target_logits: Tensor, draft_logits: Tensor, temperature: float) -> Tensor:
    """``Σ_v min(p(v), q(v))`` row by row, ``p = softmax(target_logits / T)``, ``q = softmax(draft_logits / T)``.

    Parameters
    ----------
    target_logits, draft_logits : Tensor
        ``(..., V)`` logits of the same shape.
    temperature : float
        > 0 (at temperature 0 the acceptance label is the greedy match; see :func:`greedy_match_labels`).

    Returns
    -------
    Tensor
        ``(...)`` float32 in ``[0, 1]``.
    """
    if target_logits.shape != draft_logits.shape:
        raise ValueError(
            f"draft_logits: shape {tuple(draft_logits.shape)} does not match target_logits "
            f"{tuple(target_logits.shape)}"
        )
    if not float(temperature) > 0:
        raise ValueError(f"temperature: must be > 0 for probability labels, got {temperature}")
    p = torch.softmax(target_logits.double() / temperature, -1)
    q = torch.softmax(draft_logits.double() / temperature, -1)
    return torch.minimum(p, q).sum(-1).clamp_(0.0, 1.0).float()


def greedy_match_labels(target_logits: Tensor, draft_tokens: Tensor) -> Tensor:
    """``1[draft_tokens == argmax target_logits]`` as float32 (``target_logits`` is ``draft_tokens.shape + (V,)``)."""
    if target_logits.shape[:-1] != draft_tokens.shape:
        raise ValueError(
            f"draft_tokens: shape {tuple(draft_tokens.shape)} does not match target_logits rows "
            f"{tuple(target_logits.shape[:-1])}"
        )
    return (target_logits.argmax(-1) == draft_tokens.to(target_logits.device)).float()


@dataclass
class CalibrationData:
    """Per (round, request) rows of raw confidence logits and acceptance labels, ``N`` rows of ``γ`` positions.

    Attributes
    ----------
    conf_logit : Tensor
        ``(N, γ)`` float32 raw confidence logits (before STS).
    accept_prob : Tensor
        ``(N, γ)`` float32 ``Σ min(p_k, q_k)`` (equal to ``greedy_match`` at temperature 0).
    greedy_match : Tensor
        ``(N, γ)`` float32 0/1 greedy-match labels.
    accepted : Tensor
        ``(N,)`` int64 drafts the rejection sampler accepted in that round.
    request_ids : Tensor
        ``(N,)`` int64 index of the prompt each row came from.
    label : str
        ``"prob"`` or ``"greedy"``: which per-position label the fit uses.
    temperature : float
        Sampling temperature of the collection run.
    meta : dict
        Free-form provenance (``dataset``, ``num_prompts``, ...), saved with the data.
    prompt_ids, sequences : list of list of int, optional
        The prompt token ids and generated token ids of each request (index = request id), kept by
        :func:`collect_calibration_data` for the lookup prior; not saved to files (``None`` after ``load``).
    """

    conf_logit: Tensor
    accept_prob: Tensor
    greedy_match: Tensor
    accepted: Tensor
    request_ids: Tensor
    label: str = "prob"
    temperature: float = 1.0
    meta: dict[str, Any] = field(default_factory=dict)
    prompt_ids: list[list[int]] | None = None
    sequences: list[list[int]] | None = None

    def __post_init__(self) -> None:
        if self.label not in LABELS:
            raise ValueError(f"label: must be one of {LABELS}, got {self.label!r}")
        c = self.conf_logit
        if not isinstance(c, Tensor) or c.dim() != 2:
            raise ValueError(f"conf_logit: expected an [N, gamma] tensor, got {getattr(c, 'shape', type(c))}")
        N, g = c.shape
        for name in ("accept_prob", "greedy_match"):
            t = getattr(self, name)
            if not isinstance(t, Tensor) or tuple(t.shape) != (N, g):
                raise ValueError(f"{name}: expected shape {(N, g)}, got {tuple(getattr(t, 'shape', ()))}")
            if not bool(torch.isfinite(t).all()) or bool(((t < 0) | (t > 1)).any()):
                raise ValueError(f"{name}: values must be finite and in [0, 1]")
        for name in ("accepted", "request_ids"):
            t = getattr(self, name)
            if not isinstance(t, Tensor) or tuple(t.shape) != (N,):
                raise ValueError(f"{name}: expected shape {(N,)}, got {tuple(getattr(t, 'shape', ()))}")
        if not bool(torch.isfinite(c).all()):
            raise ValueError("conf_logit: contains NaN or inf")
        if bool(((self.accepted < 0) | (self.accepted > g)).any()):
            raise ValueError(f"accepted: counts must be in [0, {g}]")

    @property
    def num_samples(self) -> int:
        """Number of (round, request) rows ``N``."""
        return int(self.conf_logit.shape[0])

    @property
    def gamma(self) -> int:
        """Draft positions per row."""
        return int(self.conf_logit.shape[1])

    def labels(self) -> Tensor:
        """``(N, γ)`` per-position label of the chosen kind (conditional on the prefix being accepted)."""
        return self.accept_prob if self.label == "prob" else self.greedy_match

    def cumulative_labels(self) -> Tensor:
        """``(N, γ)`` cumulative label ``Π_{i≤k} label_i``: probability (or event) that drafts ``1..k`` pass."""
        return torch.cumprod(self.labels().double(), 1).float()

    def accept_events(self) -> Tensor:
        """``(N, γ)`` bool realised prefix events ``k < accepted`` (drafts ``1..k+1`` were accepted)."""
        return torch.arange(self.gamma).view(1, -1) < self.accepted.view(-1, 1)

    def binary_outcome(self) -> Tensor:
        """``(N, γ)`` bool outcome of the AUROC: the cumulative greedy match for ``label="greedy"``, the realised
        prefix-accept events for ``label="prob"`` (the events whose conditional mean the probability labels are).
        """
        if self.label == "greedy":
            return torch.cumprod(self.greedy_match, 1) > 0.5
        return self.accept_events()

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> None:
        """Write to ``path``: ``.npz`` (numpy arrays + JSON metadata) or anything else as a torch ``.pt`` file."""
        path = Path(path)
        tensors = {
            "conf_logit": self.conf_logit,
            "accept_prob": self.accept_prob,
            "greedy_match": self.greedy_match,
            "accepted": self.accepted,
            "request_ids": self.request_ids,
        }
        info = {"label": self.label, "temperature": self.temperature, "meta": self.meta}
        if path.suffix == ".npz":
            arrays = {k: v.cpu().numpy() for k, v in tensors.items()}
            np.savez(path, info=np.array(json.dumps(info)), **arrays)
        else:
            torch.save({**{k: v.cpu() for k, v in tensors.items()}, **info}, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> CalibrationData:
        """Read a file written by :meth:`save` (``.npz`` or ``.pt``)."""
        path = Path(path)
        try:
            if path.suffix == ".npz":
                with np.load(path, allow_pickle=False) as z:
                    d: dict[str, Any] = {k: torch.from_numpy(z[k].copy()) for k in z.files if k != "info"}
                    d.update(json.loads(str(z["info"])))
            else:
                d = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise ValueError(f"path: cannot read calibration data {path}: {e}") from e
        keys = ("conf_logit", "accept_prob", "greedy_match", "accepted", "request_ids")
        missing = [k for k in keys if k not in d]
        if missing:
            raise ValueError(f"path: {path} lacks {missing}")
        return cls(
            **{k: d[k] for k in keys},
            label=str(d.get("label", "prob")),
            temperature=float(d.get("temperature", 1.0)),
            meta=dict(d.get("meta", {})),
        )

    @classmethod
    def concatenate(cls, parts: Sequence[CalibrationData]) -> CalibrationData:
        """Rows of several collections with the same γ, label and temperature (metadata of the first)."""
        if not parts:
            raise ValueError("parts: nothing to concatenate")
        first = parts[0]
        for p in parts[1:]:
            if (p.gamma, p.label, p.temperature) != (first.gamma, first.label, first.temperature):
                raise ValueError("parts: gamma, label and temperature must agree")
        cat = {
            k: torch.cat([getattr(p, k) for p in parts])
            for k in ("conf_logit", "accept_prob", "greedy_match", "accepted", "request_ids")
        }
        return cls(**cat, label=first.label, temperature=first.temperature, meta=dict(first.meta))


class _Collector:
    """Round observer turning each :class:`RoundRecord` into label rows (keeps no vocabulary-sized tensors)."""

    def __init__(self, gamma: int, chained: Callable[[RoundRecord], None] | None) -> None:
        self.gamma = gamma
        self.chained = chained
        self.rows: dict[str, list[Tensor]] = {
            k: [] for k in ("conf_logit", "accept_prob", "greedy_match", "accepted", "request_ids")
        }

    def __call__(self, rec: RoundRecord) -> None:
        if self.chained is not None:
            self.chained(rec)
        if rec.conf_logit is None:
            raise ValueError("drafter: calibration needs a drafter with a confidence head")
        if rec.lookup_rows is not None:  # its rows may verify lookup drafts, not the drafter's
            raise RuntimeError("calibration: run the decoder without lookup (lookup=False)")
        R, g = rec.draft_tokens.shape
        vl = rec.verify_len.tolist()
        if any(v != g + 1 for v in vl):  # a shorter verify would censor the labels of the unverified drafts
            raise RuntimeError(
                f"calibration: every draft must be verified (planner 'full'), got verify_len {vl}"
            )
        # row k of request r scores draft k given the drafted prefix: rows qo[r] .. qo[r] + g - 1
        rows = torch.tensor(rec.qo_indptr[:-1], dtype=torch.int64).view(R, 1) + torch.arange(g).view(1, g)
        p_logits = rec.target_logits[rows.to(rec.target_logits.device)].float()  # [R, g, V]
        greedy = greedy_match_labels(p_logits, rec.draft_tokens)
        if rec.temperature > 0:
            prob = accept_prob_labels(p_logits, rec.draft_logits, rec.temperature)
        else:  # both distributions are one-hot: Σ min(p, q) is the greedy match
            prob = greedy
        self.rows["conf_logit"].append(rec.conf_logit.detach().float().cpu())
        self.rows["accept_prob"].append(prob.cpu())
        self.rows["greedy_match"].append(greedy.cpu())
        self.rows["accepted"].append(rec.accepted.detach().to("cpu", torch.int64))
        self.rows["request_ids"].append(torch.tensor(rec.request_ids, dtype=torch.int64))

    def data(self, label: str, temperature: float, meta: dict[str, Any], **outputs: Any) -> CalibrationData:
        if not self.rows["conf_logit"]:
            raise ValueError("prompts: generation produced no speculative round (raise max_new_tokens)")
        cat = {k: torch.cat(v) for k, v in self.rows.items()}
        return CalibrationData(**cat, label=label, temperature=temperature, meta=meta, **outputs)


def collect_calibration_data(
    decoder: DSparkDecoder,
    prompts: Any,
    *,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    label: str = "prob",
    seed: int = 0,
    progress: bool = False,
    meta: dict[str, Any] | None = None,
) -> CalibrationData:
    """Generate from ``prompts`` verifying every draft, and record confidence logits and labels of each round.

    The decoder's planner is switched to ``full`` for the run (and restored afterwards), so no label is
    censored by an earlier rejection; sampling uses ``temperature`` alone (no top-k / top-p / repetition
    penalty), so ``p`` is ``softmax(target logits / T)``. STS temperatures of the decoder do not matter: the raw
    logits are recorded.

    Parameters
    ----------
    decoder : DSparkDecoder
        A decoder whose drafter has a confidence head.
    prompts
        Anything :meth:`DSparkDecoder.generate` accepts as a batch (strings need the decoder's tokenizer).
    max_new_tokens : int
        Tokens generated per prompt.
    temperature : float
        Sampling temperature of drafter and target; 0 is greedy (the label is then the greedy match).
    label : str
        ``"prob"`` (``Σ min(p, q)``, the default) or ``"greedy"`` (argmax match): the label the fit uses.
        Both are always recorded.
    seed : int
        Seed of the decoder's random streams.
    progress : bool
        Show a progress bar over prompts.
    meta : dict, optional
        Provenance stored with the data (e.g. ``{"dataset": "mt-bench.jsonl"}``).

    Returns
    -------
    CalibrationData
        With ``prompt_ids`` and ``sequences`` (the generated tokens) of every prompt, in prompt order.
    """
    if label not in LABELS:
        raise ValueError(f"label: must be one of {LABELS}, got {label!r}")
    if not float(temperature) >= 0:
        raise ValueError(f"temperature: must be >= 0, got {temperature}")
    if decoder.drafter.confidence_head is None:
        raise ValueError("decoder: its drafter has no confidence head; there is nothing to calibrate")
    if decoder.gamma < 1:
        raise ValueError("decoder: block_size is 0; there are no drafts to calibrate")
    if float(temperature) == 0.0:
        label = "greedy"
    if isinstance(prompts, (str, Tensor)) or (
        isinstance(prompts, list) and prompts and isinstance(prompts[0], (int, dict))
    ):
        prompts = [prompts]
    # token ids once, as the decoder would encode them: the prompts are kept with the outputs
    prompt_ids = encode_prompts(prompts, decoder.tokenizer, decoder.vocab_size)
    n = len(prompt_ids)
    generated: list[list[int]] = [[] for _ in range(n)]
    collector = _Collector(decoder.gamma, decoder.round_observer)
    saved_planner, saved_observer = decoder.planner, decoder.round_observer
    decoder.planner, decoder.round_observer = Planner("full"), collector
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc="calibration prompts", unit="prompt")
    try:
        events = decoder.generate(
            prompt_ids,
            max_new_tokens=max_new_tokens,
            temperature=float(temperature),
            top_k=0,
            top_p=1.0,
            repetition_penalty=1.0,
            seed=seed,
            stream=True,
        )
        for ev in events:
            generated[ev.index].extend(ev.tokens)
            if ev.finished and bar is not None:
                bar.update(1)
                bar.set_postfix(rows=sum(len(x) for x in collector.rows["accepted"]), refresh=False)
    finally:
        decoder.planner, decoder.round_observer = saved_planner, saved_observer
        if bar is not None:
            bar.close()
    info = {"num_prompts": n, "max_new_tokens": int(max_new_tokens), "seed": int(seed), **(meta or {})}
    return collector.data(label, float(temperature), info, prompt_ids=prompt_ids, sequences=generated)
