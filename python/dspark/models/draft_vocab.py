# SPDX-License-Identifier: Apache-2.0
"""Draft vocabularies: let the drafter propose only the most frequent tokens (docs/drafter.md).

A drafter's two vocabulary-sized steps — the LM head ``U = h · Wᵀ`` and the Markov bias ``W2 · W1[x]`` — read a
``[V, H]`` and a ``[V, r]`` table for every drafted row, and on a CPU they are most of a draft round. With a
draft vocabulary of ``V'`` token ids both read only ``V'`` rows: ``q`` is the softmax over those tokens and is 0
elsewhere. Exactness is untouched (the verifier is given exactly that ``q``: ``-1e30`` outside the subset, so
``exp`` underflows to 0), only a token outside the subset can no longer be drafted.

The file ``draft_vocab.json`` in a drafter's folder holds ``{"token_ids": [...], ...}`` (sorted, distinct ids of
the target's vocabulary) plus free-form metadata about how it was chosen.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

DRAFT_VOCAB_FILE = "draft_vocab.json"
# a finite "minus infinity" for the logits of tokens outside the draft vocabulary: softmax gives them exactly 0,
# and the verifier's NaN/inf checks stay meaningful
OUTSIDE_LOGIT = -1.0e30


def outside_logit(dtype: torch.dtype) -> float:
    """``OUTSIDE_LOGIT``, or half the most negative finite value where that is closer to 0 (float16)."""
    return max(OUTSIDE_LOGIT, torch.finfo(dtype).min / 2)


def draft_vocab_option(text: str) -> bool | str | None:
    """A command line's ``--draft-vocab`` as ``from_pretrained(draft_vocab=...)`` takes it: ``auto`` -> True (the
    drafter folder's file, if any), ``none`` -> None (the whole vocabulary), anything else -> that file's path."""
    return {"auto": True, "none": None}.get(text, text)


def add_draft_vocab_argument(parser) -> None:
    """``--draft-vocab`` (read it with :func:`draft_vocab_option`)."""
    parser.add_argument(
        "--draft-vocab",
        default="auto",
        help="draft_vocab.json to draft from ('auto': the drafter folder's, if any; 'none': the whole vocabulary)",
    )


def resolve_draft_vocab(
    option: bool | str | os.PathLike | Tensor | Sequence[int] | None,
    folder: str | os.PathLike | None,
    vocab_size: int,
) -> Tensor | Sequence[int] | None:
    """``from_pretrained``'s ``draft_vocab`` argument as ids (None: the whole vocabulary).

    True: ``folder``'s ``draft_vocab.json`` if it has one; False / None: none; a path: that file; ids: those.
    """
    if option is True:
        has = folder is not None and (Path(folder) / DRAFT_VOCAB_FILE).is_file()
        return load_draft_vocab(folder, vocab_size) if has else None
    if option is None or option is False:
        return None
    if isinstance(option, (str, os.PathLike)):
        return load_draft_vocab(option, vocab_size)
    return option


def check_draft_vocab(token_ids: Tensor | Sequence[int], vocab_size: int, where: str = "token_ids") -> Tensor:
    """Validate a draft vocabulary; returns it as a sorted int64 CPU tensor.

    Raises
    ------
    ValueError
        Empty, not 1-D integers, ids outside ``[0, vocab_size)``, or duplicates (naming ``where``).
    """
    t = token_ids if isinstance(token_ids, Tensor) else torch.as_tensor(list(token_ids))
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(f"{where}: expected a non-empty 1-D list of token ids, got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{where}: expected integer token ids, got {t.dtype}")
    t = t.detach().to("cpu", torch.int64)
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{where}: token ids must be in [0, {vocab_size}), got [{lo}, {hi}]")
    s = torch.sort(t).values
    if s.numel() > 1 and bool((s[1:] == s[:-1]).any()):
        raise ValueError(f"{where}: token ids must be distinct")
    return s


def top_tokens(counts: Tensor, size: int, always: Iterable[int] = ()) -> Tensor:
    """The ``size`` most frequent token ids (sorted), ``always`` included first (e.g. end-of-turn tokens).

    Parameters
    ----------
    counts : Tensor
        ``(V,)`` occurrence counts per token id.
    size : int
        Number of ids to keep, in ``[1, V]``.
    always : iterable of int
        Ids kept whatever their count.
    """
    V = counts.numel()
    if not 1 <= size <= V:
        raise ValueError(f"size: must be in [1, {V}], got {size}")
    forced = sorted({int(i) for i in always})
    if len(forced) > size:
        raise ValueError(f"always: {len(forced)} forced ids do not fit in size {size}")
    if forced and not 0 <= forced[0] <= forced[-1] < V:
        raise ValueError(f"always: ids must be in [0, {V}), got {forced}")
    score = counts.to(torch.float64).clone()
    score[torch.as_tensor(forced, dtype=torch.int64)] = float("inf")
    # stable: equal counts keep the lower id, so the result does not depend on the sort's tie order
    order = torch.sort(score, descending=True, stable=True).indices
    return torch.sort(order[:size]).values


def count_tokens(token_lists: Iterable[Sequence[int]], vocab_size: int) -> Tensor:
    """``(V,)`` int64 occurrence counts over token-id lists (ids outside ``[0, V)`` are not counted)."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for ids in token_lists:
        if len(ids):
            t = torch.as_tensor(list(ids), dtype=torch.int64)
            t = t[(t >= 0) & (t < vocab_size)]
            counts += torch.bincount(t, minlength=vocab_size)
    return counts


