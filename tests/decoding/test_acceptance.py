# SPDX-License-Identifier: Apache-2.0
"""AcceptanceTable: counting, survival, the prior's rescaling and the JSON file (expected values by hand)."""

import json
import math
import os
import stat

import numpy as np
import pytest
import torch

from dspark.decoding.acceptance import AcceptanceTable
from dspark.decoding.lookup import EXTENT_BOUNDS, LookupConfig, match_class, num_match_classes


def counts(t: AcceptanceTable) -> tuple[list[list[float]], list[list[float]]]:
    a, n = t.counts
    return a.tolist(), n.tolist()


def prior_dict(accepts, trials, **kw):
    d = {
        "format": "dspark-acceptance",
        "version": 1,
        "kind": "lookup",
        "min_match": 2,
        "max_match": len(accepts) - 1,
        "gamma": len(accepts[0]),
        "temperature": 0.0,
        "accepts": accepts,
        "trials": trials,
        "source": "hand-made",
    }
    d.update(kw)
    return d


# ------------------------------------------------------------------ counting
def test_observe_counts_accepts_one_reject_and_censors_the_rest():
    t = AcceptanceTable(3, 4)
    t.observe(1, 4, 2)  # accept 0, 1; reject 2; 3 never judged
    t.observe(1, 2, 2)  # accept 0, 1; nothing was verified past them
    t.observe(2, 3, 0)  # reject 0
    t.observe(2, 0, 0)  # nothing verified: nothing counted
    t.observe(0, 4, 4)
    assert counts(t) == (
        [[1, 1, 1, 1], [2, 2, 0, 0], [0, 0, 0, 0]],
        [[1, 1, 1, 1], [2, 2, 1, 0], [1, 0, 0, 0]],
    )


def test_observe_continuation_compares_with_the_committed_tokens():
    t = AcceptanceTable(3, 4)
    t.observe_continuation(1, [5, 6, 7, 8], [5, 6, 9, 8])  # mismatch at 2: position 3 counts nothing
    t.observe_continuation(1, [5, 6], [5, 6, 7])  # all matched, nothing proposed past 2
    t.observe_continuation(2, [5, 6, 7], [5])  # committed ends: 1 and 2 censored
    t.observe_continuation(2, [1, 2], [3, 2])  # first token wrong
    t.observe_continuation(2, [4], [])  # nothing committed yet
    assert counts(t) == (
        [[0, 0, 0, 0], [2, 2, 0, 0], [1, 0, 0, 0]],
        [[0, 0, 0, 0], [2, 2, 1, 0], [2, 0, 0, 0]],
    )


def test_numpy_ints_are_counts_and_bad_observations_are_named():
    t = AcceptanceTable(3, 4)
    t.observe(np.int64(1), np.int64(2), np.int64(1))
    assert counts(t)[1][1] == [1, 1, 0, 0]
    for args, name in [
        ((3, 1, 0), "cls"),
        ((-1, 1, 0), "cls"),
        ((1, 5, 0), "verified"),
        ((1, 2, 3), "accepted"),
        ((1, 2, -1), "accepted"),
        ((True, 1, 0), "cls"),
        ((1, 2.0, 0), "verified"),
    ]:
        with pytest.raises(ValueError, match=f"^{name}:"):
            t.observe(*args)
    with pytest.raises(ValueError, match="^proposal:"):
        t.observe_continuation(1, [1, 2, 3, 4, 5], [1])
    assert counts(t)[1][1] == [1, 1, 0, 0]  # the refused calls counted nothing


