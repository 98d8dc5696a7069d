# SPDX-License-Identifier: Apache-2.0
"""The decoder's STS input: SGLang's JSON (path or dict), affine offsets, plain lists; errors name the problem;
the loaded temperatures and offsets reach the confidence head of every round."""

import json

import pytest
import torch

from dspark import DSparkDecoder
from dspark.decoding.inputs import load_sts
from tests.decoding.toy_models import random_drafter, tiny_target


def test_forms_and_truncation(tmp_path):
    path = tmp_path / "sts.json"
    path.write_text(json.dumps({"temperatures": [0.5, 1.0, 2.0, 4.0], "biases": [0.1, -0.2, 0.3, 0.0]}))
    t, b = load_sts(path, 3)  # a shorter block uses the leading positions
    assert t.tolist() == [0.5, 1.0, 2.0] and b.tolist() == pytest.approx([0.1, -0.2, 0.3])
    t2, b2 = load_sts(json.loads(path.read_text()), 3)
    assert torch.equal(t2, t) and torch.equal(b2, b)
    t3, b3 = load_sts({"temperatures": [2.0, 2.0], "biases": None}, 2)
    assert t3.tolist() == [2.0, 2.0] and b3 is None
    t4, b4 = load_sts([1.5, 0.5], 2)
    assert t4.tolist() == [1.5, 0.5] and b4 is None
    assert load_sts(None, 4) == (None, None)


@pytest.mark.parametrize(
    "sts,match",
    [
        ({"temps": [1.0, 1.0]}, "no 'temperatures'"),
        ({"temperatures": [1.0]}, "1 temperatures for block size 2"),
        ({"temperatures": [1.0, 0.0]}, "temperatures must be finite and > 0"),
        ({"temperatures": [1.0, 1.0], "biases": [0.0]}, "1 biases for block size 2"),
        ({"temperatures": [1.0, 1.0], "biases": [0.0, float("nan")]}, "biases must be finite"),
        ({"temperatures": [1.0, 1.0], "biases": ["x", 1]}, "biases must be a list of numbers"),
        ([1.0, float("inf")], "temperatures must be finite"),
    ],
)
def test_bad_sts_names_the_problem(sts, match):
    with pytest.raises(ValueError, match=match):
        load_sts(sts, 2)


def test_bad_sts_files(tmp_path):
    with pytest.raises(ValueError, match="cannot read STS JSON"):
        load_sts(tmp_path / "missing.json", 2)
    (tmp_path / "list.json").write_text("[1.0, 1.0]")
    with pytest.raises(ValueError, match="list.json. must be an object"):
        load_sts(tmp_path / "list.json", 2)
    (tmp_path / "keys.json").write_text('{"temps": [1.0, 1.0]}')
    with pytest.raises(ValueError, match="no 'temperatures' list .*keys.json"):
        load_sts(tmp_path / "keys.json", 2)


def test_every_round_applies_the_loaded_temperatures_and_offsets():
    target = tiny_target("llama", seed=3)
    drafter = random_drafter(target, block_size=3)
    t, b = [0.5, 2.0, 1.0], [0.7, -1.1, 0.2]
    seen = []
    score = drafter.score

    def spy(hidden, prev_emb, sts_t, sts_b, **copy_inputs):
        out = score(hidden, prev_emb, sts_t, sts_b, **copy_inputs)
        seen.append((sts_t, sts_b, out))
        return out

    drafter.score = spy
    dec = DSparkDecoder(target, drafter, planner="full", sts={"temperatures": t, "biases": b})
    try:
        dec.generate([[5, 6, 7], [8, 9]], max_new_tokens=6, temperature=1.0, seed=0)
    finally:
        dec.close()
    assert seen
    for t_in, b_in, (conf_logit, conf, survival) in seen:
        assert t_in.tolist() == t and b_in.tolist() == pytest.approx(b)
        want = torch.sigmoid(conf_logit / torch.tensor(t) + torch.tensor(b))
        torch.testing.assert_close(conf, want)
        assert torch.equal(survival, torch.cumprod(conf, dim=1))


def test_a_shorter_gamma_drafts_only_its_slots_with_the_first_sts_entries():
    target = tiny_target("llama", seed=4)
    drafter = random_drafter(target, block_size=4)
    seen = []
    score = drafter.score

    def spy(hidden, prev_emb, sts_t, sts_b, **copy_inputs):
        out = score(hidden, prev_emb, sts_t, sts_b, **copy_inputs)
        seen.append((sts_t, hidden, out[2]))
        return out

    drafter.score = spy
    sts = {"temperatures": [0.5, 2.0, 1.0, 3.0], "biases": [0.1, 0.2, 0.3, 0.4]}
    dec = DSparkDecoder(target, drafter, planner="full", block_size=2, sts=sts)
    try:
        plain = dec.generate([[5, 6, 7]], max_new_tokens=8, speculative=False).sequences
        spec = dec.generate([[5, 6, 7]], max_new_tokens=8).sequences
    finally:
        dec.close()
    assert spec == plain  # greedy: the target's own tokens
    assert seen
    for t_in, hidden, survival in seen:
        assert t_in.tolist() == [0.5, 2.0] and hidden.shape[1] == 2 and survival.shape[1] == 2