def coverage(token_ids: Tensor, counts: Tensor) -> float:
    """Fraction of the counted tokens that fall inside the draft vocabulary."""
    total = int(counts.sum())
    return float(counts[token_ids].sum()) / total if total else 0.0


def save_draft_vocab(folder: str | os.PathLike, token_ids: Tensor, meta: Mapping | None = None) -> Path:
    """Write ``draft_vocab.json`` into a drafter folder (returns its path)."""
    path = Path(folder) / DRAFT_VOCAB_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"token_ids": [int(i) for i in token_ids.tolist()], **dict(meta or {})}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(body) + "\n")
    os.replace(tmp, path)
    return path


def load_draft_vocab(path: str | os.PathLike, vocab_size: int) -> Tensor:
    """Read and validate a ``draft_vocab.json`` (a file, or a drafter folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / DRAFT_VOCAB_FILE
    if not p.is_file():
        raise FileNotFoundError(f"draft vocabulary: no file {p}")
    try:
        body = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"draft vocabulary {p}: not readable JSON ({e})") from e
    if not isinstance(body, dict) or not isinstance(body.get("token_ids"), list):
        raise ValueError(f'draft vocabulary {p}: expected an object with a "token_ids" list')
    ids = body["token_ids"]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"draft vocabulary {p}: token_ids must be integers")
    return check_draft_vocab(ids, vocab_size, where=f"draft vocabulary {p}: token_ids")


def expand_to_vocab(x: Tensor, token_ids: Tensor, vocab_size: int) -> Tensor:
    """``(..., V')`` logits over the draft vocabulary -> ``(..., V)`` with :func:`outside_logit` outside it."""
    out = torch.full((*x.shape[:-1], vocab_size), outside_logit(x.dtype), dtype=x.dtype, device=x.device)
    out.index_copy_(-1, token_ids.to(x.device), x)
    return out


class DraftVocabTables:
    """A draft vocabulary's gathered tables for one state of a drafter's weights (built by ``DSparkDrafter``).

    ``token_ids`` ``(V',)`` int64 on the drafter's device and ``lm_head`` ``(V', H)``: the LM head's rows of those
    ids, so ``U = h · lm_headᵀ`` is ``(…, V')``. For the fused ``markov_sample`` op, which indexes ``W1`` by the
    token it drew one slot earlier and by the anchor at the first slot, :meth:`markov_inputs` lays out tables in
    draft order with one spare row per request: row ``V' + i`` holds request i's anchor row of ``W1`` (and zeros
    in ``W2``), anchor i becomes ``V' + i``, and the spare logit columns hold :func:`outside_logit` so they are never
    drawn. The op then does the full-vocabulary arithmetic restricted to the draft rows.
    """

    def __init__(self, token_ids: Tensor, lm_head: Tensor, w1: Tensor | None, w2: Tensor | None) -> None:
        self.token_ids = token_ids.to(lm_head.device)
        self.size = int(token_ids.numel())
        self.lm_head = lm_head.index_select(0, self.token_ids).contiguous()
        self._w1_rows = None if w1 is None else w1.index_select(0, self.token_ids)
        self._w2_rows = None if w2 is None else w2.index_select(0, self.token_ids)
        self._w1_buf = self._w2_buf = None  # (V' + capacity, r), grown on demand

    def check_logits(self, base_logits: Tensor) -> Tensor:
        """The draft ids on the logits' device, after checking the logits are ``(R, γ, V')``."""
        if base_logits.dim() != 3 or base_logits.shape[-1] != self.size:
            raise ValueError(
                f"base_logits: expected (R, gamma, {self.size}) over the draft vocabulary, "
                f"got {tuple(base_logits.shape)}"
            )
        return self.token_ids

    def reserve(self, requests: int) -> None:
        """Spare rows for ``requests`` anchors in the tables :meth:`markov_inputs` returns (grown on demand
        otherwise, at least doubling; growing reallocates them: :attr:`buffers_key` changes)."""
        if self._w1_rows is None or self._w2_rows is None:
            return
        Vd, r = self._w1_rows.shape
        if self._w1_buf is None or self._w1_buf.shape[0] < Vd + requests:
            cap = max(requests, 8 if self._w1_buf is None else 2 * (self._w1_buf.shape[0] - Vd))
            self._w1_buf = torch.cat([self._w1_rows, self._w1_rows.new_zeros(cap, r)])
            self._w2_buf = torch.cat([self._w2_rows, self._w2_rows.new_zeros(cap, r)])

    @property
    def buffers_key(self) -> tuple[int, int]:
        """Addresses of the tables :meth:`markov_inputs` returns (what a CUDA graph of a draw holds)."""
        return tuple(0 if b is None else b.data_ptr() for b in (self._w1_buf, self._w2_buf))

    def markov_inputs(
        self, base_logits: Tensor, anchor: Tensor, w1: Tensor, w2: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(U_ext (R, γ, V'+R), anchor_ext (R,), W1_ext (V'+R, r), W2_ext (V'+R, r))`` for ``markov_sample``."""
        if self._w1_rows is None or self._w2_rows is None:
            raise ValueError("markov_inputs: these tables were built without a Markov head")
        self.check_logits(base_logits)
        R, g, Vd = base_logits.shape
        self.reserve(R)
        anchor = anchor.to(torch.int64)
        self._w1_buf[Vd : Vd + R] = w1.index_select(0, anchor).to(self._w1_buf.dtype)
        spare = base_logits.new_full((R, g, R), outside_logit(base_logits.dtype))
        u = torch.cat([base_logits, spare], -1)
        a = torch.arange(Vd, Vd + R, device=anchor.device, dtype=torch.int64)
        return u, a, self._w1_buf[: Vd + R], self._w2_buf[: Vd + R]
