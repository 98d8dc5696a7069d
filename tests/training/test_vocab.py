# SPDX-License-Identifier: Apache-2.0
"""``dspark train vocab``: counting answer tokens, forcing special tokens in, and the written file."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from dspark import cli
from dspark.models.draft_vocab import DRAFT_VOCAB_FILE, load_draft_vocab
from dspark.training.vocab import build_draft_vocab, sharegpt_answers, special_token_ids


class StubTokenizer:
    all_special_ids = [0, 2]
    eos_token_id = 2

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 50 for c in text]}


def _regenerated(path, rows):
    with open(path, "w") as f:
        for i, resp in enumerate(rows):
            row = {"id": str(i), "prompt_ids": [1], "response_ids": resp, "finish": "eos"}
            f.write(json.dumps(row) + "\n")
    return path


def test_most_frequent_answer_tokens_plus_special_ones(tmp_path):
    rows = [[5, 5, 5, 7, 7, 9], [5, 7, 11, 11, 11, 11], [13], [5, 9, 9]] * 5
    f = _regenerated(tmp_path / "r.jsonl", rows)
    ids, meta = build_draft_vocab(StubTokenizer(), 50, 4, sharegpt=0, data_files=[f], progress=False)
    counts = Counter(t for r in rows for t in r)
    # 2 forced special ids (0, 2) + the two most frequent answer tokens
    top2 = [t for t, _ in counts.most_common(2)]
    assert ids.tolist() == sorted([0, 2, *top2])
    assert meta["size"] == 4 and meta["texts"] == len(rows) and meta["tokens"] == sum(counts.values())
    assert meta["coverage"] == pytest.approx(sum(counts[t] for t in top2) / sum(counts.values()), abs=1e-5)
    assert 0 < meta["held_out_coverage"] <= 1
    with pytest.raises(ValueError, match="no texts"):
        build_draft_vocab(StubTokenizer(), 50, 4, sharegpt=0, data_files=[], progress=False)


def test_sharegpt_answers_are_assistant_turns():
    answers = list(sharegpt_answers(limit=3, max_chars=50))
    assert len(answers) == 3 and all(isinstance(a, str) and 0 < len(a) <= 50 for a in answers)


def test_special_token_ids_include_eos_lists():
    class T:
        all_special_ids = [3, 1]
        eos_token_id = [7, 1]

    assert special_token_ids(T()) == [1, 3, 7]


def test_cli_writes_a_loadable_file(tmp_path):
    f = _regenerated(tmp_path / "r.jsonl", [[10, 11, 12, 10], [10, 400, 12]] * 4)
    argv = f"train vocab --sharegpt 0 --data {f} --size 64 --out {tmp_path / 'd'}".split()
    assert cli.main(argv) == 0
    ids = load_draft_vocab(tmp_path / "d" / DRAFT_VOCAB_FILE, 49152)
    assert ids.numel() == 64 and {10, 11, 12, 400} <= set(ids.tolist())
    body = json.loads((tmp_path / "d" / DRAFT_VOCAB_FILE).read_text())
    assert body["vocab_size"] == 49152 and body["sources"]["data_files"] == ["r.jsonl"]
