# SPDX-License-Identifier: Apache-2.0
"""Models: the DSpark drafter (DeepSpec-compatible checkpoints), its heads and the pairing checks."""

from dspark.models.config import DrafterConfig
from dspark.models.drafter import DraftOutput, DSparkDrafter
from dspark.models.heads import (
    ConfidenceHead,
    GatedMarkovHead,
    MarkovSample,
    RNNMarkovHead,
    VanillaMarkovHead,
)
from dspark.models.pairing import validate_pairing

__all__ = [
    "ConfidenceHead",
    "DSparkDrafter",
    "DraftOutput",
    "DrafterConfig",
    "GatedMarkovHead",
    "MarkovSample",
    "RNNMarkovHead",
    "VanillaMarkovHead",
    "validate_pairing",
]
