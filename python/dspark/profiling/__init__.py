# SPDX-License-Identifier: Apache-2.0
"""Cost profiling: measure verify and drafter costs, write SGLang's SPS JSON and dspark's cost table.

>>> from dspark.profiling import profile_costs, CostTable        # doctest: +SKIP
>>> table = profile_costs(model, drafter, batch_sizes=(1, 2, 4, 8))  # doctest: +SKIP
>>> table.save_json("costs.json"); table.to_sps().save("sps.json")    # doctest: +SKIP
>>> table = local_cost_table(model, drafter)  # this machine's, profiled once and cached  # doctest: +SKIP

See docs/profiling.md.
"""

from __future__ import annotations

from dspark.profiling.local import local_cost_table
from dspark.profiling.plot import save_plot
from dspark.profiling.profiler import default_batch_tokens, profile_costs, split_tokens
from dspark.profiling.table import CostTable, DraftCost, VerifyCost, load

__all__ = [
    "CostTable",
    "DraftCost",
    "VerifyCost",
    "default_batch_tokens",
    "load",
    "local_cost_table",
    "profile_costs",
    "save_plot",
    "split_tokens",
]