@pytest.mark.parametrize(
    "kw, name",
    [
        (dict(num_classes=0, gamma=2), "num_classes"),
        (dict(num_classes=2.0, gamma=2), "num_classes"),
        (dict(num_classes=2, gamma=0), "gamma"),
        (dict(num_classes=2, gamma=2, prior_weight=0.0), "prior_weight"),
        (dict(num_classes=2, gamma=2, prior_weight=math.inf), "prior_weight"),
        (dict(num_classes=2, gamma=2, prior_weight="20"), "prior_weight"),
        (dict(num_classes=2, gamma=2, prior={"format": "x"}), "prior"),
        (dict(num_classes=2, gamma=2, meta=[1]), "meta"),
    ],
)
def test_bad_constructor_arguments_are_named(kw, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        AcceptanceTable(**kw)


# ------------------------------------------------------------------ survival
def hand_table() -> AcceptanceTable:
    t = AcceptanceTable(3, 3)  # every cell starts at 1 accept / 2 trials
    t.observe(1, 3, 3)
    t.observe(1, 3, 3)
    t.observe(1, 3, 1)
    # class 1: accepts [3, 2, 2], trials [3, 3, 2] -> a = 4/5, 3/5, 3/4
    return t


def test_conditional_and_survival_by_hand():
    t = hand_table()
    want_a = [[0.5, 0.5, 0.5], [0.8, 0.6, 0.75], [0.5, 0.5, 0.5]]
    np.testing.assert_allclose(t.conditional(), want_a, rtol=1e-12)
    S = t.survival([1, 2, 1, 0], [3, 2, 1, 0], 5)
    assert S.shape == (4, 5) and S.dtype == torch.float32 and S.device.type == "cpu"
    want = [
        [0.8, 0.48, 0.36, 0, 0],  # 0.8, 0.8 * 0.6, 0.8 * 0.6 * 0.75; columns past gamma = 3 are 0
        [0.5, 0.25, 0, 0, 0],
        [0.8, 0, 0, 0, 0],
        [0, 0, 0, 0, 0],  # length 0: a zero row
    ]
    torch.testing.assert_close(S, torch.tensor(want), rtol=0, atol=1e-7)
    torch.testing.assert_close(t.survival([1], [3], 2), torch.tensor([[0.8, 0.48]]), rtol=0, atol=1e-7)
    # lengths past gamma are cut at gamma; tensors are accepted
    torch.testing.assert_close(
        t.survival(torch.tensor([1]), torch.tensor([9]), 3),
        torch.tensor([[0.8, 0.48, 0.36]]),
        rtol=0,
        atol=1e-7,
    )
    assert t.survival([], [], 4).shape == (0, 4)
    assert t.survival([1, 2], [1, 1], 0).shape == (2, 0)


def test_survival_follows_new_observations():
    t = hand_table()
    before = t.survival([2], [1], 1).item()
    t.observe(2, 1, 1)  # class 2, position 0: 2 / 3
    assert before == 0.5 and t.survival([2], [1], 1).item() == pytest.approx(2 / 3)
    t.observe_continuation(2, [7, 8], [9])  # a reject at position 0: 2 / 4
    assert t.survival([2], [2], 2).tolist() == [[0.5, 0.25]]


def test_survival_rows_are_non_increasing_on_a_random_table():
    g = torch.Generator().manual_seed(0)
    t = AcceptanceTable(5, 7)
    for _ in range(300):
        c = int(torch.randint(0, 5, (), generator=g))
        v = int(torch.randint(0, 8, (), generator=g))
        t.observe(c, v, int(torch.randint(0, v + 1, (), generator=g)))
    classes = torch.randint(0, 5, (64,), generator=g)
    lengths = torch.randint(0, 9, (64,), generator=g)
    S = t.survival(classes, lengths, 8)
    assert bool((S[:, 1:] <= S[:, :-1]).all()) and bool((S >= 0).all()) and bool((S <= 1).all())
    cols = torch.arange(8).view(1, 8)
    assert bool((S[cols >= lengths.view(-1, 1)] == 0).all())
    assert bool((S[:, 7] == 0).all())  # column 7 is past gamma = 7


def test_bad_survival_arguments_are_named():
    t = hand_table()
    for args, name in [
        (([3], [1], 2), "classes"),
        (([-1], [1], 2), "classes"),
        (([1.0], [1], 2), "classes"),
        (([1], [-1], 2), "lengths"),
        (([1, 2], [1], 2), "lengths"),
        (([1], [1], -1), "width"),
    ]:
        with pytest.raises(ValueError, match=f"^{name}:"):
            t.survival(*args)


# ------------------------------------------------------------------ the prior
def test_prior_weight_caps_the_pseudo_trials_of_a_cell():
    prior = prior_dict(
        accepts=[[0, 0, 0], [900, 5, 0], [0, 0, 0]],
        trials=[[0, 0, 0], [1000, 10, 0], [0, 0, 0]],
    )
    t = AcceptanceTable(3, 3, prior=prior, prior_weight=20.0)
    pa, pt = t.prior_counts
    # 1000 trials -> 20 (ratio 0.9 kept); 10 trials stay 10; no trials -> the 1 / 2 default
    assert pt.tolist() == [[2, 2, 2], [20, 10, 2], [2, 2, 2]]
    assert pa.tolist() == [[1, 1, 1], [18, 5, 1], [1, 1, 1]]
    assert t.conditional()[1] == pytest.approx([0.9, 0.5, 0.5])
    for _ in range(20):
        t.observe(1, 1, 0)  # 20 rejects at position 0 already halve the prior's 0.9
    assert t.conditional()[1][0] == pytest.approx(18 / 40)
    assert t.meta == {
        "kind": "lookup",
        "min_match": 2,
        "max_match": 2,
        "extent_bounds": [],
        "temperature": 0.0,
        "source": "hand-made",
    }


def test_a_prior_of_another_shape_fills_the_overlap():
    prior = prior_dict(accepts=[[0, 0], [3, 1], [4, 2]], trials=[[0, 0], [4, 4], [4, 4]])
    t = AcceptanceTable(4, 3, prior=prior)  # one class and one position more than the prior
    # match length 3 was part of the prior's class 2 (its longest match length): it starts from that row
    np.testing.assert_allclose(
        t.conditional(), [[0.5] * 3, [0.75, 0.25, 0.5], [1.0, 0.5, 0.5], [1.0, 0.5, 0.5]], rtol=1e-12
    )
    assert t.meta["max_match"] == 3
    drafter = AcceptanceTable(4, 3, prior=prior, meta={"kind": "drafter"})  # not lookup: rows by index
    np.testing.assert_allclose(drafter.conditional()[3], [0.5] * 3, rtol=1e-12)
    small = AcceptanceTable.from_dict(prior, num_classes=2, gamma=1)  # its class 1 pools the prior's 1 and 2
    assert (
        small.conditional() == [[0.5], [(3 + 4) / (4 + 4)]] and small.meta["min_match"] is None
    )  # 2 > max_match 1


# ------------------------------------------------------------------ files
def test_save_load_round_trip_keeps_the_evidence(tmp_path):
    prior = prior_dict(accepts=[[0, 0], [30, 10], [5, 1]], trials=[[0, 0], [40, 30], [8, 5]], temperature=1.0)
    t = AcceptanceTable(3, 2, prior=prior)
    t.observe(1, 2, 1)
    t.observe(2, 1, 1)
    d = t.to_dict()
    assert d["accepts"] == [[0, 0], [31, 10], [6, 1]] and d["trials"] == [[0, 0], [41, 31], [9, 5]]
    assert (d["format"], d["version"], d["kind"], d["gamma"]) == ("dspark-acceptance", 1, "lookup", 2)
    assert (d["min_match"], d["max_match"], d["temperature"], d["source"]) == (2, 2, 1.0, "hand-made")
    path = tmp_path / "prior.json"
    t.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prior.json"]  # no temporary file left behind
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # an ordinary file, not a private temp file
    # "{", 8 scalar fields, accepts and trials as a header, 3 class rows and "]" each, "}"
    assert path.read_text().count("\n") == 20 and "\n  [41, 31],\n" in path.read_text()
    assert json.loads(path.read_text()) == d
    back = AcceptanceTable.load(path, prior_weight=50.0)
    assert back.to_dict() == d and back.prior_weight == 50.0
    assert counts(back) == ([[0, 0]] * 3, [[0, 0]] * 3)  # the file is the prior, not observations
    # class 1, position 1: 31 trials rescaled to 20 keeps 10 / 31
    assert back.conditional()[1][1] == pytest.approx(10 / 31)
    assert AcceptanceTable.from_dict(d).to_dict() == d
    # saving again replaces the file
    back.observe(2, 2, 0)
    back.save(path)
    assert AcceptanceTable.load(path).to_dict()["trials"][2] == [10, 5]


def test_a_table_without_prior_writes_its_observations_only():
    t = AcceptanceTable(2, 2)
    t.observe(1, 2, 1)
    d = t.to_dict()
    assert d["accepts"] == [[0, 0], [1, 0]] and d["trials"] == [[0, 0], [1, 1]]
    assert d["min_match"] is None and d["max_match"] == 1 and d["temperature"] is None


GOOD = prior_dict(accepts=[[0, 0], [1, 1], [2, 1]], trials=[[0, 0], [2, 1], [2, 2]])


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(format="dspark-cost-table"), "'format'"),
        (dict(version=2), "'version'"),
        (dict(kind=""), "'kind'"),
        (dict(gamma=0), "'gamma'"),
        (dict(accepts="x"), "'accepts'"),
        (dict(accepts=[[0, 0], [1], [2, 1]]), r"'accepts\[1\]'"),
        (dict(trials=[[0, 0], [2, 1], [2, -1]]), r"'trials\[2\]\[1\]'"),
        (dict(trials=[[0, 0], [2, 1], [2, None]]), r"'trials\[2\]\[1\]'"),
        (dict(trials=[[0, 0], [2, 1]]), "'trials'"),
        (dict(accepts=[[0, 0], [3, 1], [2, 1]]), r"'accepts\[1\]\[0\]'"),
        (dict(max_match=3), "'max_match'"),
        (dict(min_match=5), "'min_match'"),
        (dict(temperature=-1.0), "'temperature'"),
        (dict(source=3), "'source'"),
        (dict(accepts=None), "'accepts'"),
    ],
)
def test_bad_fields_name_the_file_and_the_field(tmp_path, change, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**GOOD, **change}))
    with pytest.raises(ValueError, match=f"^{path}: .*field {field}"):
        AcceptanceTable.load(path)


