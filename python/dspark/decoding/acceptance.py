# SPDX-License-Identifier: Apache-2.0
"""Calibrated acceptance of a drafter's blocks by class and position, learnt online from verified rounds.

An :class:`AcceptanceTable` estimates the conditional acceptance ``a(c, j) = P(draft j accepted | drafts
0..j-1 accepted)`` for classes ``c`` in ``[0, C)`` and positions ``j`` in ``[0, γ)``. For the lookup drafter the
class is :func:`~dspark.decoding.lookup.match_class`: the match length ``n`` of the proposal (``0..max_match``;
class 0 never proposes), and for ``max_match`` matches one class more per extent bound the match reaches
(``extent_bounds``, in the file). Each cell is a Beta-style ratio of pseudo-counts (the prior) plus observed
counts::

    a(c, j) = (prior_accepts[c, j] + accepts[c, j]) / (prior_trials[c, j] + trials[c, j])

and the planner reads the survival ``S[j] = a(c, 0) · … · a(c, j)``, the predicted probability that drafts
``0..j`` are all accepted.

Where the counts come from
--------------------------
* A verified block (:meth:`~AcceptanceTable.observe`): the first ``accepted`` drafts count an accept each, the
  draft after them (when it was verified) a reject; later drafts were never judged and count nothing
  (censored).
* A shadow observation (:meth:`~AcceptanceTable.observe_continuation`): a proposal that was not verified,
  compared with the tokens committed after the same point. The committed tokens are distributed as the
  target's, so ``P(committed_j == proposal_j | prefix)`` is the acceptance probability of a deterministic
  proposal: a match is an accept, the first mismatch a reject, the rest censored.

The prior
---------
A prior file (docs/file-formats.md, "Acceptance table") holds raw counts, possibly many thousands per cell.
They are rescaled cell by cell on loading so that no cell carries more than ``prior_weight`` pseudo-trials
(the ratio is kept): the prior sets the starting point, and the decoder's own rounds outweigh it after a few
dozen observations. A cell without prior trials (or a table without a prior) starts at ``a = 0.5`` with 2
pseudo-trials. :meth:`~AcceptanceTable.to_dict` writes the evidence (the prior's raw counts plus the
observations, never the 0.5 default), so saving and loading a table loses nothing.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dspark.decoding.acceptance_file import FORMAT, VERSION, check_extent_bounds, class_map, parse_table
from dspark.decoding.lookup import LookupConfig, extent_bounds, num_match_classes

__all__ = ["FORMAT", "VERSION", "AcceptanceTable"]

# The weak default of a cell without prior trials: a = 0.5 worth two observations
_DEFAULT_ACCEPTS = 1.0
_DEFAULT_TRIALS = 2.0


def _int_arg(name: str, value: object, lo: int, hi: int | None = None) -> int:
    # bools are ints to Python but never a count here; floats would index silently; numpy ints are welcome
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise ValueError(f"{name}: must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: must be {bound}, got {value}")
    return value


def _index_array(name: str, value: object) -> np.ndarray:
    """A 1-D int64 array of ``value`` (a sequence of ints or an integer tensor); floats and bools are refused."""
    if isinstance(value, Tensor):
        value = value.detach().cpu().numpy()
    a = np.asarray(value)
    if a.size and a.dtype.kind not in "iu":
        raise ValueError(f"{name}: must be integers, got dtype {a.dtype}")
    return a.astype(np.int64, copy=False).reshape(-1)


class AcceptanceTable:
    """Online estimate of the conditional acceptance ``a(c, j)``; see the module docstring.

    Parameters
    ----------
    num_classes : int
        Classes ``C`` >= 1 (for lookup: ``max_match + 1 + len(extent_bounds)``, the classes of
        :func:`dspark.decoding.lookup.match_class`).
    gamma : int
        Positions ``γ`` >= 1 (the longest block the table describes).
    prior : dict, optional
        A table dict (the JSON structure of :meth:`to_dict`). Its counts are rescaled per cell to at most
        ``prior_weight`` pseudo-trials. Cells outside its classes or positions (a prior of another shape) and
        cells without prior trials get the weak default ``a = 0.5`` with 2 pseudo-trials. A lookup prior
        whose classes are laid out otherwise (another ``max_match`` or ``extent_bounds``; files written
        before extents were classed have none) gives each class the pooled counts of the prior's classes
        whose shortest ``(match length, extent)`` falls in it, or, where none does, those of the prior class
        holding the class's own shortest one: a class the prior split is pooled back, a class it did not
        split starts from the class it was part of.
    prior_weight : float
        Most pseudo-trials a cell takes from the prior; finite and > 0.
    meta : dict, optional
        Provenance written by :meth:`to_dict`: ``kind`` (default ``"lookup"``), ``min_match`` (default
        ``None``), ``temperature`` (default ``None``, unknown), ``source`` (default ``""``), and for kind
        ``"lookup"`` ``extent_bounds`` (default ``[]``: one class per match length); these override a given
        prior's values, except ``extent_bounds``, which is the table's own layout. For kind ``"lookup"``,
        ``max_match`` is always ``num_classes - 1 - len(extent_bounds)``.

    Attributes
    ----------
    meta : dict
        The provenance above; edit it before :meth:`save` (e.g. to record the temperature).

    Raises
    ------
    ValueError
        A bad argument or prior field, named.
    """

    def __init__(
        self,
        num_classes: int,
        gamma: int,
        prior: dict | None = None,
        prior_weight: float = 20.0,
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        C = _int_arg("num_classes", num_classes, 1)
        g = _int_arg("gamma", gamma, 1)
        if isinstance(prior_weight, bool) or not isinstance(prior_weight, (int, float)):
            raise ValueError(f"prior_weight: must be a number, got {prior_weight!r}")
        if not (math.isfinite(prior_weight) and prior_weight > 0):
            raise ValueError(f"prior_weight: must be finite and > 0, got {prior_weight}")
        self.num_classes, self.gamma, self.prior_weight = C, g, float(prior_weight)
        self.meta: dict[str, Any] = {"kind": "lookup", "min_match": None, "temperature": None, "source": ""}
        pa = pt = pmeta = None
        if prior is not None:
            pa, pt, pmeta = parse_table(prior, "prior")
            self.meta.update({k: v for k, v in pmeta.items() if k not in ("max_match", "extent_bounds")})
        if meta is not None:
            if not isinstance(meta, Mapping):
                raise ValueError(f"meta: must be a dict, got {type(meta).__name__}")
            self.meta.update(meta)
        lookup = self.meta.get("kind") == "lookup"
        if lookup:
            raw = self.meta.get("extent_bounds") or []
            n_bounds = len(raw) if isinstance(raw, (list, tuple)) else 0
            if C - 1 - n_bounds < 0:
                raise ValueError(f"meta: {n_bounds} extent_bounds leave no match classes in {C} classes")
            self.meta["extent_bounds"] = check_extent_bounds("meta:", raw, C - 1 - n_bounds)
            self.meta["max_match"] = C - 1 - n_bounds
            mm = self.meta.get("min_match")
            if isinstance(mm, int) and mm > self.meta["max_match"]:  # a prior of more classes than kept
                self.meta["min_match"] = None
        # raw prior evidence (zeros where there is none), kept for to_dict; pseudo-counts as rescaled
        self._raw_a = [[0.0] * g for _ in range(C)]
        self._raw_t = [[0.0] * g for _ in range(C)]
        if pa is not None:
            if lookup and pmeta["kind"] == "lookup":
                rows = class_map(self.meta["max_match"], self.meta["extent_bounds"], pmeta)
            else:
                rows = [[c] for c in range(min(C, len(pa)))]
            for c, pooled in enumerate(rows):
                for src in pooled:
                    for j in range(min(g, len(pa[src]))):
                        self._raw_a[c][j] += pa[src][j]
                        self._raw_t[c][j] += pt[src][j]
        self._pa = [[0.0] * g for _ in range(C)]
        self._pt = [[0.0] * g for _ in range(C)]
        w = self.prior_weight
        for c in range(C):
            for j in range(g):
                a, t = self._raw_a[c][j], self._raw_t[c][j]
                if t > 0:
                    s = min(1.0, w / t)  # per cell: the ratio is kept, the weight capped
                    self._pa[c][j], self._pt[c][j] = min(a, t) * s, t * s
                else:
                    self._pa[c][j], self._pt[c][j] = _DEFAULT_ACCEPTS, _DEFAULT_TRIALS
        self._acc = [[0.0] * g for _ in range(C)]
        self._tri = [[0.0] * g for _ in range(C)]
        self._cum: np.ndarray | None = None  # survival by class and length, rebuilt after an observation

    # ------------------------------------------------------------------ observations
    def observe(self, cls: int, verified: int, accepted: int) -> None:
        """Count one verified block of class ``cls``.

        Parameters
        ----------
        cls : int
            Class in ``[0, num_classes)``.
        verified : int
            Drafts the target judged, in ``[0, γ]``.
        accepted : int
            Leading drafts accepted, in ``[0, verified]``: positions ``0..accepted-1`` count an accept,
            position ``accepted`` (when ``< verified``) a reject, later positions nothing.
        """
        c = _int_arg("cls", cls, 0, self.num_classes - 1)
        v = _int_arg("verified", verified, 0, self.gamma)
        k = _int_arg("accepted", accepted, 0, v)
        acc, tri = self._acc[c], self._tri[c]
        for j in range(k):
            acc[j] += 1.0
            tri[j] += 1.0
        if k < v:
            tri[k] += 1.0
        if v:
            self._cum = None

    def observe_continuation(self, cls: int, proposal: Sequence[int], committed: Sequence[int]) -> None:
        """Count a proposal that was not verified against the tokens committed after the same point.

        Parameters
        ----------
        cls : int
            The proposal's class in ``[0, num_classes)``.
        proposal : sequence of int
            The proposed tokens, at most ``γ``.
        committed : sequence of int
            The tokens that were committed after the proposal's point; positions past its end are censored.
            Pass plain ints (a tensor's ``.tolist()``).
        """
        if len(proposal) > self.gamma:
            raise ValueError(f"proposal: {len(proposal)} tokens for a table of gamma = {self.gamma}")
        n = min(len(proposal), len(committed))
        k = 0
        while k < n and proposal[k] == committed[k]:
            k += 1
        self.observe(cls, n, k)

    # ------------------------------------------------------------------ estimates
    def _cumulative(self) -> np.ndarray:
        """``(C, γ + 1, γ)`` float32: row ``[c, n]`` is the survival of class ``c`` cut to its first ``n`` drafts,
        so that :meth:`survival` is one gather (numpy: on a table this small a torch call costs more than the
        arithmetic)."""
        if self._cum is None:
            num = np.add(self._pa, self._acc)
            den = np.add(self._pt, self._tri)
            # every cell has pseudo-trials > 0, so den > 0; the clip guards rounding only
            cum = np.cumprod(np.clip(num / den, 0.0, 1.0), axis=1).astype(np.float32)
            g = self.gamma
            cut = np.arange(g)[None, :] < np.arange(g + 1)[:, None]  # (γ + 1, γ): j < n
            self._cum = np.where(cut[None], cum[:, None, :], np.float32(0.0))
        return self._cum

    def conditional(self) -> list[list[float]]:
        """``a(c, j)`` as ``num_classes`` rows of ``γ`` floats in ``[0, 1]``."""
        return [
            [min(1.0, (pa + a) / (pt + t)) for pa, pt, a, t in zip(ra, rt, oa, ot, strict=True)]
            for ra, rt, oa, ot in zip(self._pa, self._pt, self._acc, self._tri, strict=True)
        ]

    def survival(
        self, classes: Sequence[int] | Tensor, lengths: Sequence[int] | Tensor, width: int
    ) -> Tensor:
        """Predicted survival of ``R`` blocks: ``S[r, j] = Π_{i≤j} a(classes[r], i)`` for ``j < lengths[r]``.

        Parameters
        ----------
        classes : sequence of int or Tensor
            ``(R,)`` class of each block, in ``[0, num_classes)``.
        lengths : sequence of int or Tensor
            ``(R,)`` drafts in each block, >= 0; 0 gives a zero row.
        width : int
            Columns of the result, >= 0; columns at or past ``γ`` are 0.

        Returns
        -------
        Tensor
            ``(R, width)`` float32 on CPU, non-increasing along each row, 0 for ``j >= lengths[r]``.
        """
        w = _int_arg("width", width, 0)
        ci = _index_array("classes", classes)
        li = _index_array("lengths", lengths)
        R = ci.size
        if li.size != R:
            raise ValueError(f"lengths: {li.size} entries for {R} classes")
        cols = min(w, self.gamma)
        if R == 0 or cols == 0:
            return torch.zeros(R, w, dtype=torch.float32)
        lo, hi = int(ci.min()), int(ci.max())
        if lo < 0 or hi >= self.num_classes:
            raise ValueError(f"classes: must be in [0, {self.num_classes}), got {lo if lo < 0 else hi}")
        if int(li.min()) < 0:
            raise ValueError(f"lengths: must be >= 0, got {int(li.min())}")
        rows = self._cumulative()[ci, np.minimum(li, self.gamma)]  # (R, γ), zero past each length
        if w == self.gamma:
            return torch.from_numpy(rows)
        out = np.zeros((R, w), dtype=np.float32)
        out[:, :cols] = rows[:, :cols]
        return torch.from_numpy(out)

    @property
    def counts(self) -> tuple[Tensor, Tensor]:
        """``(accepts, trials)``: ``(C, γ)`` float64 copies of the observed counts (without any prior)."""
        return torch.tensor(self._acc, dtype=torch.float64), torch.tensor(self._tri, dtype=torch.float64)

    @property
    def prior_counts(self) -> tuple[Tensor, Tensor]:
        """``(accepts, trials)``: ``(C, γ)`` float64 pseudo-counts in use (the rescaled prior, or the default)."""
        return torch.tensor(self._pa, dtype=torch.float64), torch.tensor(self._pt, dtype=torch.float64)

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        """The JSON structure with the evidence: the prior's raw counts plus the observed counts."""
        m = self.meta
        acc = [
            [ra + a for ra, a in zip(r1, r2, strict=True)]
            for r1, r2 in zip(self._raw_a, self._acc, strict=True)
        ]
        tri = [
            [rt + t for rt, t in zip(r1, r2, strict=True)]
            for r1, r2 in zip(self._raw_t, self._tri, strict=True)
        ]
        return {
            "format": FORMAT,
            "version": VERSION,
            "kind": m.get("kind", "lookup"),
            "min_match": m.get("min_match"),
            "max_match": m.get("max_match"),
            **({"extent_bounds": list(m["extent_bounds"])} if m.get("extent_bounds") else {}),
            "gamma": self.gamma,
            "temperature": m.get("temperature"),
            "accepts": acc,
            "trials": tri,
            "source": m.get("source", ""),
        }

    @classmethod
    def from_dict(
        cls,
        d: Mapping[str, Any],
        prior_weight: float = 20.0,
        *,
        num_classes: int | None = None,
        gamma: int | None = None,
        meta: Mapping[str, Any] | None = None,
        where: str = "table",
    ) -> AcceptanceTable:
        """A table with ``d`` as its prior (rescaled to ``prior_weight``), of ``d``'s shape unless given.

        Parameters
        ----------
        d : dict
            The JSON structure.
        prior_weight : float
            Most pseudo-trials per cell.
        num_classes, gamma : int, optional
            Shape of the table (default: the file's); see the constructor for cells outside the prior.
        meta : dict, optional
            As the constructor's (``extent_bounds`` here lays out a lookup table's classes; default: the
            file's layout when ``num_classes`` is not given, else none).
        where : str
            What the error messages name (a file path for :meth:`load`).
        """
        accepts, _, pmeta = parse_table(d, where)
        C = len(accepts) if num_classes is None else num_classes
        g = d["gamma"] if gamma is None else gamma
        if num_classes is None and meta is None and pmeta["kind"] == "lookup":
            meta = {"extent_bounds": pmeta["extent_bounds"]}
        return cls(C, g, prior=dict(d), prior_weight=prior_weight, meta=meta)

    @classmethod
    def for_lookup(
        cls,
        config: LookupConfig,
        gamma: int,
        prior: Mapping[str, Any] | str | os.PathLike | None = None,
        prior_weight: float = 20.0,
    ) -> AcceptanceTable:
        """A lookup table with the classes of :func:`~dspark.decoding.lookup.match_class` for ``config``
        (``num_match_classes(config)`` of them), from ``prior`` (a table dict, a file path, or None)."""
        layout = {"kind": "lookup", "extent_bounds": list(extent_bounds(config))}
        C = num_match_classes(config)
        if isinstance(prior, (str, os.PathLike)):
            return cls.load(prior, prior_weight, num_classes=C, gamma=gamma, meta=layout)
        if prior is not None and not isinstance(prior, Mapping):
            raise TypeError(f"prior: expected a path, a dict or None, got {type(prior).__name__}")
        return cls(
            C, gamma, prior=None if prior is None else dict(prior), prior_weight=prior_weight, meta=layout
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_dict` as JSON to ``path`` atomically (a temporary file, then ``os.replace``)."""
        path = Path(path)
        d = self.to_dict()
        # one line per field and per class row: a table stays readable at a glance
        lines = []
        for key, value in d.items():
            if key in ("accepts", "trials"):
                # whole counts as ints: raw counts stay integers in the file
                rows = ",\n".join(
                    "  " + json.dumps([int(x) if x.is_integer() else x for x in row]) for row in value
                )
                lines.append(f"{json.dumps(key)}: [\n{rows}\n ]")
            else:
                lines.append(f"{json.dumps(key)}: {json.dumps(value)}")
        text = "{\n " + ",\n ".join(lines) + "\n}\n"
        # a unique name in the same folder (os.replace must not cross file systems); mode "x" honours the umask
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "x") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        prior_weight: float = 20.0,
        *,
        num_classes: int | None = None,
        gamma: int | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> AcceptanceTable:
        """Read a file written by :meth:`save` (or ``dspark calibrate``'s ``lookup_prior.json``) as a prior.

        Raises
        ------
        OSError
            The file cannot be read.
        ValueError
            Not JSON, or a bad field; the message names the file and the field.
        """
        text = Path(path).read_text()
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON: {e}") from e
        return cls.from_dict(
            d, prior_weight, num_classes=num_classes, gamma=gamma, meta=meta, where=str(path)
        )

    def __repr__(self) -> str:
        obs = int(sum(sum(r) for r in self._tri))
        return (
            f"AcceptanceTable(num_classes={self.num_classes}, gamma={self.gamma}, "
            f"prior_weight={self.prior_weight}, observed_trials={obs})"
        )
