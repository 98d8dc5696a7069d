# SPDX-License-Identifier: Apache-2.0
"""The drafter's sequential heads: low-rank Markov heads (vanilla, gated, RNN) and the confidence head.

Names and shapes follow DeepSpec's checkpoints (``markov_head.markov_w1`` = ``nn.Embedding(V, r)``,
``markov_head.markov_w2`` = ``nn.Linear(r, V, bias=False)``, ``confidence_head.proj`` = ``nn.Linear(H + r, 1)``).

Sampling is left to right: ``z_k = U_k + B_k(x_{k-1})`` with ``x_{-1}`` the anchor, then ``x_k`` is the
Gumbel-max draw ``argmax(z_k / T + g_k)`` (``g`` from ``dspark.ops.philox_draw`` keyed by request id, draft slot k,
purpose ``PURPOSE_DRAFT_SAMPLE`` and vocabulary id), or ``argmax(z_k)`` when ``T == 0``. The vanilla head and
the drafter without a Markov head sample through the fused ``markov_sample`` op; the gated and RNN heads, whose
bias is not ``W2 · W1[x]``, draw step by step in PyTorch with the same keyed noise.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor, nn

import dspark.ops
from dspark.models.draft_vocab import DraftVocabTables
from dspark.models.layers import Float32Module
from dspark.ops.philox_draw import PURPOSE_DRAFT_SAMPLE


@dataclasses.dataclass
class MarkovSample:
    """Output of a Markov head's ``sample``.

    tokens : ``(R, gamma)`` int64 draft tokens; logits : ``(R, gamma, V)`` float32 corrected logits ``z`` (what
    ``q = softmax(z / T)`` is made from); prev_emb : ``(R, gamma, r)`` ``W1[x_{k-1}]`` (weight dtype).
    """

    tokens: Tensor
    logits: Tensor
    prev_emb: Tensor


def gumbel_noise(seed: int, offset: int | Tensor, request_ids: Tensor, gamma: int, vocab: int) -> Tensor:
    """Gumbel noise ``g[r, k, v]`` keyed by ``(seed, offset, request_ids[r], k, PURPOSE_DRAFT_SAMPLE, v)``.

    Shape ``(R, gamma, V)`` float32 on ``request_ids``' device; the same values the fused sampler draws.
    """
    if isinstance(offset, Tensor):
        raise ValueError(
            "offset: a device counter (round_offset) is read by the fused Markov ops only (the vanilla head or "
            "none); pass an int"
        )
    dev = request_ids.device
    R = request_ids.shape[0]
    req = request_ids.to(torch.int64).view(R, 1, 1).expand(R, gamma, vocab).reshape(-1)
    pos = (
        torch.arange(gamma, device=dev, dtype=torch.int64)
        .view(1, gamma, 1)
        .expand(R, gamma, vocab)
        .reshape(-1)
    )
    idx = (
        torch.arange(vocab, device=dev, dtype=torch.int64)
        .view(1, 1, vocab)
        .expand(R, gamma, vocab)
        .reshape(-1)
    )
    _, g = dspark.ops.philox_draw(int(seed), int(offset), req, pos, PURPOSE_DRAFT_SAMPLE, idx)
    return g.view(R, gamma, vocab)


def _as_temperature(temperature: float | Tensor, R: int, device: torch.device) -> Tensor:
    if isinstance(temperature, (int, float)):  # checked on the host, filled on the device: no copy, no wait
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError("temperature must be finite and >= 0")
        return torch.full((R,), float(temperature), dtype=torch.float32, device=device)
    t = torch.as_tensor(temperature, dtype=torch.float32, device=device)
    t = t.expand(R) if t.dim() == 0 else t
    if t.shape != (R,):
        raise ValueError(f"temperature must be a float or a tensor of shape ({R},), got {tuple(t.shape)}")
    if bool((t < 0).any()) or not bool(torch.isfinite(t).all()):
        raise ValueError("temperature must be finite and >= 0")
    return t


class _Sampler:
    """Per-slot picking shared by every head: Gumbel-max at T > 0, argmax at T == 0 (per row)."""

    def __init__(self, temperature, seed, offset, request_ids, R, gamma, V, device):
        self.t = _as_temperature(temperature, R, device)
        if request_ids is None:
            request_ids = torch.arange(R, device=device)
        self.sampled = self.t > 0
        self.noise = None
        # a Python temperature answers on the host; a tensor one has to be read
        any_sampled = temperature > 0 if isinstance(temperature, (int, float)) else bool(self.sampled.any())
        if any_sampled:
            self.noise = gumbel_noise(seed, offset, request_ids.to(device), gamma, V)
        self.safe_t = torch.where(self.sampled, self.t, torch.ones_like(self.t)).unsqueeze(-1)

    def pick(self, z: Tensor, k: int) -> Tensor:  # z: [R, V] float32 -> [R] int64
        if self.noise is None:
            return z.argmax(-1)
        scores = torch.where(self.sampled.unsqueeze(-1), z / self.safe_t + self.noise[:, k], z)
        return scores.argmax(-1)


class MarkovHead(nn.Module):
    """Base of the Markov heads: ``markov_w1`` ``[V, r]`` and ``markov_w2`` ``[V, r]``; subclasses define the bias."""

    head_type = "base"

    def __init__(self, vocab_size: int, hidden_size: int, rank: int) -> None:
        super().__init__()
        self.vocab_size, self.hidden_size, self.rank = vocab_size, hidden_size, rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def init_state(self, R: int, like: Tensor) -> Tensor | None:
        return None

    def step_bias(self, e: Tensor, h: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Bias ``B_k`` ``[R, V]`` from ``e = W1[x_{k-1}]`` ``[R, r]`` and ``h_k`` ``[R, H]``; returns the new state."""
        raise NotImplementedError

    def forward(self, base_logits: Tensor, prev_tokens: Tensor, hidden: Tensor) -> Tensor:
        """Teacher-forced corrected logits ``z`` ``(R, gamma, V)`` float32 for given previous tokens ``(R, gamma)``."""
        e_all = self.markov_w1(prev_tokens)
        state = self.init_state(prev_tokens.shape[0], hidden)
        out = []
        for k in range(prev_tokens.shape[1]):
            b, state = self.step_bias(e_all[:, k], hidden[:, k], state)
            out.append(base_logits[:, k].float() + b.float())
        return torch.stack(out, 1)

    def sample(
        self,
        base_logits: Tensor,
        anchor: Tensor,
        temperature: float | Tensor,
        seed: int,
        offset: int,
        hidden: Tensor | None = None,
        request_ids: Tensor | None = None,
        vocab: DraftVocabTables | None = None,
    ) -> MarkovSample:
        """Left-to-right sampling of one block (see the module docstring); ``hidden`` ``(R, gamma, H)``.

        With a draft vocabulary ``vocab`` of V' ids, ``base_logits`` is ``(R, gamma, V')`` (the LM head's rows of
        those ids), the bias is taken at those ids, the noise is keyed by the position in the draft vocabulary,
        and ``logits`` is ``(R, gamma, V')``; ``tokens`` are ids of the full vocabulary either way.
        """
        R, gamma, V = base_logits.shape
        if hidden is None:
            raise ValueError(f"{type(self).__name__}.sample needs hidden (R, gamma, H)")
        ids = None if vocab is None else vocab.check_logits(base_logits)
        sampler = _Sampler(temperature, seed, offset, request_ids, R, gamma, V, base_logits.device)
        w1 = self.markov_w1.weight
        prev = anchor.to(torch.int64)
        state = self.init_state(R, hidden)
        tokens, logits, embs = [], [], []
        for k in range(gamma):
            e = w1[prev]
            b, state = self.step_bias(e, hidden[:, k], state)
            if ids is not None:
                b = b.index_select(-1, ids)
            z = base_logits[:, k].float() + b.float()
            prev = sampler.pick(z, k)
            if ids is not None:
                prev = ids[prev]
            tokens.append(prev)
            logits.append(z)
            embs.append(e)
        return MarkovSample(torch.stack(tokens, 1), torch.stack(logits, 1), torch.stack(embs, 1))


