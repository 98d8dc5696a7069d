# SPDX-License-Identifier: Apache-2.0
"""Training rows from answers a dataset already holds: the target is teacher-forced on them instead of answering.

Regenerating an answer costs the target a decode step per token; teacher-forcing an existing answer costs one
feature pass (docs/training.md, "Teacher-forced answers"). :func:`write_dataset_answers` writes the same rows as
:func:`~dspark.training.data.regenerate` (``{"id", "prompt_ids", "response_ids", "finish"}``), with
``finish = "answer"`` for a whole answer (EOS appended, as the target would end it) and ``"length"`` for one cut
at ``max_response_tokens``. The file is appended to and a rerun skips ids already written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator

from dspark.training.data import iter_sharegpt_conversations, resume_state


def sharegpt_first_exchanges() -> Iterator[tuple[str, str, str]]:
    """``(id, first human turn, first answer)`` of the ShareGPT conversations that open human -> gpt."""
    for obj in iter_sharegpt_conversations():
        conv = obj.get("conversations") or []
        if len(conv) < 2 or conv[0].get("from") != "human" or conv[1].get("from") != "gpt":
            continue
        q, a = str(conv[0].get("value", "")), str(conv[1].get("value", ""))
        if q.strip() and a.strip():
            yield f"sharegpt-answer:{obj.get('id')}", q, a


def write_dataset_answers(
    tokenizer,
    exchanges: Iterable[tuple[str, str, str]],
    out_path: str | os.PathLike,
    *,
    max_prompt_tokens: int = 384,
    max_response_tokens: int = 512,
    min_response_tokens: int = 8,
    token_budget: int | None = None,
    limit: int | None = None,
    progress: bool = True,
) -> dict:
    """Append one row per ``(id, question, answer)`` to ``out_path`` (module docstring); returns counts.

    Parameters
    ----------
    tokenizer
        The target's tokenizer (its chat template makes ``prompt_ids``, as for regenerated rows).
    exchanges : iterable of (str, str, str)
        ``(row id, user turn, assistant answer)``.
    max_prompt_tokens : int
        Rows whose templated prompt is longer are skipped.
    max_response_tokens : int
        Answers are cut to this many tokens (``finish = "length"``).
    min_response_tokens : int
        Shorter answers are skipped (no anchors to train on).
    token_budget : int, optional
        Stop once this many response tokens are in the file (earlier runs count).
    limit : int, optional
        Look at no more than this many exchanges.

    Raises
    ------
    ValueError
        A limit below 1.
    """
    from tqdm.auto import tqdm

    from dspark.decoding.inputs import chat_token_ids

    for name, v in (("max_prompt_tokens", max_prompt_tokens), ("max_response_tokens", max_response_tokens)):
        if v < 1:
            raise ValueError(f"{name}: must be >= 1, got {v}")
    seen, tokens = resume_state(out_path)
    eos = tokenizer.eos_token_id
    counts = {"written": 0, "skipped_long": 0, "skipped_short": 0, "seen": 0}
    bar = tqdm(desc="answers", unit="row", disable=not progress)
    with open(out_path, "a", encoding="utf-8") as f:
        for k, (rid, question, answer) in enumerate(exchanges):
            if limit is not None and k >= limit:
                break
            if token_budget is not None and tokens >= token_budget:
                break
            if rid in seen:
                counts["seen"] += 1
                continue
            prompt = chat_token_ids(tokenizer, question)
            if len(prompt) > max_prompt_tokens:
                counts["skipped_long"] += 1
                continue
            resp = tokenizer(answer, add_special_tokens=False)["input_ids"] + [eos]
            finish = "answer"
            if len(resp) > max_response_tokens:
                resp, finish = resp[:max_response_tokens], "length"
            if len(resp) < min_response_tokens:
                counts["skipped_short"] += 1
                continue
            row = {"id": rid, "prompt_ids": prompt, "response_ids": resp, "finish": finish}
            f.write(json.dumps(row) + "\n")
            seen.add(rid)
            tokens += len(resp)
            counts["written"] += 1
            bar.update(1)
            bar.set_postfix(tokens=tokens)
    bar.close()
    counts["response_tokens"] = tokens
    return counts
