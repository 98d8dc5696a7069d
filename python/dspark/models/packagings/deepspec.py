# SPDX-License-Identifier: Apache-2.0
"""DeepSpec's layout (dspark's own): ``config.json`` = the target's config plus the DSpark fields, un-prefixed
tensor names, optional ``draft_vocab.json`` (docs/drafter.md, "Checkpoints")."""

from __future__ import annotations

import os
from pathlib import Path

from dspark.models import checkpoint as ckpt
from dspark.models.config import ARCHITECTURE, DrafterConfig
from dspark.models.draft_vocab import DRAFT_VOCAB_FILE, load_draft_vocab, save_draft_vocab
from dspark.models.packagings.base import Packaged, read_json

NAME = "deepspec"


# any of these at the top level marks DeepSpec's layout (a malformed one then gets DeepSpec's own errors)
FIELDS = ("block_size", "target_layer_ids", "mask_token_id", "markov_rank", "enable_confidence_head")


def matches(doc: dict) -> bool:
    """DSpark fields at the top level, or DeepSpec's architecture name (checked after the other packagings)."""
    return ARCHITECTURE in (doc.get("architectures") or []) or any(k in doc for k in FIELDS)


def read(path: str | os.PathLike) -> Packaged:
    root = Path(path)
    doc = read_json(root / ckpt.CONFIG_NAME)
    tensors = ckpt.read_tensors(root)
    vocab = None
    if (root / DRAFT_VOCAB_FILE).is_file():
        vocab = load_draft_vocab(root, int(doc.get("vocab_size") or 0))
    return Packaged(doc, tensors, vocab, NAME, str(root))


def write(path: str | os.PathLike, p: Packaged) -> None:
    cfg = DrafterConfig.from_dict(p.config)
    ckpt.write_checkpoint(path, cfg, p.tensors)
    if p.draft_vocab is not None:
        save_draft_vocab(path, p.draft_vocab)
