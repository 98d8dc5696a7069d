# SPDX-License-Identifier: Apache-2.0
"""local_cost_table: profiled once per key and cached atomically; what changes the key; a damaged entry is
profiled again; bad arguments refused before timing; `dspark generate --sps auto`."""

import json
from unittest import mock

import pytest
import torch

import dspark.profiling.local as local
from dspark.decoding.machine import machine_name
from dspark.profiling import CostTable, local_cost_table
from tests.calibration.test_cli import ByteTokenizer
from tests.decoding.toy_models import random_drafter
from tests.models.tiny import tiny_model

FAST = dict(batch_sizes=(1, 2), context_length=8, repeats=1, warmup=0, progress=False)


@pytest.fixture(scope="module")
def models():
    target = tiny_model("llama", layers=2)
    return target, random_drafter(target, block_size=3, markov_rank=8)


@pytest.fixture
def profiles(monkeypatch):
    """Counts the real profiler's runs."""
    calls = []
    real = local.profile_costs

    def counted(*a, **k):
        calls.append(k)
        return real(*a, **k)

    monkeypatch.setattr(local, "profile_costs", counted)
    return calls


def test_profiled_once_then_read_from_the_cache(models, profiles, tmp_path):
    target, drafter = models
    first = local_cost_table(target, drafter, cache=tmp_path, **FAST)
    assert len(profiles) == 1 and first.draft  # a drafter's table prices its rounds
    path = tmp_path / first.metadata["cache_path"].rsplit("/", 1)[1]
    assert path.is_file() and list(tmp_path.iterdir()) == [path]  # no temporary file left behind
    assert first.metadata["device_name"] == machine_name(torch.device("cpu"))
    second = local_cost_table(target, drafter, cache=tmp_path, **FAST)
    assert len(profiles) == 1  # from the cache
    assert second.verify == first.verify and second.draft == first.draft
    local_cost_table(target, drafter, cache=tmp_path, refresh=True, **FAST)
    assert len(profiles) == 2  # refresh profiles again


def test_what_changes_the_key(models, tmp_path):
    target, drafter = models
    base = local.cached_table_path(local.cache_key(target, drafter, (1, 2), 8), tmp_path)
    assert base == local.cached_table_path(local.cache_key(target, drafter, (1, 2), 8), tmp_path)
    other_drafter = random_drafter(target, block_size=4, markov_rank=8)
    changed = [
        local.cache_key(target, None, (1, 2), 8),
        local.cache_key(target, other_drafter, (1, 2), 8),
        local.cache_key(target, drafter, (1, 2, 4), 8),
        local.cache_key(target, drafter, (1, 2), 16),
    ]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(before + 1)
        changed.append(local.cache_key(target, drafter, (1, 2), 8))
    finally:
        torch.set_num_threads(before)
    with mock.patch.object(local, "kernels_digest", lambda: "another-build"):  # a rebuild of other kernels
        changed.append(local.cache_key(target, drafter, (1, 2), 8))
    paths = {local.cached_table_path(k, tmp_path) for k in changed}
    assert len(paths) == len(changed) and base not in paths
    # the same shapes with other weights cost the same: same key
    same_shape = random_drafter(target, block_size=3, markov_rank=8, seed=7)
    assert local.cached_table_path(local.cache_key(target, same_shape, (1, 2), 8), tmp_path) == base


def test_a_damaged_entry_is_profiled_again(models, profiles, tmp_path):
    target, drafter = models
    table = local_cost_table(target, None, cache=tmp_path, **FAST)
    path = tmp_path / table.metadata["cache_path"].rsplit("/", 1)[1]
    path.write_text('{"format": "dspark-cost-table", "verify": [')  # cut off mid-write by something else
    with pytest.warns(UserWarning, match="unreadable.*profiling again"):
        again = local_cost_table(target, None, cache=tmp_path, **FAST)
    assert len(profiles) == 2 and isinstance(again, CostTable)
    assert json.loads(path.read_text())["format"] == "dspark-cost-table"  # replaced by a whole table


def test_a_failed_profile_leaves_the_cache_as_it_was(models, monkeypatch, tmp_path):
    target, drafter = models

    def broken(*a, **k):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(local, "profile_costs", broken)
    with pytest.raises(RuntimeError, match="interrupted"):
        local_cost_table(target, drafter, cache=tmp_path, **FAST)
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(batch_sizes=()), "batch_sizes: expected request counts >= 1"),
        (dict(batch_sizes=(1, 0)), "batch_sizes: expected request counts >= 1"),
        (dict(context_length=0), "context_length: expected >= 1"),
    ],
)
def test_bad_arguments_are_refused_before_timing(models, profiles, tmp_path, kwargs, match):
    target, drafter = models
    with pytest.raises(ValueError, match=match):
        local_cost_table(target, drafter, cache=tmp_path, **{**FAST, **kwargs})
    assert profiles == []
    with pytest.raises(ValueError, match="target: expected a Hugging Face causal LM"):
        local_cost_table(torch.nn.Linear(2, 2), None, cache=tmp_path)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(local.CACHE_ENV, str(tmp_path / "mine"))
    assert local.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(local.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert local.cache_dir() == tmp_path / "xdg" / "dspark" / "costs"


def test_generate_sps_auto_profiles_this_machine(models, monkeypatch, tmp_path, capsys):
    import dspark.cli as cli
    from dspark.models import loading

    target, _ = models
    monkeypatch.setattr(loading, "load_target", lambda spec: (target, ByteTokenizer(97)))
    monkeypatch.setenv(local.CACHE_ENV, str(tmp_path))
    seen = []
    real = local.local_cost_table

    def small(t, d, **k):  # the CLI's call, at test size
        table = real(t, d, cache=tmp_path, **FAST)
        seen.append(table)
        return table

    monkeypatch.setattr(local, "local_cost_table", small)
    argv = ["generate", "--target", "tiny", "--lookup", "--prompt", "ab ab ab", "--max-new-tokens", "4"]
    assert cli.main([*argv, "--sps", "auto"]) == 0
    assert len(seen) == 1 and "cost table:" in capsys.readouterr().err
