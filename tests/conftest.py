# SPDX-License-Identifier: Apache-2.0
import pytest
import torch

import dspark  # noqa: F401  (registers the ops)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and dspark.build_info()["cuda"]:
        return
    reason = (
        "needs a CUDA GPU and a CUDA build of dspark"
        if not torch.cuda.is_available()
        else "dspark was built without CUDA kernels"
    )
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
