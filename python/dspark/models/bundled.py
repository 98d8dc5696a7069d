# SPDX-License-Identifier: Apache-2.0
"""Drafters shipped inside the package (trained by ``dspark train``, see docs/training.md).

Each lives in ``dspark/assets/drafters/<name>/``: a DeepSpec-layout checkpoint (``config.json`` +
``model.safetensors``, bf16, embedding and LM head not stored: they are aliased from the target), and optionally
``sts.json`` (the confidence head's STS temperatures and offsets fitted on sampling-acceptance labels at
temperature 1, SGLang's format plus ``biases``), ``sts-greedy.json`` (the same fitted on greedy argmax-match
labels, for temperature-0 decoding), ``costs.json``
(dspark's table of draft and verify cost by batch size on the machine kind it was profiled on), ``sps.json``
(SGLang's 1-D export of that table), ``draft_vocab.json`` (the token ids it drafts from, loaded by
``DSparkDrafter.from_pretrained``; see docs/drafter.md) and ``lookup_prior.json`` (the acceptance of lookup
drafts by match class and position that ``dspark calibrate`` measured, the prior of hybrid rounds).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DRAFTERS_DIR = Path(__file__).resolve().parents[1] / "assets" / "drafters"
DEFAULT_DRAFTER = "smollm2-135m-instruct"


@dataclass
class BundledDrafter:
    """Paths of a shipped drafter: the checkpoint folder and its optional STS / SPS files."""

    name: str
    path: Path
    sts: Path | None
    sps: Path | None
    sts_greedy: Path | None = None
    lookup_prior: Path | None = None

    def sts_for(self, temperature: float) -> Path | None:
        """The STS file calibrated for this kind of decoding (greedy labels at temperature 0)."""
        if temperature == 0 and self.sts_greedy is not None:
            return self.sts_greedy
        return self.sts


def bundled_drafters() -> list[str]:
    """Names of the drafters that ship with this installation."""
    if not DRAFTERS_DIR.is_dir():
        return []
    return sorted(p.name for p in DRAFTERS_DIR.iterdir() if (p / "config.json").is_file())


def bundled_drafter(name: str = DEFAULT_DRAFTER) -> BundledDrafter:
    """Locate a shipped drafter by name.

    Raises
    ------
    FileNotFoundError
        When no drafter of that name ships with this installation (the message lists the ones that do).
    """
    path = DRAFTERS_DIR / name
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        have = ", ".join(bundled_drafters()) or "none"
        raise FileNotFoundError(f"drafter: no bundled drafter named {name!r} (bundled: {have})")

    def opt(name: str) -> Path | None:
        return path / name if (path / name).is_file() else None

    # dspark's cost table (draft + verify cost per batch size) prices rounds better than the 1-D SPS export
    return BundledDrafter(
        name,
        path,
        opt("sts.json"),
        opt("costs.json") or opt("sps.json"),
        opt("sts-greedy.json"),
        opt("lookup_prior.json"),
    )


def load_bundled_drafter(target, tokenizer=None, name: str = DEFAULT_DRAFTER, dtype=None):
    """``(drafter, BundledDrafter)``: the shipped drafter loaded for ``target``.

    The embedding / LM head are aliased from the target, or cast copies when ``dtype`` (default: the target's)
    differs from the target's.
    """
    from dspark.models.drafter import DSparkDrafter

    info = bundled_drafter(name)
    return DSparkDrafter.from_pretrained(info.path, target=target, tokenizer=tokenizer, dtype=dtype), info
