# SPDX-License-Identifier: Apache-2.0
import json

from dspark.training.curves import plot_curves, read_log


def test_resumed_steps_keep_their_last_value_and_the_plot_is_written(tmp_path):
    log = tmp_path / "train_log.jsonl"
    rows = [
        {"step": 10, "loss": 3.0, "tau_estimate": 1.1},
        {"step": 20, "loss": 2.5, "tau_estimate": 1.3},
        {"step": 20, "loss": 2.4, "tau_estimate": 1.35},  # written again after a resume
        {"step": 30, "loss": 2.0, "tau_estimate": 1.6},
    ]
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = read_log(log)
    assert [r["step"] for r in got] == [10, 20, 30] and got[1]["loss"] == 2.4
    out = tmp_path / "curves.png"
    plot_curves({"a": log}, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
