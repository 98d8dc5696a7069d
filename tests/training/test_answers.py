# SPDX-License-Identifier: Apache-2.0
"""Teacher-forced rows from existing answers: the row format of regenerated data, cuts, skips, budget, resume."""

from __future__ import annotations

import pytest

from dspark.training.answers import write_dataset_answers
from dspark.training.data import read_regenerated
from tests.training.test_data import EOS, _ToyTokenizer


class _AnswerTokenizer(_ToyTokenizer):
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [10 + ord(c) % 80 for c in text]}


EXCHANGES = [
    ("a:0", "hi", "hello there friend"),
    ("a:1", "x" * 50, "too long a prompt"),  # templated: 1 + 50 + 2 tokens
    ("a:2", "q", "ok"),  # 2 + EOS tokens: too short
    ("a:3", "tell me", "a" * 40),  # cut at max_response_tokens
    ("a:4", "more", "second answer here"),
]


def test_rows_match_the_regenerated_format(tmp_path):
    tok = _AnswerTokenizer()
    out = tmp_path / "answers.jsonl"
    res = write_dataset_answers(
        tok,
        EXCHANGES,
        out,
        max_prompt_tokens=20,
        max_response_tokens=30,
        min_response_tokens=5,
        progress=False,
    )
    rows = {r["id"]: r for r in read_regenerated(out)}
    assert set(rows) == {"a:0", "a:3", "a:4"}
    assert res["written"] == 3 and res["skipped_long"] == 1 and res["skipped_short"] == 1
    r0 = rows["a:0"]
    assert r0["prompt_ids"] == tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert r0["response_ids"] == tok("hello there friend")["input_ids"] + [EOS] and r0["finish"] == "answer"
    r3 = rows["a:3"]
    assert len(r3["response_ids"]) == 30 and r3["finish"] == "length" and EOS not in r3["response_ids"]
    assert res["response_tokens"] == sum(len(r["response_ids"]) for r in rows.values())


def test_budget_and_resume(tmp_path):
    tok = _AnswerTokenizer()
    out = tmp_path / "answers.jsonl"
    first = write_dataset_answers(tok, EXCHANGES, out, token_budget=1, min_response_tokens=5, progress=False)
    assert first["written"] == 1  # the budget is checked before each row
    again = write_dataset_answers(tok, EXCHANGES, out, min_response_tokens=5, progress=False)
    assert again["seen"] == 1 and again["written"] == 3  # a:0 kept, a:1, a:3 and a:4 added (a:2 too short)
    ids = [r["id"] for r in read_regenerated(out)]
    assert len(ids) == len(set(ids)) == 4


def test_bad_limits_are_named(tmp_path):
    with pytest.raises(ValueError, match="max_response_tokens"):
        write_dataset_answers(_AnswerTokenizer(), EXCHANGES, tmp_path / "x.jsonl", max_response_tokens=0)