def test_missing_fields_and_broken_files_are_named(tmp_path):
    for key in ("format", "version", "kind", "gamma", "accepts", "trials"):
        path = tmp_path / f"no_{key}.json"
        path.write_text(json.dumps({k: v for k, v in GOOD.items() if k != key}))
        with pytest.raises(ValueError, match=f"^{path}: missing field '{key}'"):
            AcceptanceTable.load(path)
    lookup = tmp_path / "no_max_match.json"
    lookup.write_text(json.dumps({k: v for k, v in GOOD.items() if k != "max_match"}))
    with pytest.raises(ValueError, match=f"^{lookup}: field 'max_match'"):
        AcceptanceTable.load(lookup)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match=f"^{broken}: not valid JSON"):
        AcceptanceTable.load(broken)
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    with pytest.raises(ValueError, match=f"^{listed}: must be a JSON object"):
        AcceptanceTable.load(listed)
    with pytest.raises(FileNotFoundError):
        AcceptanceTable.load(tmp_path / "absent.json")
    # another kind needs no match lengths
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps({k: v for k, v in GOOD.items() if k not in ("min_match", "max_match")} | {"kind": "x"})
    )
    assert AcceptanceTable.load(other).meta["kind"] == "x"


def test_extent_classes_round_trip_and_an_unsplit_prior_seeds_them(tmp_path):
    cfg = LookupConfig(2, 4)
    t = AcceptanceTable.for_lookup(cfg, 3)
    assert t.num_classes == num_match_classes(cfg) and t.meta["extent_bounds"] == list(EXTENT_BOUNDS)
    t.observe(match_class(cfg, 4, 50), 3, 3)  # the longest extents' class
    t.save(tmp_path / "t.json")
    back = AcceptanceTable.load(tmp_path / "t.json")
    assert back.to_dict() == t.to_dict() and back.meta["extent_bounds"] == list(EXTENT_BOUNDS)
    # a prior of match lengths only (no extent_bounds field): every extent class starts from class 4
    old = prior_dict(
        accepts=[[0, 0], [0, 0], [1, 0], [2, 1], [9, 4]], trials=[[0, 0], [0, 0], [2, 0], [4, 2], [10, 8]]
    )
    seeded = AcceptanceTable.for_lookup(cfg, 2, prior=old)
    cond = seeded.conditional()
    assert cond[2] == pytest.approx([0.5, 0.5]) and cond[3] == pytest.approx([0.5, 0.5])
    assert all(row == pytest.approx([0.9, 0.5]) for row in cond[4:])
    # a prior split at other bounds: each class takes the prior class holding its shortest extent
    other = prior_dict(
        accepts=[[0]] * 5 + [[1], [2]], trials=[[0]] * 5 + [[2], [2]], max_match=4, extent_bounds=[10, 20]
    )
    remapped = AcceptanceTable.for_lookup(cfg, 1, prior=other).conditional()
    # table classes from extent 4, 6, 8, 12, 16, 24, 32, 48 take prior classes (4: 4-9, 5: 10-19, 6: >= 20)
    # 4, 4, 5 (its 10 falls in 8-11: pooled), 5, 6 (20 in 16-23: pooled), 6, 6, 6
    assert [row[0] for row in remapped[4:]] == pytest.approx([0.5, 0.5, 0.5, 0.5, 1, 1, 1, 1])
    # and a table classed by length alone pools a split prior's classes 4.. into its class 4
    split = AcceptanceTable.for_lookup(cfg, 2, prior=t.to_dict() | {"gamma": 3}).to_dict()
    pooled = AcceptanceTable.for_lookup(LookupConfig(2, 4, extent_bounds=()), 2, prior=split)
    assert pooled.num_classes == 5 and pooled.prior_counts[1][4].tolist() == [1, 1]
    merged = prior_dict(
        accepts=[[0]] * 4 + [[1], [2], [3]],
        trials=[[0]] * 4 + [[2], [2], [4]],
        max_match=4,
        extent_bounds=[10, 20],
    )
    assert AcceptanceTable.for_lookup(LookupConfig(2, 4, extent_bounds=()), 1, prior=merged).conditional()[
        4
    ] == [pytest.approx(6 / 8)]


@pytest.mark.parametrize(
    "bounds, message",
    [
        ([4, 8], r"'extent_bounds' must be a list of strictly increasing ints > max_match = 4"),
        ([8, 6], r"'extent_bounds' must be a list of strictly increasing ints"),
        ("6", r"'extent_bounds' must be a list"),
        ([6.0], r"'extent_bounds' must be a list"),
    ],
)
def test_bad_extent_bounds_are_named(bounds, message):
    d = prior_dict(accepts=[[0]] * 7, trials=[[0]] * 7, max_match=4, extent_bounds=bounds)
    with pytest.raises(ValueError, match=message):
        AcceptanceTable.from_dict(d)


def test_extent_bounds_must_match_the_rows():
    d = prior_dict(accepts=[[0]] * 6, trials=[[0]] * 6, max_match=4, extent_bounds=[6, 8])
    with pytest.raises(
        ValueError, match=r"'max_match' = 4 and 2 'extent_bounds' make 7 classes, but 'accepts' has 6"
    ):
        AcceptanceTable.from_dict(d, where="p.json")