class VanillaMarkovHead(MarkovHead):
    """``B_k = W2 · W1[x_{k-1}]`` (the released DeepSpec checkpoints)."""

    head_type = "vanilla"

    def step_bias(self, e, h, state):
        return self.markov_w2(e), state

    def forward(self, base_logits: Tensor, prev_tokens: Tensor, hidden: Tensor | None = None) -> Tensor:
        return base_logits.float() + self.markov_w2(self.markov_w1(prev_tokens)).float()

    def sample(
        self, base_logits, anchor, temperature, seed, offset, hidden=None, request_ids=None, vocab=None
    ) -> MarkovSample:
        # The fused op: bias GEMV + add + temperature + Gumbel-max per step, the noise of MarkovHead.sample.
        w1, w2 = self.markov_w1.weight, self.markov_w2.weight
        if vocab is None:
            s = _fused_sample(base_logits, anchor, w1, w2, temperature, seed, offset, request_ids)
            return MarkovSample(s.tokens, s.logits, s.prev_emb.to(w1.dtype))
        u, a, t1, t2 = vocab.markov_inputs(base_logits, anchor, w1, w2)
        s = _fused_sample(u, a, t1, t2, temperature, seed, offset, request_ids)
        return MarkovSample(vocab.token_ids[s.tokens], s.logits[..., : vocab.size], s.prev_emb.to(w1.dtype))

    def sample_from_hidden(
        self,
        hidden: Tensor,
        lm_head: Tensor,
        anchor: Tensor,
        temperature: float | Tensor,
        seed: int,
        offset: int | Tensor,
        request_ids: Tensor | None = None,
    ) -> MarkovSample:
        """:meth:`sample` of ``U = hidden · lm_headᵀ`` (hidden ``(R, γ, H)``, lm_head ``(V, H)``), whole
        vocabulary, without a separate LM head: ``dspark.ops.markov_sample_from_hidden``."""
        w1, w2 = self.markov_w1.weight, self.markov_w2.weight
        R, dev = hidden.shape[0], hidden.device
        if w1.dtype != hidden.dtype:
            w1, w2 = w1.to(hidden.dtype), w2.to(hidden.dtype)
        draw = _draw_args(temperature, seed, offset, request_ids, R, dev)
        tokens, z, prev_emb = dspark.ops.markov_sample_from_hidden(
            hidden.contiguous(), lm_head, anchor.to(torch.int64), w1, w2, *draw
        )
        return MarkovSample(tokens, z, prev_emb.to(self.markov_w1.weight.dtype))


