# SPDX-License-Identifier: Apache-2.0
"""Regenerated training data: both engines give the target's greedy answers; budget, resume and skips."""

from __future__ import annotations

import pytest
import torch

from dspark.training.data import Prompt, read_regenerated, regenerate
from tests.decoding.toy_models import tiny_target

EOS = 5


class _ToyTokenizer:
    """A chat template that maps characters to ids 10..89 after a BOS, then a 2-token generation prompt."""

    eos_token_id = EOS
    pad_token_id = 0

    def __len__(self) -> int:
        return 96

    def decode(self, ids, skip_special_tokens=True) -> str:
        return "".join(chr(32 + i % 90) for i in ids)

    def apply_chat_template(self, msgs, add_generation_prompt=True, tokenize=True):
        text = msgs[-1]["content"]
        return [1] + [10 + ord(c) % 80 for c in text] + ([2, 3] if add_generation_prompt else [])


def _prompts() -> list[Prompt]:
    texts = ["hello there", "a", "abcabcabc", "tiny", "the quick brown fox jumps", "zz", "ok go"]
    return [Prompt(f"toy:{i}", t) for i, t in enumerate(texts)]


def _greedy(target, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    out = target.generate(
        x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    resp = out[0, len(ids) :].tolist()
    return resp[: resp.index(EOS) + 1] if EOS in resp else resp


@pytest.fixture(scope="module")
def target():
    t = tiny_target("llama", vocab=96, layers=2)
    # make EOS likely enough that some answers stop on their own
    with torch.no_grad():
        t.lm_head.bias = None
        t.lm_head.weight[EOS] *= 3.0
    return t


@pytest.mark.parametrize("engine", ["hf", "dspark"])
def test_regenerate_writes_the_targets_greedy_answers(tmp_path, target, engine):
    tok = _ToyTokenizer()
    out = tmp_path / "data.jsonl"
    res = regenerate(
        target, tok, _prompts(), out, batch_size=3, max_new_tokens=12, engine=engine, progress=False
    )
    rows = {r["id"]: r for r in read_regenerated(out)}
    assert res["written"] == len(rows) == len(_prompts())
    for p in _prompts():
        r = rows[p.id]
        ids = tok.apply_chat_template([{"role": "user", "content": p.text}])
        assert r["prompt_ids"] == ids
        assert r["response_ids"] == _greedy(target, ids, 12), p.text
        assert r["finish"] == ("eos" if r["response_ids"][-1] == EOS else "length")
    assert res["response_tokens"] == sum(len(r["response_ids"]) for r in rows.values())


def test_regenerate_budget_resume_and_long_prompt_skip(tmp_path, target):
    tok = _ToyTokenizer()
    out = tmp_path / "data.jsonl"
    kw = dict(batch_size=2, max_new_tokens=8, max_prompt_tokens=20, engine="hf", progress=False)
    first = regenerate(target, tok, _prompts(), out, token_budget=1, **kw)
    # the long prompt (25 characters + 3 template tokens) is over 20 tokens and skipped
    assert first["skipped_long"] == 1
    assert first["written"] == 2  # one batch, then the budget is spent
    second = regenerate(target, tok, _prompts(), out, **kw)
    assert second["written"] == len(_prompts()) - 1 - 2
    rows = read_regenerated(out)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == len(_prompts()) - 1 and "toy:4" not in ids
    fresh = tmp_path / "fresh.jsonl"
    regenerate(target, tok, _prompts(), fresh, **kw)
    assert {r["id"]: r["response_ids"] for r in read_regenerated(fresh)} == {
        r["id"]: r["response_ids"] for r in rows
    }


def test_regenerate_rejects_bad_arguments(tmp_path, target):
    tok = _ToyTokenizer()
    with pytest.raises(ValueError, match="engine"):
        regenerate(target, tok, _prompts(), tmp_path / "x.jsonl", engine="vllm", progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        regenerate(target, tok, _prompts(), tmp_path / "x.jsonl", batch_size=0, progress=False)
