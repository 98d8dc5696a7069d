# SPDX-License-Identifier: Apache-2.0
"""YaRN RoPE in the drafter: frequencies and attention factor equal transformers' ``rope_type: "yarn"``, and a
SpecForge DSpark checkpoint with YaRN loads, drafts with it (not with default RoPE) and round-trips its fields."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from dspark import DSparkDrafter
from dspark.models.config import DrafterConfig
from dspark.models.layers import Rotary, yarn_inv_freq
from tests.models.drafter_fixtures import tiny_config
from tests.models.packaging_fixtures import write_specforge_dspark
from tests.models.test_packagings import drafts, rand, target  # noqa: F401 (target: a fixture)

YARNS = [
    {"factor": 4.0, "original_max_position_embeddings": 32},
    {"factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 16.0, "beta_slow": 2.0},
    {"factor": 4.0, "original_max_position_embeddings": 32, "mscale": 0.707, "mscale_all_dim": 1.0},
    {"factor": 2.0, "original_max_position_embeddings": 48, "attention_factor": 1.3, "truncate": False},
]


@pytest.mark.parametrize("yarn", YARNS)
@pytest.mark.parametrize("head_dim, theta", [(8, 10000.0), (64, 1_000_000.0)])
def test_yarn_frequencies_equal_transformers(yarn, head_dim, theta):
    hf = Qwen3Config(
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "yarn", "rope_theta": theta, **yarn},
    )
    want, want_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    got, factor = yarn_inv_freq(head_dim, theta, yarn)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert factor == pytest.approx(want_factor, rel=1e-12)
    default = Rotary(head_dim, theta).inv_freq
    assert not torch.allclose(got, default)  # YaRN changes the low frequencies


def test_yarn_scales_cos_and_sin_by_the_attention_factor():
    r = Rotary(8, 10000.0, YARNS[3])
    cos, sin = r.cos_sin(torch.arange(5), torch.float32)
    assert cos[0].abs().max().item() == pytest.approx(1.3)  # position 0: cos 1 times the factor
    assert torch.allclose(cos**2 + sin**2, torch.full_like(cos, 1.3**2))


def test_config_reads_yarn_from_rope_parameters_or_rope_scaling_and_writes_it_back():
    for key in ("rope_parameters", "rope_scaling"):
        cfg = tiny_config()
        cfg[key] = {"rope_type": "yarn", "rope_theta": 10000.0, **YARNS[1]}
        c = DrafterConfig.from_dict(cfg)
        assert c.rope_scaling == {"rope_type": "yarn", **{k: float(v) for k, v in YARNS[1].items()}} | {
            "original_max_position_embeddings": 64
        }
        again = DrafterConfig.from_dict(c.to_dict())
        assert again.rope_scaling == c.rope_scaling
    bad = tiny_config()
    bad["rope_scaling"] = {"rope_type": "yarn", "factor": "big", "original_max_position_embeddings": 32}
    with pytest.raises(ValueError, match=r"rope_scaling \(yarn\)"):
        DrafterConfig.from_dict(bad)


def test_a_specforge_yarn_checkpoint_drafts_with_yarn(tmp_path, target):  # noqa: F811
    tensors = rand(block_size=5)
    yarn = {"rope_type": "yarn", **YARNS[0]}
    with_yarn = write_specforge_dspark(tmp_path / "yarn", tensors, rope_scaling=yarn)
    plain = write_specforge_dspark(tmp_path / "plain", tensors)
    a = DSparkDrafter.from_pretrained(with_yarn, target=target)
    b = DSparkDrafter.from_pretrained(plain, target=target)
    want, _ = yarn_inv_freq(a.config.head_dim, a.config.rope_theta, yarn)
    torch.testing.assert_close(a.rotary_emb.inv_freq, want)
    # negative control: the same weights with default RoPE draft other logits
    assert not torch.allclose(drafts(a, target, 1.0).draft_logits, drafts(b, target, 1.0).draft_logits)
    assert not a.config.sample_from_anchor  # SpecForge's block layout: it can be written back as SpecForge
    a.save_pretrained(tmp_path / "ds")
    a.save_pretrained(tmp_path / "sf2", format="specforge")
    for folder in ("ds", "sf2"):
        c = DSparkDrafter.from_pretrained(tmp_path / folder, target=target)
        assert c.config.rope_scaling == a.config.rope_scaling
        torch.testing.assert_close(drafts(c, target, 1.0).draft_logits, drafts(a, target, 1.0).draft_logits)
    doc = json.loads((tmp_path / "sf2" / "config.json").read_text())
    assert doc["rope_scaling"]["rope_type"] == "yarn" and doc["rope_scaling"]["factor"] == 4.0
