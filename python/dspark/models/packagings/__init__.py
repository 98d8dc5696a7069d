# SPDX-License-Identifier: Apache-2.0
"""Drafter packagings: detect which one a checkpoint folder uses, read it into dspark's terms
(:class:`~dspark.models.packagings.base.Packaged`), write one, convert between them (docs/file-formats.md,
"Drafter packagings").

Known packagings: ``deepspec`` (dspark's own; read and written), ``speculators`` (vLLM's; read and written),
``specforge`` (SpecForge / SGLang DSpark; read and written), ``dflash`` (z-lab's DFlash; read only).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from dspark.models import checkpoint as ckpt
from dspark.models.packagings import deepspec, dflash, specforge, speculators
from dspark.models.packagings.base import Packaged, read_json

# detection order: the most specific marker first (a speculators config may carry DeepSpec-looking fields)
READERS = {
    "speculators": speculators,
    "specforge": specforge,
    "dflash": dflash,
    "deepspec": deepspec,
}
WRITABLE = ("deepspec", "speculators", "specforge")
KNOWN = tuple(READERS)

__all__ = ["KNOWN", "WRITABLE", "Packaged", "convert", "detect", "read", "write"]


def _describe() -> str:
    return (
        "deepspec (top-level block_size / target_layer_ids / mask_token_id), speculators "
        "(speculators_model_type), specforge (dflash_config.projector_type 'dspark'), dflash "
        "(DFlashDraftModel with dflash_config)"
    )


def detect(path: str | os.PathLike) -> str:
    """The packaging of the checkpoint folder ``path`` (one of :data:`KNOWN`), read off its ``config.json``.

    Raises
    ------
    ValueError
        ``config.json`` matches none, naming the file and listing the known packagings.
    """
    p = Path(path) / ckpt.CONFIG_NAME
    doc = read_json(p)
    for name, module in READERS.items():
        if module.matches(doc):
            return name
    raise ValueError(f"{p}: unknown drafter packaging; known: {_describe()}")


def read(path: str | os.PathLike, packaging: str | None = None) -> Packaged:
    """Read a checkpoint folder of any known packaging (``packaging`` None: :func:`detect`)."""
    name = detect(path) if packaging is None else packaging
    if name not in READERS:
        raise ValueError(f"packaging: expected one of {list(KNOWN)}, got {name!r}")
    return READERS[name].read(path)


def check_format(format: str) -> None:
    """ValueError unless ``format`` is one of :data:`WRITABLE`."""
    if format not in WRITABLE:
        read_only = (
            " (dflash is read-only: its loaders take speculators' DFlash type)" if format == "dflash" else ""
        )
        raise ValueError(f"format: expected one of {list(WRITABLE)}, got {format!r}{read_only}")


def write(path: str | os.PathLike, p: Packaged, format: str = "deepspec", **options) -> None:
    """Write ``p`` into the folder ``path`` in ``format`` (one of :data:`WRITABLE`).

    ``options``: ``verifier`` (speculators: the target's name or path for ``speculators_config.verifier``).

    Raises
    ------
    ValueError
        An unknown format, or what the format cannot represent (naming it).
    """
    check_format(format)
    if format == "speculators":
        speculators.write(path, p, verifier=options.get("verifier"))
    elif format == "specforge":
        specforge.write(path, p)
    else:
        deepspec.write(path, p)


def write_atomic(
    path: str | os.PathLike, p: Packaged, format: str, *, force: bool = False, **options
) -> None:
    """:func:`write` into a temporary sibling folder, then rename it to ``path``: a failure leaves nothing.

    Raises
    ------
    FileExistsError
        ``path`` exists and is not an empty folder, unless ``force`` (it is then replaced).
    """
    out = Path(path)
    if out.exists() and not force and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out}: exists and is not empty (pass --force / force=True to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp, p, format, **options)
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def convert(
    src: str | os.PathLike, dst: str | os.PathLike, format: str, *, force: bool = False, **options
) -> Packaged:
    """Convert the checkpoint folder ``src`` (any known packaging) into ``dst`` in ``format``, file to file
    (tensors are copied as stored: no dtype change). Returns the checkpoint as read (``.source``: the source's
    packaging name), which is what was written."""
    check_format(format)  # before reading src or touching dst
    p = read(src)
    write_atomic(dst, p, format, force=force, **options)
    return p
