# SPDX-License-Identifier: Apache-2.0
"""What ``DSparkDecoder`` is given, checked before any work: prompts, sampling settings, STS files.

Every error names the argument and what was expected. Nothing here touches a model.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

MAX_SEED = 2**63  # the ops key Philox with a signed 64-bit seed


@dataclass(frozen=True)
class SamplingConfig:
    """The sampling settings of one ``generate`` call (validated; see :func:`resolve_sampling`).

    Attributes
    ----------
    max_new_tokens : int
        Token budget per request (>= 1).
    temperature : float
        0 is greedy; otherwise finite and > 0.
    top_k : int
        0 is off.
    top_p : float
        In (0, 1]; 1 is off.
    repetition_penalty : float
        Finite and > 0; 1 is off.
    eos : tuple of int
        Token ids that end a request.
    stop : tuple of str
        Stop strings (need a tokenizer).
    seed : int
        Key of the counter-based RNG, in [0, 2**63).
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    eos: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    seed: int = 0


def as_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an int in ``[lo, hi)``, or a ``ValueError`` naming ``name`` (floats and bools are refused)."""
    if isinstance(value, Tensor) and value.dim() == 0 and not value.dtype.is_floating_point:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name}: must be an integer, got {value!r} ({type(value).__name__})")
    v = int(value)
    if lo is not None and v < lo:
        raise ValueError(f"{name}: must be >= {lo}, got {v}")
    if hi is not None and v >= hi:
        raise ValueError(f"{name}: must be < {hi}, got {v}")
    return v


def as_float(name: str, value: Any) -> float:
    """``value`` as a finite float, or a ``ValueError`` naming ``name``."""
    if isinstance(value, Tensor) and value.dim() == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name}: must be a number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name}: must be finite, got {v}")
    return v


def _stop_strings(stop: Any) -> tuple[str, ...]:
    items = [stop] if isinstance(stop, str) else list(stop)
    for s in items:
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop: stop strings must be non-empty strings, got {s!r}")
    return tuple(items)


def _eos_ids(eos: Any) -> tuple[int, ...]:
    items = eos.reshape(-1).tolist() if isinstance(eos, Tensor) else eos
    items = [items] if not isinstance(items, (list, tuple)) else items
    return tuple(as_int("eos_token_id", e, lo=0) for e in items)


def resolve_sampling(
    generation_config: Any,
    tokenizer: Any,
    *,
    max_new_tokens: Any = None,
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
    repetition_penalty: Any = None,
    eos_token_id: Any = None,
    stop: Any = None,
    seed: Any = 0,
) -> SamplingConfig:
    """The call's :class:`SamplingConfig`: explicit values, else ``generation_config``'s, else defaults.

    As in Hugging Face ``generate``, ``do_sample=False`` (or no config) means greedy and turns top-k / top-p
    off unless given explicitly; ``max_new_tokens`` defaults to 128; the EOS ids default to the tokenizer's.
    Raises ``ValueError`` naming the first bad value.
    """
    gc = generation_config

    def from_config(name: str, default: Any) -> Any:
        v = getattr(gc, name, None) if gc is not None else None
        return default if v is None else v

    sampling = bool(from_config("do_sample", False))
    if temperature is None:
        temperature = from_config("temperature", 1.0) if sampling else 0.0
    if top_k is None:
        top_k = from_config("top_k", 0) if sampling else 0
    if top_p is None:
        top_p = from_config("top_p", 1.0) if sampling else 1.0
    if eos_token_id is None:
        eos_token_id = from_config("eos_token_id", None)
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
    stop = from_config("stop_strings", None) if stop is None else stop

    cfg = SamplingConfig(
        max_new_tokens=as_int(
            "max_new_tokens",
            from_config("max_new_tokens", 128) if max_new_tokens is None else max_new_tokens,
            lo=1,
        ),
        temperature=as_float("temperature", temperature),
        top_k=as_int("top_k", top_k, lo=0),
        top_p=as_float("top_p", top_p),
        repetition_penalty=as_float(
            "repetition_penalty",
            from_config("repetition_penalty", 1.0) if repetition_penalty is None else repetition_penalty,
        ),
        eos=() if eos_token_id is None else _eos_ids(eos_token_id),
        stop=() if stop is None else _stop_strings(stop),
        seed=as_int("seed", seed, lo=0, hi=MAX_SEED),
    )
    if cfg.temperature < 0:
        raise ValueError(f"temperature: must be >= 0 (0 = greedy), got {cfg.temperature}")
    if not 0 < cfg.top_p <= 1:
        raise ValueError(f"top_p: must be in (0, 1], got {cfg.top_p}")
    if cfg.repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty: must be > 0, got {cfg.repetition_penalty}")
    if cfg.stop and tokenizer is None:
        raise ValueError("stop: stop strings need the decoder's tokenizer")
    return cfg


def chat_token_ids(tokenizer: Any, prompt: str | list[dict]) -> list[int]:
    """Token ids of a user message (a string) or a chat, through the tokenizer's chat template."""
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def _is_chat(p: Any) -> bool:
    return isinstance(p, list) and bool(p) and isinstance(p[0], dict)


