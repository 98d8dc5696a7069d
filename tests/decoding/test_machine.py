# SPDX-License-Identifier: Apache-2.0
"""A cost table profiled on another machine is named when a decoder takes it (``decoding.machine``)."""

from __future__ import annotations

import warnings

import pytest
import torch

from dspark import DSparkDecoder
from dspark.decoding.machine import machine_name, profiled_elsewhere, same_machine
from dspark.decoding.sources import DRAFTER_SKIP_MARGIN, DRAFTER_SKIP_MARGIN_LOCAL
from dspark.decoding.tables import CostTable, VerifyCost
from tests.decoding.toy_models import tiny_target

CPU = torch.device("cpu")


def here(**changes) -> dict:
    """The metadata `dspark profile` writes on this machine, with ``changes``."""
    return {"device": "cpu", "device_name": machine_name(CPU), "threads": torch.get_num_threads(), **changes}


def test_what_counts_as_another_machine():
    assert profiled_elsewhere(here(), CPU) is None
    assert profiled_elsewhere({}, CPU) is None  # a table that does not say: nothing to compare
    other = profiled_elsewhere(here(device_name="AMD EPYC 9B45"), CPU)
    assert other is not None and "'AMD EPYC 9B45'" in other and repr(machine_name(CPU)) in other
    threads = profiled_elsewhere(here(threads=torch.get_num_threads() + 3), CPU)
    assert threads == f"with {torch.get_num_threads() + 3} threads (here: {torch.get_num_threads()})"
    both = profiled_elsewhere(here(device_name="X", threads=torch.get_num_threads() + 1), CPU)
    assert both is not None and " and " in both


def test_a_cpu_is_named_with_its_family_and_isa():
    name = machine_name(CPU)
    assert name.endswith(f"{torch.backends.cpu.get_cpu_capability()})")
    model = name.split(" (", 1)[0]
    # two generations that share a bare model name (virtual machines) are told apart by family or ISA
    assert not same_machine(f"{model} (family 1, AVX512_FAKE)", name)
    assert profiled_elsewhere(here(device_name=f"{model} (family 1, AVX512_FAKE)"), CPU) is not None
    # a table written before the family and ISA were recorded names the model only: compared by it
    assert same_machine(model, name) and profiled_elsewhere(here(device_name=model), CPU) is None
    assert not same_machine("Some Other CPU", name)
    # a model name with parentheses of its own, as Intel's are
    intel = "Intel(R) Xeon(R) Processor"
    assert same_machine(intel, f"{intel} (family 6, AVX512)")
    assert not same_machine(intel, "Intel(R) Xeon(R) Gold (family 6, AVX512)")
    assert not same_machine(f"{intel} (family 6, AVX2)", f"{intel} (family 6, AVX512)")


def table(metadata: dict) -> CostTable:
    verify = (VerifyCost(1, 1, 10.0), VerifyCost(1, 5, 18.0))
    return CostTable(verify, (), block_size=4, metadata=metadata)


def test_the_decoder_warns_for_a_table_from_elsewhere_only():
    target = tiny_target("llama", vocab=64)
    with pytest.warns(UserWarning, match="profiled on 'AMD EPYC 9B45'.*dspark profile"):
        DSparkDecoder(target, None, lookup=True, sps_table=table(here(device_name="AMD EPYC 9B45"))).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a table from this machine, or none: silent
        DSparkDecoder(target, None, lookup=True, sps_table=table(here())).close()
        DSparkDecoder(target, None, lookup=True).close()


def test_the_drafters_skip_margin_is_narrower_for_a_table_from_this_machine():
    target = tiny_target("llama", vocab=64)
    cases = [(here(), DRAFTER_SKIP_MARGIN_LOCAL), (here(threads=here()["threads"] + 1), DRAFTER_SKIP_MARGIN)]
    cases.append(({"threads": here()["threads"]}, DRAFTER_SKIP_MARGIN))  # a table that does not say where
    for metadata, margin in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dec = DSparkDecoder(target, None, lookup=True, sps_table=table(metadata))
        assert dec.drafter_skip_margin == margin, metadata
        dec.close()
    dec = DSparkDecoder(target, None, lookup=True)  # no cost table
    assert dec.drafter_skip_margin == DRAFTER_SKIP_MARGIN
    dec.close()
