# SPDX-License-Identifier: Apache-2.0
"""Philox4x32-10: published known answers, the keyed draw against its pure-Python reference, statistics."""

import math

import pytest
import torch

import dspark
from dspark import _C
from dspark.reference import philox4x32_10_ref, philox_draw_ref

# Random123's kat_vectors for philox4x32 with 10 rounds: counter[4], key[2] -> output[4].
KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    (
        [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
        [0xA4093822, 0x299F31D0],
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
    ),
]


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_known_answers(ctr, key, expected):
    assert list(_C.philox4x32_10(ctr, key)) == expected
    assert philox4x32_10_ref(ctr, key) == expected


def _keys(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    request = torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)
    position = torch.randint(0, 2**16, (n,), generator=g, dtype=torch.int64)
    index = torch.randint(0, 2**34, (n,), generator=g, dtype=torch.int64)
    return request, position, index


@pytest.mark.parametrize("seed,offset,purpose", [(0, 0, 0), (2**63 - 1, 12345, 1), (77, 2**40 + 3, 65535)])
def test_matches_reference(seed, offset, purpose):
    request, position, index = _keys(300)
    u, g = dspark.ops.philox_draw(seed, offset, request, position, purpose, index)
    ur, gr = philox_draw_ref(seed, offset, request, position, purpose, index)
    assert torch.equal(u, ur)  # the uniform is exact
    # gumbel via the shared fp32 log: within a few ulp of the fp64 value
    torch.testing.assert_close(g, gr, atol=4e-7, rtol=4e-7)


def test_uniform_open_interval_and_moments():
    n = 200_000
    i = torch.arange(n)
    u, g = dspark.ops.philox_draw(1234, 5, i % 7, i % 3, 1, i)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.double().mean()) - 0.5) < 4 * math.sqrt(1 / 12 / n)
    # standard Gumbel: mean = Euler-Mascheroni, variance = pi^2 / 6
    assert abs(float(g.double().mean()) - 0.5772156649) < 4 * math.sqrt(math.pi**2 / 6 / n)
    assert abs(float(g.double().var()) - math.pi**2 / 6) < 0.05


def test_streams_differ_by_every_key_component():
    i = torch.arange(64)
    z = torch.zeros_like(i)
    base = dspark.ops.philox_draw(1, 2, z, z, 3, i)[0]
    variants = [
        dspark.ops.philox_draw(9, 2, z, z, 3, i)[0],
        dspark.ops.philox_draw(1, 9, z, z, 3, i)[0],
        dspark.ops.philox_draw(1, 2 + 2**32, z, z, 3, i)[0],
        dspark.ops.philox_draw(1, 2, z + 1, z, 3, i)[0],
        dspark.ops.philox_draw(1, 2, z, z + 1, 3, i)[0],
        dspark.ops.philox_draw(1, 2, z, z, 4, i)[0],
    ]
    for v in variants:
        assert not torch.equal(v, base)
    # deterministic
    assert torch.equal(dspark.ops.philox_draw(1, 2, z, z, 3, i)[0], base)


def test_gumbel_max_samples_the_softmax():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 40_000
    row = torch.arange(n).repeat_interleave(4)
    idx = torch.arange(4).repeat(n)
    _, g = dspark.ops.philox_draw(7, 0, row, torch.zeros_like(row), 1, idx)
    picks = (probs.log() + g.view(n, 4)).argmax(dim=1)
    freq = torch.bincount(picks, minlength=4).double() / n
    assert torch.allclose(freq, probs.double(), atol=4 * math.sqrt(0.25 / n))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(request=torch.zeros(3, dtype=torch.int32)), "request must be"),
        (dict(position=torch.zeros(2, dtype=torch.int64)), "same length"),
        (dict(position=torch.full((3,), 70000)), "position"),
        (dict(index=torch.full((3,), -1)), "index"),
        (dict(purpose=70000), "purpose"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match):
    args = dict(
        seed=0,
        offset=0,
        request=torch.zeros(3, dtype=torch.int64),
        position=torch.zeros(3, dtype=torch.int64),
    )
    args.update(purpose=0, index=torch.arange(3))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        dspark.ops.philox_draw(**args)


def test_opcheck():
    i = torch.arange(10)
    torch.library.opcheck(torch.ops.dspark.philox_draw.default, (3, 4, i, i, 1, i))
