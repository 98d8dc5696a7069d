# SPDX-License-Identifier: Apache-2.0
"""When a request stops: EOS ids, a token budget, stop strings — applied to each round's committed tokens."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class StopCriteria:
    """Per-request stop state.

    A round commits several tokens at once; :meth:`commit` keeps the prefix that plain decoding would have
    produced before stopping: everything up to and including the first EOS token, the token that reaches
    ``max_new_tokens``, or the token that completes a stop string (as Hugging Face ``generate`` does, the EOS
    token and the stop string stay in the output).

    Parameters
    ----------
    max_new_tokens : int
        Budget of generated tokens (>= 1).
    eos_token_ids : Iterable[int]
        Token ids that end generation.
    stop : Sequence[str]
        Stop strings (matched on the decoded generated text, across token boundaries).
    tokenizer : object with ``decode``
        Needed only when ``stop`` is non-empty.
    """

    def __init__(
        self,
        max_new_tokens: int,
        eos_token_ids: Iterable[int] = (),
        stop: Sequence[str] = (),
        tokenizer: Decoder | None = None,
    ) -> None:
        if int(max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        stop = [s for s in stop]
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
        if stop and tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode the generated text")
        self.max_new_tokens = int(max_new_tokens)
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.stop = stop
        self.tokenizer = tokenizer
        self.generated: list[int] = []
        self.finish_reason: str | None = None
        self._max_stop = max((len(s) for s in stop), default=0)
        self._text = ""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)  # type: ignore[union-attr]

    def commit(self, tokens: Sequence[int]) -> list[int]:
        """Append this round's committed tokens; return the ones kept (a prefix) and set ``finish_reason``."""
        if self.finished:
            raise RuntimeError("StopCriteria.commit: the request has already finished")
        kept: list[int] = []
        for tok in tokens:
            kept.append(int(tok))
            if int(tok) in self.eos:
                self.finish_reason = "eos"
                break
            if len(self.generated) + len(kept) >= self.max_new_tokens:
                self.finish_reason = "length"
                break
        if self.stop:
            kept = self._cut_at_stop_string(kept)
        self.generated.extend(kept)
        return kept

    def _cut_at_stop_string(self, kept: list[int]) -> list[int]:
        start = max(0, len(self._text) - self._max_stop + 1)  # a match must end in the new text
        text = self._decode(self.generated + kept)
        if not any(text.find(s, start) >= 0 for s in self.stop):
            self._text = text
            return kept
        # the shortest prefix of this round's tokens whose text contains a stop string
        for m in range(1, len(kept) + 1):
            t = self._decode(self.generated + kept[:m])
            if any(t.find(s, start) >= 0 for s in self.stop):
                self._text = t
                self.finish_reason = "stop"
                return kept[:m]
        self._text = text  # unreachable for a prefix-consistent decode; keep everything
        return kept


class TextStream:
    """Turns committed token ids into text deltas, holding back an incomplete multi-byte character."""

    def __init__(self, tokenizer: Decoder) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = 0

    def push(self, ids: Sequence[int], final: bool = False) -> str:
        self.ids.extend(int(i) for i in ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        end = len(text)
        if not final:
            while end > self.sent and text[end - 1] == "\ufffd":
                end -= 1
        delta = text[self.sent : end]
        self.sent = end
        return delta
