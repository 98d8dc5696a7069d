# SPDX-License-Identifier: Apache-2.0
"""TargetAdapter vs Hugging Face's own forward with a DynamicCache, per request, on tiny random models."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from torch import nn

from dspark.kv import KVPoolExhausted
from dspark.models.target import TargetAdapter, TargetInput, UnsupportedModelError
from tests.models.tiny import FAMILIES, tiny_config, tiny_model

ATOL = 1e-4
LATE = 100  # id of the request that joins mid-way


class HFRequest:
    """One request run through HF's own forward and DynamicCache (the oracle)."""

    def __init__(self, model):
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache(config=model.config)

    @torch.no_grad()
    def step(self, tokens: list[int]):
        out = self.model(
            input_ids=torch.tensor([tokens]), cache=self.cache, use_cache=True, output_hidden_states=True
        )
        return out.logits[0], [h[0] for h in out.hidden_states]

    def truncate(self, length: int) -> None:
        remove = self.cache.get_seq_length() - length
        if remove:
            self.cache.crop(-remove)  # transformers 5 takes the (negative) number of tokens to drop


def _check(out, i, ref_logits, ref_hidden, layers, model, rows=None):
    got = out.request_logits(i)
    want = ref_logits if rows is None else ref_logits[rows]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    L = model.config.num_hidden_layers
    for layer in layers:
        h = out.request_hidden(layer, i)
        if layer < L - 1:
            torch.testing.assert_close(h, ref_hidden[layer + 1], atol=ATOL, rtol=0)
        else:  # HF's last hidden state is after the final norm; the adapter returns the layer's raw output
            torch.testing.assert_close(model.model.norm(h), ref_hidden[L], atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_matches_hf_dynamic_cache_over_ragged_rounds(family):
    model = tiny_model(family, seed=1)
    ref_model = copy.deepcopy(model)
    adapter = TargetAdapter(model, page_size=4, num_pages=2)  # small pages, and the pool must grow
    rng = random.Random(family)
    V, L = model.config.vocab_size, model.config.num_hidden_layers
    layers = [0, L - 1]
    prompt_lens = [1, 5, 16, 23, 9, 40]
    refs = {}
    batch = []
    for rid, n in enumerate(prompt_lens):
        adapter.add_request(rid)
        refs[rid] = HFRequest(ref_model)
        batch.append(TargetInput(rid, [rng.randrange(V) for _ in range(n)], logits="all"))
    out = adapter.forward(batch, layers=layers)
    for i, it in enumerate(batch):
        _check(out, i, *refs[it.rid].step(list(it.tokens)), layers, model)
    # a late request joins; it prefills in the same forward as the others verify
    late_prompt = [rng.randrange(V) for _ in range(11)]
    for rnd in range(4):
        rids = sorted(rng.sample(sorted(refs), k=rng.randint(2, len(refs))))
        batch = [TargetInput(r, [rng.randrange(V) for _ in range(rng.randint(1, 8))]) for r in rids]
        if rnd == 1:
            adapter.add_request(LATE)
            refs[LATE] = HFRequest(ref_model)
            batch.insert(1, TargetInput(LATE, late_prompt, logits=[0, 10]))
        out = adapter.forward(batch, layers=layers)
        for i, it in enumerate(batch):
            ref_logits, ref_hidden = refs[it.rid].step(list(it.tokens))
            rows = it.logits if isinstance(it.logits, list) else None
            _check(out, i, ref_logits, ref_hidden, layers if rows is None else [], model, rows)
        for it in batch:  # accept a prefix of the verified tokens, reject the rest
            if isinstance(it.logits, list):  # the late request's prefill: keep it
                continue
            committed = adapter.length(it.rid) - rng.randint(0, len(it.tokens))
            adapter.truncate(it.rid, committed)
            refs[it.rid].truncate(committed)
    adapter.pool.check()
    for rid in refs:
        adapter.finish(rid)
    assert adapter.pool.used_pages == 0


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_reverify_after_truncation_equals_never_writing_rejected_rows(family):
    model = tiny_model(family, seed=2)
    a = TargetAdapter(model, page_size=4)
    prompt, drafts, accepted, nxt = list(range(10, 23)), [5, 6, 7, 8, 9, 1], 2, [40, 41, 42]
    for rid in ("x", "y"):
        a.add_request(rid)
    a.forward([("x", prompt), ("y", prompt)])
    a.forward([("x", drafts)])  # x writes 6 rows, keeps 2
    a.truncate("x", len(prompt) + accepted)
    a.forward([("y", drafts[:accepted])])  # y never writes the rejected rows
    out = a.forward([("x", nxt), ("y", nxt)], layers=[1])
    torch.testing.assert_close(out.request_logits(0), out.request_logits(1), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.request_hidden(1, 0), out.request_hidden(1, 1), atol=1e-5, rtol=0)
    # and re-verifying the same rows after a truncation reproduces them
    a.truncate("x", len(prompt) + accepted)
    again = a.forward([("x", nxt)])
    torch.testing.assert_close(again.request_logits(0), out.request_logits(0), atol=1e-5, rtol=0)


def test_logit_row_selection_and_positions():
    model = tiny_model("llama", seed=3)
    a = TargetAdapter(model)
    a.add_request(0)
    full = a.forward([TargetInput(0, list(range(1, 9)), logits="all")])
    a.truncate(0, 0)
    last = a.forward([TargetInput(0, list(range(1, 9)), logits="last")])
    a.truncate(0, 0)
    none = a.forward([TargetInput(0, list(range(1, 9)), logits="none")])
    assert full.logits.shape == (8, model.config.vocab_size)
    torch.testing.assert_close(last.logits, full.logits[-1:], atol=1e-5, rtol=0)
    assert none.logits.shape[0] == 0
    a.truncate(0, 0)
    explicit = a.forward([TargetInput(0, list(range(1, 9)), positions=list(range(8)))])
    torch.testing.assert_close(explicit.logits, full.logits, atol=1e-6, rtol=0)


def test_forward_runs_in_inference_mode_and_caches_stay_usable():
    # documented: outputs are inference tensors (clone to modify); a pool that grows inside a forward
    # reallocates the caches there, and later forwards and truncations must still work on them
    a = TargetAdapter(tiny_model("llama", seed=5), page_size=4, num_pages=2)
    a.add_request(0)
    out = a.forward([TargetInput(0, list(range(1, 20)))], layers=[0])
    assert out.logits.is_inference() and out.hidden[0].is_inference()
    assert not torch.is_inference_mode_enabled()
    a.truncate(0, 10)
    again = a.forward([TargetInput(0, list(range(11, 20)), positions=list(range(10, 19)))])
    torch.testing.assert_close(again.logits, out.logits[10:], atol=1e-5, rtol=0)
    editable = out.logits.clone()
    editable += 1  # a clone is an ordinary tensor


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_skips_transformers_mask_preparation(family, monkeypatch):
    # transformers' packed-sequence check reads position_ids back to the host: a device sync every forward
    import transformers.masking_utils as mu

    def fail(*args, **kwargs):
        raise AssertionError("transformers prepared an attention mask (find_packed_sequence_indices ran)")

    monkeypatch.setattr(mu, "find_packed_sequence_indices", fail)
    a = TargetAdapter(tiny_model(family, seed=4))
    try:
        a.add_request(0)
        a.add_request(1)
        out = a.forward([TargetInput(0, [1, 2, 3, 4]), TargetInput(1, [5, 6])])
        assert out.logits.shape[0] == 6
    finally:
        a.close()


def test_pool_exhaustion_changes_nothing():
    model = tiny_model("llama", seed=4)
    a = TargetAdapter(model, page_size=4, max_pages=4)
    a.add_request(0)
    a.add_request(1)
    a.forward([(0, list(range(8)))])
    before = a.forward  # noqa: F841
    with pytest.raises(KVPoolExhausted):
        a.forward([(0, [1, 2, 3]), (1, list(range(9)))])
    assert a.length(0) == 8 and a.length(1) == 0
    a.pool.check()
    out = a.forward([(1, list(range(8)))])
    assert out.logits.shape[0] == 8


def test_unsupported_models_get_a_clear_error():
    from transformers import LlamaModel

    with pytest.raises(
        UnsupportedModelError, match="LlamaModel is not supported: .*not a causal LM.*tested families"
    ):
        TargetAdapter(LlamaModel(tiny_config("llama")))
    with pytest.raises(UnsupportedModelError, match="Linear is not supported: it is not a transformers"):
        TargetAdapter(nn.Linear(2, 2))


def test_sliding_window_past_the_window_is_refused():
    from transformers import AutoModelForCausalLM, MistralConfig

    cfg = tiny_config("mistral")
    cfg = MistralConfig(**{**cfg.to_dict(), "sliding_window": 8})
    a = TargetAdapter(AutoModelForCausalLM.from_config(cfg).eval())
    a.add_request(0)
    a.forward([(0, list(range(8)))])
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        a.forward([(0, [1])])
    assert a.length(0) == 8


def _count_dense_calls(monkeypatch):
    import dspark.models.target as target_module

    calls = []
    real = target_module.dense_prefill_attention

    def counted(*args):
        calls.append(args[0].shape[0])
        return real(*args)

    monkeypatch.setattr(target_module, "dense_prefill_attention", counted)
    return calls


@pytest.mark.parametrize("family", FAMILIES)
def test_dense_prefill_route_matches_hf_and_writes_the_cache_later_rounds_read(family, monkeypatch):
    """A prefill of new requests through dense SDPA attention (the CUDA default for long prompts; forced here on
    CPU) gives HF's logits and hidden states, and the verify rounds after it read a correct cache."""
    calls = _count_dense_calls(monkeypatch)
    model = tiny_model(family, seed=3)
    ref_model = copy.deepcopy(model)
    adapter = TargetAdapter(model, page_size=4, dense_prefill_min_rows=8)
    rng = random.Random(f"dense-{family}")
    V, L = model.config.vocab_size, model.config.num_hidden_layers
    layers = [0, L - 1]
    refs = {}
    batch = []
    for rid, n in enumerate([3, 17, 30]):
        adapter.add_request(rid)
        refs[rid] = HFRequest(ref_model)
        batch.append(TargetInput(rid, [rng.randrange(V) for _ in range(n)], logits="all"))
    out = adapter.forward(batch, layers=layers)
    assert calls == [50] * L  # every layer, the whole packed batch
    for i, it in enumerate(batch):
        _check(out, i, *refs[it.rid].step(list(it.tokens)), layers, model)
    # verify rounds (cached context: the paged op), one with a late request's long prefill mixed in
    for rnd in range(3):
        batch = [TargetInput(r, [rng.randrange(V) for _ in range(rng.randint(1, 6))]) for r in sorted(refs)]
        if rnd == 1:
            adapter.add_request(LATE)
            refs[LATE] = HFRequest(ref_model)
            batch.append(TargetInput(LATE, [rng.randrange(V) for _ in range(20)]))
        out = adapter.forward(batch, layers=layers)
        for i, it in enumerate(batch):
            _check(out, i, *refs[it.rid].step(list(it.tokens)), layers, model)
    assert len(calls) == L  # none of these was a prefill of new requests only
    # new requests whose prompts are all shorter than the threshold keep the paged op
    for rid in (200, 201):
        adapter.add_request(rid)
    adapter.forward([(200, [1, 2, 3]), (201, list(range(7)))])
    assert len(calls) == L


def test_dense_prefill_default_and_argument_check():
    model = tiny_model("llama", seed=0)
    assert TargetAdapter(model).dense_prefill_min_rows == 0  # off on CPU
    with pytest.raises(ValueError, match="dense_prefill_min_rows"):
        TargetAdapter(model, dense_prefill_min_rows=-1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_dense_prefill_equals_the_paged_op(dtype):
    """On CUDA a long prefill takes SDPA by default; logits and the next verify round match the paged op's."""
    model = tiny_model("llama", seed=4).to("cuda", dtype)
    rng = random.Random(4)
    prompts = {0: [rng.randrange(97) for _ in range(200)], 1: [rng.randrange(97) for _ in range(150)]}
    drafts = {0: [5, 6, 7], 1: [8, 9]}
    outs = []
    for min_rows in (None, 0):  # one adapter at a time: close() restores the model's attention
        adapter = TargetAdapter(model, page_size=16, dense_prefill_min_rows=min_rows)
        assert adapter.dense_prefill_min_rows == (128 if min_rows is None else 0)
        for rid in prompts:
            adapter.add_request(rid)
        pre = adapter.forward([TargetInput(r, p, logits="all") for r, p in prompts.items()])
        ver = adapter.forward([TargetInput(r, d) for r, d in drafts.items()])
        outs.append((pre.logits.float(), ver.logits.float()))
        adapter.close()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    for got, want in zip(outs[0], outs[1], strict=True):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_embedding_tap_minus_one_is_hf_hidden_states_0(family):
    """Layer -1 (DeepSpec's embedding tap) is HF's hidden_states[0], in a prefill and in a later verify step."""
    model = tiny_model(family, seed=6)
    ref = HFRequest(copy.deepcopy(model))
    adapter = TargetAdapter(model, page_size=4)
    adapter.add_request("a")
    L = model.config.num_hidden_layers
    for tokens in ([3, 1, 4, 1, 5, 9, 2, 6], [5, 3]):
        out = adapter.forward([("a", tokens, "all")], layers=[-1, 1])
        _check(out, 0, *ref.step(tokens), [-1, 1], model)
    with pytest.raises(ValueError, match=r"outside \[-1, 3\)"):
        adapter.forward([("a", [1])], layers=[-2])
    with pytest.raises(ValueError, match="outside"):
        adapter.forward([("a", [1])], layers=[L])
