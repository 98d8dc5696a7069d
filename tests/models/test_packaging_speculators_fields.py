# SPDX-License-Identifier: Apache-2.0
"""speculators fields read and written as the speculators package (0.9.0) does: absent layer-config fields at
its config class's values, the top-level dtype, no Markov feature claimed without a Markov head."""

import json

from dspark.models import packagings
from dspark.models.packagings import speculators
from tests.models.drafter_fixtures import tiny_qwen3_target
from tests.models.packaging_fixtures import QWEN3, write_speculators_dspark
from tests.models.test_packagings import deepspec_like, rand


def _config(folder):
    return json.loads((folder / "config.json").read_text())


def test_absent_layer_fields_take_the_config_class_values():
    given = {k: v for k, v in QWEN3.items() if k not in ("head_dim", "num_key_value_heads")}
    filled = speculators.layer_config(given)
    # Qwen3Config's defaults, not hidden_size / heads (= 8) and heads (= 4) as dspark's own reader assumes
    assert filled["head_dim"] == 128 and filled["num_key_value_heads"] == 32
    assert {k: filled[k] for k in given} == given  # what is given is kept
    whole = {**QWEN3, "num_hidden_layers": 2}
    assert speculators.layer_config(whole) == whole  # nothing absent: unchanged


def test_a_config_its_class_refuses_is_read_as_given():
    odd = {"model_type": "no-such-model-type", "hidden_size": 32}
    assert speculators.layer_config(odd) == odd


def test_the_top_level_dtype_is_read(tmp_path):
    sp = write_speculators_dspark(tmp_path / "sp", rand(), tiny_qwen3_target(), None)
    doc = _config(sp)
    for key in ("dtype", "torch_dtype"):
        doc["transformer_layer_config"].pop(key, None)
        doc.pop(key, None)
    (sp / "config.json").write_text(json.dumps(doc))
    assert packagings.read(sp).config.get("dtype") is None  # negative control: no dtype anywhere
    doc["dtype"] = "bfloat16"  # where speculators' save_pretrained writes it
    (sp / "config.json").write_text(json.dumps(doc))
    assert packagings.read(sp).config["dtype"] == "bfloat16"


def test_no_markov_feature_is_claimed_without_a_markov_head(tmp_path):
    # speculators refuses confidence_head_with_markov=true with markov_rank 0 (models/dspark/core.py)
    src = deepspec_like(tmp_path, "ds", rand(rank=0, confidence=True), rank=0, opts={"confidence": True})
    packagings.convert(src, tmp_path / "sp", "speculators")
    doc = _config(tmp_path / "sp")
    assert doc["speculators_model_type"] == "dspark" and doc["markov_rank"] == 0
    assert doc["enable_confidence_head"] is True and doc["confidence_head_with_markov"] is False
    # with a Markov head the feature is written as configured
    src = deepspec_like(tmp_path, "ds2", rand(rank=6, confidence=True), opts={"confidence": True})
    packagings.convert(src, tmp_path / "sp2", "speculators")
    assert _config(tmp_path / "sp2")["confidence_head_with_markov"] is True
