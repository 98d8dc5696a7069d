# SPDX-License-Identifier: Apache-2.0
"""What bench_e2e_gpu runs on: randomly initialised targets of two real shapes, their drafters, the prompts and
the planner that fixes each round's verify length."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from benchmarks.bench_drafter import SMOLLM2_135M
from dspark import DSparkDrafter
from dspark.decoding.planner import Planner, PlanResult, SpsTable
from dspark.models.bundled import DEFAULT_DRAFTER, DRAFTERS_DIR

GAMMA = 7

# Qwen3-8B's published shape (Qwen/Qwen3-8B config.json)
QWEN3_8B = dict(
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=False,
)

# SmolLM2-135M scaled down for CI (--quick): same family and tied embeddings, a few thousand times smaller
SMOLLM2_TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)

# The bundled drafter's architecture, used when the package ships without its assets (read from its
# config.json otherwise): 2 layers of the target's shape, 5 taps, vanilla Markov rank 128, confidence head
BUNDLED_FALLBACK = dict(
    num_hidden_layers=2,
    target_layer_ids=[1, 8, 14, 20, 27],
    markov_rank=128,
    markov_head_type="vanilla",
    block_size=GAMMA,
    enable_confidence_head=True,
    confidence_head_with_markov=True,
)

# DeepSpec's Qwen3-8B DSpark drafter (its config/dspark/dspark_qwen3_8b.py): 5 layers of the target's shape,
# block 7, taps [1, 9, 17, 25, 33], vanilla Markov rank 256, confidence head fed the Markov embedding
DEEPSPEC_QWEN3_8B = dict(
    num_layers=5,
    target_layer_ids=[1, 9, 17, 25, 33],
    markov_rank=256,
    markov_head_type="vanilla",
    block_size=GAMMA,
    mask_token_id=151669,
    enable_confidence_head=True,
    confidence_head_with_markov=True,
)


@dataclass
class ModelSpec:
    """One benchmarked pair: the target's HF config, its family, dtype, and how its drafter is built."""

    key: str  # "A" or "B"
    name: str
    family: str  # "llama" or "qwen3"
    config: dict
    dtype: torch.dtype
    drafter: dict
    draft_vocab: str = "none"  # "bundled" (the bundled drafter's ids), "scaled" (1/6 of the ids), "none"
    canary_strict: bool = True  # a greedy mismatch fails the run
    notes: list[str] = field(default_factory=list)


def bundled_drafter_options() -> tuple[dict, str]:
    """The bundled drafter's architecture from its config.json (``(options, source)``)."""
    path = DRAFTERS_DIR / DEFAULT_DRAFTER / "config.json"
    if not path.is_file():
        return dict(BUNDLED_FALLBACK), "built-in copy (no bundled config.json in this install)"
    c = json.loads(path.read_text())
    keys = (
        "num_hidden_layers",
        "target_layer_ids",
        "markov_rank",
        "markov_head_type",
        "block_size",
        "enable_confidence_head",
        "confidence_head_with_markov",
    )
    return {k: c[k] for k in keys}, str(path.relative_to(DRAFTERS_DIR.parents[1]))


def model_specs(quick: bool, device: str, dtype_a: torch.dtype) -> list[ModelSpec]:
    """(A) and, on CUDA without --quick, (B)."""
    opts, source = bundled_drafter_options()
    drafter_a = {
        "num_layers": opts["num_hidden_layers"],
        "target_layer_ids": opts["target_layer_ids"],
        "markov_rank": opts["markov_rank"],
        "markov_head_type": opts["markov_head_type"],
        "block_size": opts["block_size"],
        "enable_confidence_head": opts["enable_confidence_head"],
        "confidence_head_with_markov": opts["confidence_head_with_markov"],
    }
    if quick:
        # scaled down with the target: 2 layers, 3 taps of its 4 layers, rank 32, a 1/6 draft vocabulary
        drafter_a.update(target_layer_ids=[0, 1, 2], markov_rank=32)
        a = ModelSpec(
            "A",
            "SmolLM2-135M-shaped, scaled down (4 layers, hidden 64, 4/2 heads x 16, V 512)",
            "llama",
            SMOLLM2_TINY,
            dtype_a,
            drafter_a,
            draft_vocab="scaled",
            notes=[f"drafter: the bundled architecture ({source}) scaled down: taps [0, 1, 2], rank 32"],
        )
        return [a]
    a = ModelSpec(
        "A",
        "SmolLM2-135M-shaped Llama (30 layers, hidden 576, 9/3 heads x 64, intermediate 1536, V 49,152, tied)",
        "llama",
        SMOLLM2_135M,
        dtype_a,
        drafter_a,
        draft_vocab="bundled",
        notes=[
            f"drafter: the bundled drafter's architecture ({source}) and its draft vocabulary, random weights"
        ],
    )
    specs = [a]
    if device == "cuda":
        specs.append(
            ModelSpec(
                "B",
                "Qwen3-8B-shaped (36 layers, hidden 4096, 32/8 heads x 128, intermediate 12288, V 151,936)",
                "qwen3",
                QWEN3_8B,
                torch.bfloat16,
                dict(DEEPSPEC_QWEN3_8B),
                canary_strict=False,
                notes=[
                    "drafter: DeepSpec's Qwen3-8B shape (5 layers, taps [1, 9, 17, 25, 33], rank 256), random",
                    "its LM head runs inside the Markov draw (markov_sample_from_hidden): the markov_sample "
                    "stage holds the LM head's time, the draft stage the backbone alone",
                    "bf16: the greedy comparison is reported, not enforced (near-ties round differently)",
                ],
            )
        )
    return specs


