# SPDX-License-Identifier: Apache-2.0
"""Bad checkpoint files: each error names the file (or the config field) and what was expected."""

from __future__ import annotations

import json
import re

import pytest

from dspark import DSparkDrafter
from dspark.models.config import DrafterConfig
from tests.models.drafter_fixtures import random_checkpoint, tiny_config


@pytest.fixture
def ckpt(tmp_path):
    random_checkpoint(tmp_path / "d", tiny_config("vanilla", 6))
    return tmp_path / "d"


@pytest.mark.parametrize("keep", [0, 5, 100, -16], ids=["empty", "5-bytes", "100-bytes", "no-tail"])
def test_truncated_weights_name_the_file(ckpt, keep):
    f = ckpt / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:keep])
    why = "empty \\(0 bytes\\)" if keep == 0 else "truncated or not a safetensors file"
    with pytest.raises(ValueError, match=f"{re.escape(str(f))}: {why}"):
        DSparkDrafter.from_pretrained(ckpt)


def test_missing_or_bad_shard_names_the_file(ckpt):
    (ckpt / "model.safetensors").rename(ckpt / "model-00001-of-00002.safetensors")
    index = ckpt / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"fc.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(FileNotFoundError, match=re.escape(str(ckpt / "model-00002-of-00002.safetensors"))):
        DSparkDrafter.from_pretrained(ckpt)
    index.write_text('{"weight_map": ')
    with pytest.raises(ValueError, match=f"{re.escape(str(index))}: not valid JSON"):
        DSparkDrafter.from_pretrained(ckpt)
    index.write_text('{"metadata": {}}')
    with pytest.raises(ValueError, match=f"{re.escape(str(index))}: expected .*'weight_map'"):
        DSparkDrafter.from_pretrained(ckpt)


@pytest.mark.parametrize("text", ["{not json", "", "\xff\xfe garbage"])
def test_config_that_is_not_json_names_the_file(ckpt, text):
    p = ckpt / "config.json"
    p.write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match=f"{re.escape(str(p))}: not valid JSON"):
        DSparkDrafter.from_pretrained(ckpt)


def test_config_that_is_not_an_object_names_the_file(ckpt):
    p = ckpt / "config.json"
    p.write_text("[1, 2]")
    with pytest.raises(ValueError, match=f"{re.escape(str(p))}: .*expected a JSON object, got a list"):
        DSparkDrafter.from_pretrained(ckpt)


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("block_size", "seven", "an int"),
        ("block_size", 7.5, "an int"),
        ("hidden_size", True, "an int"),
        ("mask_token_id", None, "missing"),
        ("num_key_value_heads", "2", "an int"),
        ("num_target_layers", [6], "an int"),
        ("markov_rank", "6", "an int"),
        ("target_layer_ids", "0,2,4", "a list of ints"),
        ("target_layer_ids", [0, "2", 4], "a list of ints"),
        ("markov_head_type", 3, "a string"),
        ("enable_confidence_head", "false", "a bool"),
        ("confidence_head_with_markov", 1, "a bool"),
        ("rms_norm_eps", "1e-6", "a number"),
    ],
)
def test_config_field_of_the_wrong_type_names_it(ckpt, field, value, expected):
    cfg = tiny_config("vanilla", 6)
    cfg[field] = value
    p = ckpt / "config.json"
    p.write_text(json.dumps(cfg))
    needle = f"{re.escape(str(p))}: drafter config: .*{field}.*{expected}"
    with pytest.raises(ValueError, match=needle):
        DSparkDrafter.from_pretrained(ckpt)
    with pytest.raises(ValueError, match=f"{field}.*{expected}"):
        DrafterConfig.from_dict(cfg)


def test_rope_theta_of_the_wrong_type_names_where_it_was_read():
    cfg = tiny_config("vanilla", 6)
    cfg["rope_parameters"]["rope_theta"] = "big"
    with pytest.raises(ValueError, match=r"rope_parameters\.rope_theta.*a number, got 'big'"):
        DrafterConfig.from_dict(cfg)
    old = tiny_config("vanilla", 6, rope_style="theta")
    old["rope_theta"] = None  # null: the default, as before
    assert DrafterConfig.from_dict(old).rope_theta == 10000.0


def test_well_typed_values_still_parse():
    cfg = tiny_config("vanilla", 6)
    cfg.update(rms_norm_eps=1, markov_rank=None, num_target_layers=None)  # an int where a float is fine
    c = DrafterConfig.from_dict(cfg)
    assert c.rms_norm_eps == 1.0 and isinstance(c.rms_norm_eps, float)
    assert c.markov_rank == 0 and c.num_target_layers is None


def test_unknown_dtype_is_an_error_not_the_default(ckpt):
    with pytest.raises(ValueError, match="dtype: expected a torch dtype or one of .*got 'fp8'"):
        DSparkDrafter.from_pretrained(ckpt, dtype="fp8")
