# SPDX-License-Identifier: Apache-2.0
"""`dspark calibrate` end to end on a tiny random target and drafter (the target loader is replaced)."""

import json

import pytest
import torch

from dspark import cli
from dspark.calibration import CalibrationData
from dspark.decoding.acceptance import AcceptanceTable
from dspark.decoding.inputs import load_sts
from dspark.decoding.lookup import EXTENT_BOUNDS
from dspark.models import loading
from tests.decoding.toy_models import random_drafter, tiny_target


class ByteTokenizer:
    """Characters -> ids modulo a small vocabulary; enough for chat prompts and decoded text."""

    eos_token_id = 0

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def __len__(self) -> int:
        return self.vocab

    def apply_chat_template(self, msgs, add_generation_prompt=True, tokenize=True):
        text = "".join(m["content"] for m in msgs)
        return [1 + ord(ch) % (self.vocab - 1) for ch in text][:24] or [1]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    target = tiny_target("llama", seed=0)
    drafter_dir = tmp_path / "drafter"
    random_drafter(target, block_size=3).save_pretrained(drafter_dir)
    tok = ByteTokenizer(96)
    monkeypatch.setattr(loading, "load_target", lambda spec: (target, tok))
    prompts = tmp_path / "prompts.jsonl"
    # the repeated sums give the lookup prior matches (the tokenizer keeps 24 characters)
    rows = [{"turns": [f"{i}+{i}=" * 6 + f"? question number {i}", "a later turn"]} for i in range(7)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return drafter_dir, prompts


def test_calibrate_writes_sts_metrics_and_plot(setup, tmp_path, capsys):
    drafter_dir, prompts = setup
    out = tmp_path / "out"
    argv = ["calibrate", "--target", "tiny", "--drafter", str(drafter_dir), "--prompts", str(prompts)]
    argv += ["--skip", "1", "--limit", "5", "--max-new-tokens", "8", "--temperature", "1.0"]
    argv += ["--out", str(out)]
    assert cli.main(argv + ["--save-data"]) == 0
    printed = capsys.readouterr().out
    assert "ECE" in printed and "AUROC" in printed and "Brier" in printed and "->" in printed
    sts = json.loads((out / "sts.json").read_text())
    assert len(sts["temperatures"]) == 3 and all(t > 0 for t in sts["temperatures"])
    assert {"dataset", "num_samples", "ece_before", "ece_after", "auroc_after", "brier_after"} <= sts.keys()
    assert sts["dataset"] == str(prompts) and sts["label"] == "prob"
    assert all(a <= b + 1e-12 for a, b in zip(sts["ece_after"], sts["ece_before"], strict=True))
    # affine STS by default, with held-out ECE over request folds
    assert sts["sts"] == "affine" and len(sts["biases"]) == 3 and len(sts["ece_heldout"]) == 3
    # the decoder loads what calibrate writes
    t, b = load_sts(out / "sts.json", 3)
    torch.testing.assert_close(t, torch.tensor(sts["temperatures"]))
    torch.testing.assert_close(b, torch.tensor(sts["biases"]))
    metrics = json.loads((out / "calibration_metrics.json").read_text())
    assert metrics["gamma"] == 3 and metrics["num_samples"] == sts["num_samples"] > 0
    assert len(metrics["before"]["ece"]) == len(metrics["after"]["auroc"]) == 3
    assert metrics["heldout_folds"] == 2 and metrics["heldout"]["ece"] == sts["ece_heldout"]
    png = (out / "reliability.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    data = CalibrationData.load(out / "calibration_data.pt")
    assert data.num_samples == sts["num_samples"]
    assert set(data.request_ids.tolist()) == set(range(5))  # --skip 1 --limit 5 -> five prompts

    # the lookup prior, counted on the prompts and outputs of the run: loadable, as wide as a hybrid decoder's
    # lookup blocks (16 for γ = 3)
    assert str(out / "lookup_prior.json") in printed
    prior = json.loads((out / "lookup_prior.json").read_text())
    assert (prior["format"], prior["kind"], prior["gamma"]) == ("dspark-acceptance", "lookup", 16)
    assert (prior["min_match"], prior["max_match"], prior["temperature"]) == (2, 4, 1.0)
    # classes: match lengths 0..4, then one per extent bound past 4
    assert prior["extent_bounds"] == list(EXTENT_BOUNDS)
    assert str(prompts) in prior["source"] and len(prior["trials"]) == 5 + len(EXTENT_BOUNDS)
    # one proposal at least per prompt (its suffix "i+i=" occurred before), at most one per generated token
    assert 5 <= sum(row[0] for row in prior["trials"]) <= 5 * 8 and prior["trials"][0] == [0] * 16
    assert sum(row[0] for row in prior["trials"][4:]) >= 5
    table = AcceptanceTable.load(out / "lookup_prior.json")
    assert table.to_dict() == prior and (table.num_classes, table.gamma) == (5 + len(EXTENT_BOUNDS), 16)

    # refit from the saved rows: the same temperatures come back; saved rows carry no sequences
    out2 = tmp_path / "refit"
    assert cli.main(["calibrate", "--data", str(out / "calibration_data.pt"), "--out", str(out2)]) == 0
    assert json.loads((out2 / "sts.json").read_text())["temperatures"] == sts["temperatures"]
    assert "lookup_prior.json is not written" in capsys.readouterr().err
    assert not (out2 / "lookup_prior.json").exists()
    # SGLang's temperature-only STS, without held-out metrics: no offsets in the file, none loaded
    out3 = tmp_path / "temperature"
    argv3 = ["calibrate", "--data", str(out / "calibration_data.pt"), "--out", str(out3)]
    assert cli.main(argv3 + ["--sts", "temperature", "--folds", "0"]) == 0
    sts3 = json.loads((out3 / "sts.json").read_text())
    assert sts3["sts"] == "temperature" and "biases" not in sts3 and "ece_heldout" not in sts3
    assert load_sts(out3 / "sts.json", 3)[1] is None

    # several saved collections are pooled, their requests kept apart
    from dspark.calibration.cli import _load_pooled

    saved = str(out / "calibration_data.pt")
    pooled = _load_pooled([saved, saved])
    assert pooled.num_samples == 2 * data.num_samples
    assert set(pooled.request_ids.tolist()) == set(range(10))  # 0..4, then 5..9
    out4 = tmp_path / "pooled"
    assert cli.main(["calibrate", "--data", saved, saved, "--out", str(out4)]) == 0
    assert json.loads((out4 / "sts.json").read_text())["num_samples"] == 2 * sts["num_samples"]


def test_prompts_longer_than_the_context_are_skipped_by_name(setup, tmp_path, capsys):
    drafter_dir, _ = setup
    target, _ = loading.load_target("tiny")
    target.config.max_position_embeddings = 64  # room: 64 - 40 new tokens - gamma 3 - 1 = 20 prompt tokens
    prompts = tmp_path / "mixed.jsonl"
    rows = ["hi", "a much longer question that fills the byte tokenizer's 24 positions", "ok"]
    prompts.write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in rows))
    argv = ["calibrate", "--target", "tiny", "--drafter", str(drafter_dir), "--prompts", str(prompts)]
    argv += ["--max-new-tokens", "40", "--out", str(tmp_path / "o"), "--save-data", "--folds", "0"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "skipping 1 prompt(s)" in err and "rows [1]" in err
    data = CalibrationData.load(tmp_path / "o" / "calibration_data.pt")
    assert set(data.request_ids.tolist()) == {0, 1}  # the two short prompts
    target.config.max_position_embeddings = 20
    with pytest.raises(ValueError, match="no prompt .* fits the target's context"):
        cli.main(argv)


def test_calibrate_greedy_label_and_missing_arguments(setup, tmp_path, capsys):
    drafter_dir, prompts = setup
    out = tmp_path / "g"
    argv = ["calibrate", "--target", "tiny", "--drafter", str(drafter_dir), "--prompts", str(prompts)]
    argv += ["--limit", "2", "--max-new-tokens", "6", "--label", "greedy", "--out", str(out)]
    assert cli.main(argv) == 0
    assert json.loads((out / "sts.json").read_text())["label"] == "greedy"
    assert cli.main(["calibrate", "--out", str(tmp_path / "x")]) == 2
    assert "--target" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--prompts"):
        cli.main(argv[:-2] + ["--skip", "100", "--out", str(out)])