def build_target(spec: ModelSpec, device: torch.device) -> torch.nn.Module:
    """The random target, its parameters created on ``device`` in ``spec.dtype`` (no CPU copy, no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    cls, cfg_cls = {"llama": (LlamaForCausalLM, LlamaConfig), "qwen3": (Qwen3ForCausalLM, Qwen3Config)}[
        spec.family
    ]
    torch.manual_seed(0)
    # what transformers' _from_config(dtype=...) does, without depending on its keyword across versions
    previous = torch.get_default_dtype()
    torch.set_default_dtype(spec.dtype)
    try:
        with torch.device(device):
            model = cls(cfg_cls(**spec.config))
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def build_drafter(spec: ModelSpec, target: torch.nn.Module) -> DSparkDrafter:
    """The random drafter for ``target`` (created on the target's device, sharing its embedding / LM head)."""
    opts = dict(spec.drafter)
    if "num_hidden_layers" in opts:
        opts["num_layers"] = opts.pop("num_hidden_layers")
    torch.manual_seed(1)
    with torch.device(target.device):
        drafter = DSparkDrafter.from_config(target, dtype=spec.dtype, **opts).eval()
    vocab = int(spec.config["vocab_size"])
    if spec.draft_vocab == "bundled":
        path = DRAFTERS_DIR / DEFAULT_DRAFTER / "draft_vocab.json"
        if path.is_file():
            drafter.set_draft_vocab(json.loads(path.read_text())["token_ids"])
    elif spec.draft_vocab == "scaled":  # the bundled drafter's 8,192 of 49,152: one id in six
        gen = torch.Generator().manual_seed(2)
        drafter.set_draft_vocab(torch.randperm(vocab, generator=gen)[: vocab // 6].sort().values)
    return drafter


def describe_drafter(drafter: DSparkDrafter) -> dict[str, Any]:
    c = drafter.config
    return {
        "layers": c.num_hidden_layers,
        "block_size": c.block_size,
        "target_layer_ids": list(c.target_layer_ids),
        "markov_rank": c.markov_rank,
        "markov_head_type": c.markov_head_type,
        "confidence_head": drafter.confidence_head is not None,
        "draft_vocab": None if drafter.draft_vocab is None else int(drafter.draft_vocab.numel()),
        "dtype": str(drafter.dtype).removeprefix("torch."),
        "parameters": sum(p.numel() for p in drafter.parameters()),
    }


def random_prompts(num: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """``num`` prompts of ``length`` random token ids (equal lengths: HF's batch needs no padding)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (num, length), generator=gen).tolist()


class FixedVerifyPlanner(Planner):
    """The library's ``early_stop`` planner, run for real every round, its verify lengths then set to ``l``.

    The plan stage therefore costs what a cost-driven plan costs (``plan_verify`` on the device and the host read
    of its result, which shapes the verify batch), while the verify length is the same ``l`` for every request
    and every round: the per-``l`` round cost is measured directly instead of depending on random-weight
    confidences. ``verify_len`` is set by the benchmark before each round (a schedule of ``l`` values).
    """

    def __init__(self, gamma: int = GAMMA) -> None:
        # any non-flat table keeps early_stop from falling back to "full" (which skips the plan's host read)
        super().__init__("early_stop", SpsTable((1, 64, 512), (100.0, 90.0, 40.0), 512))
        self.gamma = gamma
        self.verify_len = gamma + 1

    def plan(self, survival: Tensor, request_ids=None, drafter: bool = True) -> PlanResult:
        result = super().plan(survival, request_ids, drafter)
        n = int(self.verify_len)
        if not 1 <= n <= survival.shape[1] + 1:
            raise ValueError(f"FixedVerifyPlanner: verify length {n} outside [1, {survival.shape[1] + 1}]")
        verify_len = torch.full_like(result.verify_len, n)
        budget = torch.full_like(result.budget, survival.shape[0] * (n - 1))
        return PlanResult(verify_len, budget, "fixed")
