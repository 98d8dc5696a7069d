# SPDX-License-Identifier: Apache-2.0
"""What SGLang does with a drafter dspark writes in the layouts it serves (``deepspec``, ``specforge``).

SGLang has no packaging of its own for DSpark drafters; it serves those two layouts and, where a drafter holds
something it cannot represent, mostly skips it without a word. :func:`serving_notes` names each such case for
one checkpoint, so that ``dspark convert`` can say it (facts checked against sglang 0.5.23 by
``scripts/check_sglang_package.py``; docs/file-formats.md, "Served by SGLang").
"""

from __future__ import annotations

from dspark.models.config import DrafterConfig
from dspark.models.packagings.base import DSPARK_ONLY, Packaged

SERVED_FROM = ("deepspec", "specforge")
VERSION = "0.5.23"


def serving_notes(p: Packaged, format: str) -> list[str]:
    """How SGLang would serve ``p`` written in ``format``: one sentence per difference from dspark (empty when
    it serves the drafter as dspark does, or when ``format`` is not a layout SGLang serves).

    Parameters
    ----------
    p : Packaged
        The checkpoint, in dspark's terms.
    format : str
        The packaging it is (or will be) written in.
    """
    if format not in SERVED_FROM:
        return []
    cfg = DrafterConfig.from_dict(p.config)
    if not cfg.has_markov:
        if cfg.sample_from_anchor:
            return [
                "SGLang cannot serve it: its DSpark needs a Markov head (markov_rank > 0) and its DFlash drafts "
                "from slots 1 .. only (sample_from_anchor=false)"
            ]
        if format == "deepspec":
            return [
                "SGLang refuses it as DSpark (no Markov head); write format='specforge' to serve it with "
                "--speculative-algorithm DFLASH"
            ]
        return []
    notes = []
    if not cfg.sample_from_anchor:
        notes.append(
            f"SGLang reads block_size {cfg.block_slots} as gamma, one more than the {cfg.block_size} drafts "
            f"trained: pass --speculative-num-draft-tokens {cfg.block_size + 1}"
        )
    dropped = [k for k in DSPARK_ONLY if p.config.get(k)]
    if dropped:
        notes.append(f"SGLang skips {', '.join(dropped)} (dspark-only) without a word and drafts without it")
    if p.draft_vocab is not None:
        notes.append(
            f"SGLang does not read the draft vocabulary ({p.draft_vocab.numel()} ids): it drafts over all "
            f"{cfg.vocab_size} ids"
        )
    if not cfg.enable_confidence_head:
        notes.append(
            "no confidence head: SGLang serves it only with SGLANG_RAGGED_VERIFY_MODE=static (its default)"
        )
    return notes
