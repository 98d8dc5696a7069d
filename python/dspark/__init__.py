# SPDX-License-Identifier: Apache-2.0
"""dspark: DSpark speculative decoding for Hugging Face causal LMs.

Importing the package loads the C++/CUDA extension, which registers every ``torch.ops.dspark`` operator,
and registers the fake (meta) implementation of each op so they trace under ``torch.compile``.
"""

from __future__ import annotations

import torch  # noqa: F401  (must be imported before the extension: _C links against torch's libraries)

from dspark import (  # noqa: F401  (ops registers the fake implementations)
    _C,  # noqa: F401  (registers the TORCH_LIBRARY(dspark) ops)
    ops,
)
from dspark._version import __version__
from dspark.decoding.decoder import DSparkDecoder, GenerateOutput, StreamEvent
from dspark.decoding.planner import Planner
from dspark.decoding.tables import SpsTable
from dspark.models import DSparkDrafter
from dspark.models.target_graphs import GraphBuckets


def build_info() -> dict:
    """What the installed extension was built with.

    Returns
    -------
    dict
        ``version`` (dspark), ``torch_version`` (the torch it was compiled against), ``cuda`` (whether CUDA
        kernels were compiled), ``cuda_archs`` (e.g. ``["sm_80", "sm_90a"]``) and ``openmp`` (whether the CPU
        kernels run on ``torch.get_num_threads()`` threads; without it they run on one).
    """
    return dict(_C.build_info())


def cuda_kernels_available() -> bool:
    """True when the extension holds CUDA kernels and a CUDA device is present."""
    return bool(_C.build_info()["cuda"]) and torch.cuda.is_available()


__all__ = [
    "DSparkDecoder",
    "DSparkDrafter",
    "GenerateOutput",
    "GraphBuckets",
    "Planner",
    "SpsTable",
    "StreamEvent",
    "build_info",
    "cuda_kernels_available",
    "ops",
    "__version__",
]