def _draw_args(temperature, seed, offset, request_ids, R: int, device: torch.device) -> tuple:
    """The Markov ops' last arguments: temperatures ``(R,)`` float32, seed, offset, the Philox request keys
    ``(R,)`` int64 (``request_ids``, or ``0 .. R-1``) and ``round_offset``: an ``offset`` given as a ``(1,)``
    int64 device tensor (a CUDA graph's counter) goes there, with 0 as the scalar offset."""
    ids = torch.arange(R, device=device) if request_ids is None else request_ids.to(torch.int64)
    if isinstance(offset, Tensor):
        return _as_temperature(temperature, R, device), int(seed), 0, ids, offset
    return _as_temperature(temperature, R, device), int(seed), int(offset), ids, None


def sample_without_markov(
    base_logits: Tensor,
    anchor: Tensor,
    temperature: float | Tensor,
    seed: int,
    offset: int | Tensor,
    request_ids: Tensor | None = None,
    vocab: DraftVocabTables | None = None,
) -> MarkovSample:
    """Draft tokens of a drafter without a Markov head (DFlash): ``z = U``, one Gumbel-max draw per slot.

    The fused ``markov_sample`` op with a rank-0 table (the same tokens as ``dspark.reference.markov_sample_ref``
    with empty weights), without materialising the ``(R, gamma, V)`` noise and index tensors. ``prev_emb`` is
    ``(R, gamma, 0)``.
    With a draft vocabulary, ``base_logits`` and the returned logits are over its V' ids and the tokens are
    mapped back to the full vocabulary.
    """
    if vocab is not None:
        vocab.check_logits(base_logits)
        anchor = torch.zeros_like(anchor)  # a rank-0 table never reads it; keep it inside [0, V')
    empty = torch.empty(base_logits.shape[-1], 0, dtype=base_logits.dtype, device=base_logits.device)
    s = _fused_sample(base_logits, anchor, empty, empty, temperature, seed, offset, request_ids)
    tokens = s.tokens if vocab is None else vocab.token_ids[s.tokens]
    return MarkovSample(tokens, s.logits, s.prev_emb.to(base_logits.dtype))


def _fused_sample(base_logits, anchor, w1, w2, temperature, seed, offset, request_ids) -> MarkovSample:
    """``dspark.ops.markov_sample`` on ``(R, gamma, V)`` logits; tables cast to the logits' dtype."""
    R = base_logits.shape[0]
    dev = base_logits.device
    if w1.dtype != base_logits.dtype:
        w1, w2 = w1.to(base_logits.dtype), w2.to(base_logits.dtype)
    draw = _draw_args(temperature, seed, offset, request_ids, R, dev)
    tokens, z, prev_emb = dspark.ops.markov_sample(
        base_logits.contiguous(), anchor.to(torch.int64), w1, w2, *draw
    )
    return MarkovSample(tokens, z, prev_emb)


