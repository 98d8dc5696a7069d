# SPDX-License-Identifier: Apache-2.0
"""speculators fields as vLLM 0.34.0 reads them (scripts/check_vllm_package.py runs vLLM's own code; these run
without vLLM): a "dflash" drafter is not made causal, and a Markov head vLLM cannot build is warned about."""

import json
import warnings

import pytest
import torch

from dspark.models import packagings
from tests.models.drafter_fixtures import random_checkpoint_tensors, tiny_config, write_checkpoint
from tests.models.test_packagings import deepspec_like, rand


def _config(folder):
    return json.loads((folder / "config.json").read_text())


def vllm_dflash_causal(doc: dict) -> bool:
    """vLLM 0.34.0's reading (algos.py update_dflash: ``dflash_config.causal = not
    doc.get("sliding_window_non_causal", True)``; qwen3_dflash.py ``_dflash_layer_causal`` applies it to every
    draft layer)."""
    return not doc.get("sliding_window_non_causal", True)


def test_a_dflash_drafter_is_not_made_causal_in_vllm(tmp_path):
    src = deepspec_like(
        tmp_path,
        "ds",
        rand(rank=0, confidence=False),
        rank=0,
        opts={"confidence": False},
        sample_from_anchor=False,
    )
    packagings.convert(src, tmp_path / "sp", "speculators")
    doc = _config(tmp_path / "sp")
    assert doc["speculators_model_type"] == "dflash"
    assert doc["sliding_window_non_causal"] is True
    assert vllm_dflash_causal(doc) is False  # dspark's block attends bidirectionally
    # negative control: the value written before the fix made vLLM run every draft layer causally
    assert vllm_dflash_causal({**doc, "sliding_window_non_causal": False}) is True


def test_the_written_value_reads_back(tmp_path):
    src = deepspec_like(tmp_path, "ds", rand())
    packagings.convert(src, tmp_path / "sp", "speculators")
    assert _config(tmp_path / "sp")["sliding_window_non_causal"] is True
    packagings.convert(tmp_path / "sp", tmp_path / "back", "deepspec")  # dspark's reader accepts it


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_a_markov_head_vllm_cannot_build_is_warned_about(tmp_path, head):
    cfg = tiny_config(head, 6)
    t = random_checkpoint_tensors(cfg, torch.Generator().manual_seed(0), with_embeddings=False)
    src = write_checkpoint(tmp_path / "ds", cfg, t)
    with pytest.warns(UserWarning, match=f"markov_head_type '{head}'.*vLLM 0.34.0"):
        packagings.convert(src, tmp_path / "sp", "speculators")
    assert _config(tmp_path / "sp")["markov_head_type"] == head  # still written: speculators reads it


def test_a_vanilla_head_writes_without_warning(tmp_path):
    # negative control: the head vLLM builds (markov_w1 / markov_w2) raises no warning
    src = deepspec_like(tmp_path, "ds", rand())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        packagings.convert(src, tmp_path / "sp", "speculators")
    assert _config(tmp_path / "sp")["markov_head_type"] == "vanilla"
