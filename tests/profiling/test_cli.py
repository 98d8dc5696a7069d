# SPDX-License-Identifier: Apache-2.0
"""``dspark profile`` end to end on a tiny random Llama saved to disk."""

import json

import torch

from dspark import Planner, SpsTable
from dspark.cli import main
from dspark.profiling import CostTable
from tests.models.tiny import tiny_model


def test_profile_command(tmp_path, capsys):
    torch.set_num_threads(1)
    model_dir = tmp_path / "tiny-llama"
    tiny_model("llama", layers=4).save_pretrained(model_dir)
    out = tmp_path / "profile"
    rc = main(
        [
            "profile", "--target", str(model_dir), "--drafter", "random", "--out", str(out),
            "--batch-sizes", "1,2", "--context", "16", "--repeats", "2", "--warmup", "1",
            "--block-size", "3", "--markov-rank", "8", "--quiet",
        ]
    )  # fmt: skip
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == ["costs.json", "profile.png", "sps.json"]
    costs = CostTable.load(out / "costs.json")
    assert costs.batch_sizes == (1, 2) and [d.num_requests for d in costs.draft] == [1, 2]
    assert costs.metadata["target"] == "tiny-llama" and costs.metadata["context_length"] == 16
    assert costs.metadata["drafter"]["block_size"] == 3 and costs.metadata["repeats"] == 2
    raw = json.loads((out / "sps.json").read_text())
    assert set(raw) == {"sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"}
    sps = SpsTable.load(out / "sps.json")
    assert sps.sample_batch_tokens == tuple(range(1, 9)) and sps.max_batch_tokens == 8
    rates = sps.sample_steps_per_sec
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))
    assert Planner("early_stop", out / "costs.json").cost_table == costs
    assert (out / "profile.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "verify forward (ms)" in printed and "R=2" in printed and "sps.json" in printed


def test_profile_times_a_checkpoint_in_the_asked_dtype(tmp_path):
    from dspark import DSparkDrafter

    torch.set_num_threads(1)
    model_dir = tmp_path / "tiny-llama"
    target = tiny_model("llama", layers=4)
    target.save_pretrained(model_dir)
    DSparkDrafter.from_config(target, block_size=3, num_layers=1, markov_rank=8).save_pretrained(
        tmp_path / "d", include_embeddings=False
    )
    out = tmp_path / "profile"
    argv = ["profile", "--target", str(model_dir), "--drafter", str(tmp_path / "d"), "--out", str(out)]
    argv += [
        "--batch-sizes",
        "1",
        "--context",
        "8",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--quiet",
        "--no-plot",
    ]
    assert main([*argv, "--drafter-dtype", "bfloat16"]) == 0
    meta = CostTable.load(out / "costs.json").metadata
    assert meta["drafter"]["dtype"] == "bfloat16" and meta["dtype"] == "float32"  # the target stays fp32
