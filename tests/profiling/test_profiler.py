# SPDX-License-Identifier: Apache-2.0
"""profile_costs on a tiny random Llama and drafter: the grid it measures, fixed contexts, clean-up, metadata."""

import datetime
import statistics

import pytest
import torch

from dspark.models.target import TargetAdapter
from dspark.profiling import CostTable, profile_costs, save_plot, split_tokens
from dspark.profiling.profiler import _RID_BASE
from tests.decoding.toy_models import random_drafter
from tests.models.tiny import tiny_model

CTX = 24


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    target = tiny_model("llama", layers=4)
    return target, random_drafter(target, block_size=3, markov_rank=8)


def test_split_tokens():
    assert split_tokens(7, 3) == [3, 2, 2]
    assert split_tokens(8, 2) == [4, 4]
    assert split_tokens(1, 1) == [1]


def test_grid_contexts_and_cleanup(models):
    target, drafter = models
    adapter = TargetAdapter(target, page_size=8)
    seen_verify, seen_draft = [], []
    forward, draft = adapter.forward, drafter.draft

    def spy_forward(batch, layers=()):
        if all(len(b.tokens) <= 4 for b in batch):  # verify forwards, not the context prefill
            seen_verify.append(([adapter.length(b.rid) for b in batch], sum(len(b.tokens) for b in batch)))
        return forward(batch, layers)

    def spy_draft(ids, *a, **k):
        seen_draft.append([drafter.context_length(i) for i in ids])
        return draft(ids, *a, **k)

    adapter.forward = spy_forward
    drafter.draft = spy_draft
    try:
        table = profile_costs(
            adapter, drafter, (2, 1), context_length=CTX, repeats=3, warmup=1, progress=False
        )
    finally:
        del drafter.draft
        adapter.close()  # a caller's adapter stays open: the profiler only adds and finishes its requests
    # every R in [1, 2] x every per-request length 1..γ+1 (γ = 3)
    assert [(v.num_requests, v.batch_tokens) for v in table.verify] == [
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
        (2, 2),
        (2, 4),
        (2, 6),
        (2, 8),
    ]
    assert [d.num_requests for d in table.draft] == [1, 2] and table.block_size == 3
    # each verify forward saw exactly the context in the KV cache (truncated back after every call)
    assert len(seen_verify) == 8 * (1 + 3)
    assert all(lengths == [CTX] * len(lengths) for lengths, _ in seen_verify)
    assert sorted({b for _, b in seen_verify}) == [1, 2, 3, 4, 6, 8]
    assert len(seen_draft) == 2 * (1 + 3) and all(c == [CTX] * len(c) for c in seen_draft)
    for v in table.verify:
        assert len(v.samples_ms) == 3 and v.ms == statistics.median(v.samples_ms) and v.ms > 0
    for d in table.draft:
        assert d.ms > 0 and d.draft_ms > 0 and d.append_ms > 0 and len(d.samples_ms) == 3
    # nothing of the profiler's requests is left behind
    assert all(_RID_BASE + i not in adapter.pool for i in range(2))
    assert all(drafter.context_length(_RID_BASE + i) == 0 for i in range(2))


def test_metadata_and_round_trip(models, tmp_path):
    target, drafter = models
    table = profile_costs(
        target, drafter, (1,), context_length=CTX, repeats=1, warmup=0, progress=False, metadata={"run": "t"}
    )
    m = table.metadata
    assert m["device"] == "cpu" and m["torch_version"] == torch.__version__
    assert m["threads"] == torch.get_num_threads() and m["context_length"] == CTX and m["run"] == "t"
    assert m["target_class"] == "LlamaForCausalLM" and m["drafter"]["markov_rank"] == 8
    assert datetime.datetime.fromisoformat(m["date"]).tzinfo is not None
    # the model is back on its own attention implementation
    assert target.config._attn_implementation == "sdpa"
    table.save_json(tmp_path / "c.json")
    assert CostTable.load(tmp_path / "c.json") == table
    png = save_plot(table, tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_target_only_and_custom_grid(models):
    target, _ = models
    table = profile_costs(
        target,
        None,
        (3,),
        batch_tokens=lambda r, g: [r, 2 * r + 1],
        context_length=8,
        repeats=1,
        warmup=0,
        block_size=2,
        progress=False,
    )
    assert [(v.num_requests, v.batch_tokens) for v in table.verify] == [(3, 3), (3, 7)]
    assert table.draft == () and table.draft_ms(3) == 0.0
    assert table.to_sps(3).sample_batch_tokens == (3, 4, 5, 6, 7)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(batch_sizes=()), "batch_sizes"),
        (dict(batch_sizes=(0,)), "batch_sizes"),
        (dict(context_length=0), "context_length"),
        (dict(repeats=0), "repeats"),
        (dict(batch_tokens=lambda r, g: [r * (g + 1) + 1]), r"must lie in \[1, 4\]"),
    ],
)
def test_bad_arguments(models, kw, match):
    target, drafter = models
    with pytest.raises(ValueError, match=match):
        profile_costs(target, drafter, **{"batch_sizes": (1,), "progress": False, **kw})