class GatedMarkovHead(MarkovHead):
    """``g = sigmoid(gate_proj([h_k; e]))``, ``B_k = W2 (g * e)``."""

    head_type = "gated"

    def __init__(self, vocab_size: int, hidden_size: int, rank: int) -> None:
        super().__init__(vocab_size, hidden_size, rank)
        self.gate_proj = nn.Linear(hidden_size + rank, rank)

    def step_bias(self, e, h, state):
        g = torch.sigmoid(self.gate_proj(torch.cat([h.to(e.dtype), e], -1)))
        return self.markov_w2(g * e), state


class RNNMarkovHead(MarkovHead):
    """Gated recurrence (paper Eq. 6): ``[gate, cand, out] = joint_proj([s; e; h])``,
    ``s = sigmoid(gate) * s + (1 - sigmoid(gate)) * tanh(cand)``, ``B_k = W2 tanh(out)``; ``s_{-1} = 0``."""

    head_type = "rnn"

    def __init__(self, vocab_size: int, hidden_size: int, rank: int) -> None:
        super().__init__(vocab_size, hidden_size, rank)
        self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def init_state(self, R, like):
        return torch.zeros(R, self.rank, dtype=self.joint_proj.weight.dtype, device=like.device)

    def step_bias(self, e, h, state):
        gate, cand, out = self.joint_proj(torch.cat([state, e, h.to(e.dtype)], -1)).chunk(3, dim=-1)
        a = torch.sigmoid(gate)
        state = a * state + (1 - a) * torch.tanh(cand)
        return self.markov_w2(torch.tanh(out)), state


MARKOV_HEADS = {"vanilla": VanillaMarkovHead, "gated": GatedMarkovHead, "rnn": RNNMarkovHead}


class ConfidenceHead(Float32Module):
    """``c_k = sigmoid((w · [h_k; W1[x_{k-1}]] + b) / T_k)``; ``proj = Linear(H + r, 1)`` kept in float32."""

    def __init__(self, hidden_size: int, markov_rank: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size + markov_rank, 1, dtype=torch.float32)
        self.input_rank = markov_rank

    def logits(self, hidden: Tensor, prev_emb: Tensor, extra: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Differentiable raw logits ``(R, gamma)`` float32 (for training); ``prev_emb`` may have ``r = 0``.
        ``extra``: more inputs ``(R, gamma, F)`` and their weights ``(F,)`` (the copy head's)."""
        x = torch.cat([hidden.float(), prev_emb[..., : self.input_rank].float()], -1)
        out = self.proj(x).squeeze(-1)
        if extra is not None:
            out = out + (extra[0].float() * extra[1].float()).sum(-1)  # no autocast to bf16
        return out

    def forward(
        self,
        hidden: Tensor,
        prev_emb: Tensor,
        sts_temperature: Tensor | None = None,
        sts_bias: Tensor | None = None,
        extra: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``(logit, conf, survival)``, each ``(R, gamma)`` float32, through ``dspark.ops.confidence``
        (``conf = sigmoid(logit / T_k + o_k)``: STS temperatures ``T``, ones when None; offsets ``o``, zeros when
        None). ``extra`` as in :meth:`logits`: appended to the op's second input and weight vector."""
        gamma = hidden.shape[1]
        if sts_temperature is None:
            sts_temperature = torch.ones(gamma, dtype=torch.float32, device=hidden.device)
        e = prev_emb[..., : self.input_rank]
        w = self.proj.weight.reshape(-1)
        if extra is not None:
            e = torch.cat([e.to(hidden.dtype), extra[0].to(hidden.dtype)], -1)
            w = torch.cat([w, extra[1].to(w.dtype)])
        if e.dtype != hidden.dtype:
            e = e.to(hidden.dtype)
        return dspark.ops.confidence(
            hidden.contiguous(),
            e.contiguous(),
            w,
            self.proj.bias.reshape(()),
            sts_temperature.to(device=hidden.device, dtype=torch.float32),
            None if sts_bias is None else sts_bias.to(device=hidden.device, dtype=torch.float32),
        )