def _token_list(i: int, p: Any, vocab_size: int) -> list[int]:
    if isinstance(p, Tensor):
        if p.dtype.is_floating_point or p.dtype.is_complex or p.dtype == torch.bool:
            raise ValueError(f"prompts[{i}]: token ids must be integers, got a {p.dtype} tensor")
        p = p.reshape(-1).tolist()
    elif hasattr(p, "tolist") and not isinstance(p, (list, tuple)):  # a NumPy array of ids
        p = p.tolist()
    if not isinstance(p, (list, tuple)):
        raise ValueError(f"prompts[{i}]: expected a list of token ids, got {type(p).__name__}")
    if not p:
        raise ValueError(f"prompts[{i}]: the prompt is empty")
    ids = []
    for j, t in enumerate(p):
        if isinstance(t, bool) or not isinstance(t, Integral):
            raise ValueError(f"prompts[{i}][{j}]: token ids must be integers, got {t!r}")
        if not 0 <= int(t) < vocab_size:
            raise ValueError(f"prompts[{i}][{j}]: token ids must be in [0, {vocab_size}), got {int(t)}")
        ids.append(int(t))
    return ids


def encode_prompts(prompts: Any, tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """Token-id lists of ``prompts`` (see ``DSparkDecoder.generate``), each checked against the vocabulary."""
    if hasattr(prompts, "tolist") and not isinstance(prompts, (Tensor, list, tuple, str)):
        prompts = prompts.tolist()  # a NumPy array
    if isinstance(prompts, Tensor):
        if prompts.dim() not in (1, 2):
            raise ValueError(f"prompts: a tensor of token ids must be 1-D or 2-D, got {prompts.dim()}-D")
        prompts = list(prompts) if prompts.dim() == 2 else [prompts]
    elif isinstance(prompts, str) or _is_chat(prompts):
        prompts = [prompts]
    elif isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], (Integral, float)):
        prompts = [list(prompts)]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts: expected token ids, a list of token-id lists, strings or chat messages")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str) or _is_chat(p):
            if tokenizer is None:
                raise ValueError(f"prompts[{i}]: text or chat prompts need the decoder's tokenizer")
            p = chat_token_ids(tokenizer, p)
        out.append(_token_list(i, p, vocab_size))
    return out


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


def load_sts(sts: Any, gamma: int) -> tuple[Tensor | None, Tensor | None]:
    """``(temperatures, biases)`` ``(γ,)`` float32 from an STS JSON path, its dict or a list of temperatures.

    ``biases`` (affine STS offsets, an extension of SGLang's format) is None when the file has none."""
    if sts is None:
        return None, None
    where = ""
    if isinstance(sts, (str, Path)):
        where = f" ({sts})"
        try:
            sts = json.loads(Path(sts).read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
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
