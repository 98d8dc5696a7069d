# SPDX-License-Identifier: Apache-2.0
"""dspark's cost table, as the profiler writes it, and :func:`load`, which reads either cost file.

The table classes live with the planner that prices with them (:mod:`dspark.decoding.tables`); they are
re-exported here because the profiler is where they are made. The JSON layouts are described in
docs/file-formats.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from dspark.decoding.costs import FORMAT_NAME, FORMAT_VERSION, DraftCost, VerifyCost, isotonic
from dspark.decoding.tables import CostTable, SpsTable

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "CostTable", "DraftCost", "VerifyCost", "isotonic", "load"]


def load(path: str | Path) -> CostTable | SpsTable:
    """Read either cost file: dspark's cost table (``"format": "dspark-cost-table"``) or SGLang's SPS JSON.

    Raises
    ------
    ValueError
        Invalid JSON, an unknown layout, or an invalid field (the message names the file and the field).
    """
    try:
        d = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e
    if CostTable.is_cost_table_dict(d):
        return CostTable.from_dict(d, source=str(path))
    return SpsTable.from_dict(d, source=str(path))
