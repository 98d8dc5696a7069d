# SPDX-License-Identifier: Apache-2.0
"""A drafter's checkpoint on disk and back: loading one (its dtype/device, and whether its embedding and LM head
alias the target's or are its own) and the tensors a save writes (``DSparkDrafter.from_pretrained`` /
``save_pretrained``; the rules are in docs/drafter.md)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor, nn

from dspark.models import checkpoint as ckpt
from dspark.models import packagings
from dspark.models.checkpoint import storage_dtype
from dspark.models.config import DrafterConfig, dtype_from_name
from dspark.models.draft_vocab import DRAFT_VOCAB_FILE, resolve_draft_vocab, save_draft_vocab
from dspark.models.packagings.base import DRAFT_ROWS_ONLY, Packaged
from dspark.models.pairing import check_same_weights, validate_pairing

SHARABLE = ("embed_tokens", "lm_head")
# the drafter class is passed in, not imported: drafter.py imports this module
D = TypeVar("D", bound=nn.Module)


def load_pretrained(
    cls: type[D],
    path: str | os.PathLike,
    target: nn.Module | None = None,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    share_target_embeddings: bool | None = None,
    tokenizer=None,
    draft_vocab: bool | str | os.PathLike | Tensor | Sequence[int] | None = True,
) -> D:
    """Build a ``cls`` drafter from a DeepSpec-layout checkpoint (arguments: ``DSparkDrafter.from_pretrained``).

    Parameters
    ----------
    cls : type
        ``DSparkDrafter`` (or a subclass).
    path, target, dtype, device, share_target_embeddings, tokenizer, draft_vocab
        As in ``DSparkDrafter.from_pretrained``.

    Returns
    -------
    nn.Module
        The drafter in eval mode, its tensors assigned (no copy through a random init).

    Raises
    ------
    ValueError
        Malformed checkpoint or draft vocabulary, or a pairing mismatch.
    """
    cfg, tensors, stored_vocab, where = read_any(path)
    ckpt.check_tensors(cfg, tensors, where=where)
    if target is not None:
        try:
            validate_pairing(cfg, target, tokenizer=tokenizer, drafter_dir=path)
        except ValueError as e:
            if stored_vocab is False:  # DeepSpec's layout: the messages as they always were
                raise
            raise ValueError(f"{where}: {e}") from None
    tables = target_tables(target)
    vocab = (
        stored_vocab
        if draft_vocab is True and stored_vocab is not False
        else resolve_draft_vocab(draft_vocab, path, cfg.vocab_size)
    )
    fill_rows_only(cfg, tensors, vocab, tables["lm_head"], where)
    dtype, device = resolve_dtype_device(cfg, tensors, tables["embed_tokens"], dtype, device)
    share = place_embeddings(
        tensors,
        tables,
        has_target=target is not None,
        dtype=dtype,
        device=device,
        share=share_target_embeddings,
    )
    cfg.dtype = dtype
    with torch.device("meta"):  # no init: every tensor is assigned from the checkpoint
        model = cls(cfg, own_embed=not share["embed_tokens"], own_lm_head=not share["lm_head"])
    model.load_state_dict(loaded_state(tensors, dtype, device), strict=True, assign=True)
    model.rotary_emb.reset(device)
    if target is not None:
        model.share_target_embeddings(target, embed=share["embed_tokens"], lm_head=share["lm_head"])
        model._check_runtime(target)
    model.set_draft_vocab(vocab)
    return model.eval()


def read_any(path: str | os.PathLike) -> tuple[DrafterConfig, dict[str, Tensor], Tensor | None | bool, str]:
    """A checkpoint folder of any packaging (``packagings.detect``) -> config, DeepSpec-named tensors, the
    packaging's draft vocabulary (``False`` for DeepSpec's layout, whose ``draft_vocab.json`` the caller
    resolves) and the name messages use."""
    kind = packagings.detect(path)
    if kind == "deepspec":
        return ckpt.read_config(path), ckpt.read_tensors(path), False, f"drafter checkpoint {path}"
    p = packagings.read(path, kind)
    where = f"{Path(path) / ckpt.CONFIG_NAME} ({kind})"
    try:
        cfg = DrafterConfig.from_dict(p.config)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return cfg, p.tensors, p.draft_vocab, where


def fill_rows_only(
    cfg: DrafterConfig, tensors: dict[str, Tensor], vocab, t_lm: Tensor | None, where: str
) -> None:
    """A checkpoint whose LM head / Markov W2 hold only the draft vocabulary's rows (``draft_rows_only``, from a
    packaging with a reduced vocabulary) must be drafted over that vocabulary; its LM head's other rows are
    taken from the target's (never read while drafting over it), so that a head equal to the target's at the
    draft rows aliases the target's."""
    if not cfg.raw.get(DRAFT_ROWS_ONLY):
        return
    if vocab is None:
        raise ValueError(
            f"{where}: draft_vocab: this checkpoint stores the LM head and Markov W2 rows of its draft vocabulary "
            "only (draft_rows_only), so it must be drafted over that vocabulary (keep draft_vocab=True)"
        )
    ids = torch.as_tensor(vocab, dtype=torch.int64)
    stored = tensors.get("lm_head.weight")
    if stored is not None and t_lm is not None and tuple(t_lm.shape) == tuple(stored.shape):
        full = t_lm.detach().to(device="cpu", dtype=stored.dtype).clone()
        full[ids] = stored[ids]
        tensors["lm_head.weight"] = full


def checkpoint_tensors(model: nn.Module, include_embeddings: bool = True) -> dict[str, Tensor]:
    """The DeepSpec-named tensors a save writes (``DSparkDrafter.checkpoint_tensors``).

    Parameters
    ----------
    model : DSparkDrafter
        The drafter.
    include_embeddings : bool
        Also the embedding and LM head when they alias the target's.

    Returns
    -------
    dict
        Name -> tensor; the confidence head in the backbone dtype where that is lossless.
    """
    out = dict(model.state_dict())
    if include_embeddings:
        out.setdefault("embed_tokens.weight", model.embed_weight)
        out.setdefault("lm_head.weight", model.lm_head_weight)
    if model.confidence_head is not None:  # stored in the backbone dtype when that is lossless
        for n in ("confidence_head.proj.weight", "confidence_head.proj.bias"):
            t = out[n]
            if torch.equal(t.to(model.dtype).float(), t):
                out[n] = t.to(model.dtype)
    return out


def save_pretrained(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    include_embeddings: bool = True,
    max_shard_bytes: int | None = None,
    format: str = "deepspec",
    verifier: str | None = None,
) -> None:
    """Write ``config.json`` + ``model.safetensors``, and ``draft_vocab.json`` or remove a stale one.

    ``format`` other than ``"deepspec"`` (``"speculators"``, ``"specforge"``) writes that packaging instead,
    atomically into an empty or new folder (``packagings.write_atomic``; ``verifier`` names the target in a
    speculators config); what it cannot represent is a ``ValueError`` naming it (docs/file-formats.md).

    Parameters
    ----------
    model : DSparkDrafter
        The drafter (its config's ``dtype`` is set to the drafter's).
    path : path
        The folder.
    include_embeddings : bool
        As in :func:`checkpoint_tensors`.
    max_shard_bytes : int, optional
        Shard the weights into files of at most this size (``write_checkpoint``).
    """
    model.config.dtype = model.dtype
    if format != "deepspec":
        tensors = checkpoint_tensors(model, include_embeddings)
        p = Packaged(model.config.to_dict(), tensors, model.draft_vocab, "deepspec", str(path))
        packagings.write_atomic(path, p, format, verifier=verifier)
        return
    ckpt.write_checkpoint(path, model.config, checkpoint_tensors(model, include_embeddings), max_shard_bytes)
    if model.draft_vocab is not None:
        save_draft_vocab(path, model.draft_vocab)
    else:
        (Path(path) / DRAFT_VOCAB_FILE).unlink(missing_ok=True)


def target_tables(target: nn.Module | None) -> dict[str, Tensor | None]:
    """The target's input embedding and LM head weights (None without a target / an output embedding)."""
    if target is None:
        return dict.fromkeys(SHARABLE)
    head = target.get_output_embeddings()
    return {
        "embed_tokens": target.get_input_embeddings().weight,
        "lm_head": head.weight if head is not None else None,
    }


def resolve_dtype_device(
    cfg: DrafterConfig,
    tensors: dict[str, Tensor],
    t_embed: Tensor | None,
    dtype: torch.dtype | str | None,
    device: torch.device | str | None,
) -> tuple[torch.dtype, torch.device]:
    """The drafter's dtype (asked, else the target's, else the checkpoint's) and device (asked, else the
    target's, else CPU)."""
    dt = dtype_from_name(dtype) if dtype is not None else None
    if dtype is not None and dt is None:
        raise ValueError(f"dtype: expected a torch dtype or one of float32/bfloat16/float16, got {dtype!r}")
    if dt is None:
        dt = t_embed.dtype if t_embed is not None else (cfg.dtype or storage_dtype(tensors))
    if device is not None:
        dev = torch.device(device)
    else:
        dev = t_embed.device if t_embed is not None else torch.device("cpu")
    if dev.type == "cuda" and dev.index is None:  # compare like the target's "cuda:N"
        dev = torch.device("cuda", torch.cuda.current_device())
    return dt, dev


def place_embeddings(
    tensors: dict[str, Tensor],
    tables: dict[str, Tensor | None],
    *,
    has_target: bool,
    dtype: torch.dtype,
    device: torch.device,
    share: bool | None,
) -> dict[str, bool]:
    """Decide, for ``embed_tokens`` and ``lm_head``, whether the drafter aliases the target's table.

    ``tensors`` is updated in place: an aliased table's stored copy is dropped; a table the drafter keeps is
    left (or put) there, already in ``dtype`` on ``device``.

    Parameters
    ----------
    tensors : dict
        The checkpoint's tensors (``embed_tokens.weight`` / ``lm_head.weight`` optional).
    tables : dict
        The target's weights by name (:func:`target_tables`).
    has_target : bool
        Whether a target was given.
    dtype, device
        What the drafter runs at.
    share : bool or None
        ``share_target_embeddings``: None aliases where the stored copy is absent or equals the target's at
        ``dtype`` (a cast copy when ``dtype``/``device`` differ from the target's); True always aliases; False
        keeps the stored copies as the drafter's own.

    Returns
    -------
    dict
        Name -> True when the target's module is to be aliased.

    Raises
    ------
    ValueError
        A table missing with nothing to share, or (``share=None``) a stored copy that differs from the target's.
    """
    aliased: dict[str, bool] = {}
    casts: dict[int, Tensor] = {}  # the target's tables cast to the drafter's dtype/device, one per storage

    def cast_copy(t_w: Tensor) -> Tensor:
        key = t_w.data_ptr()  # tied embedding / LM head: one copy
        if key not in casts:
            casts[key] = t_w.detach().to(device=device, dtype=dtype)
        return casts[key]

    for name in SHARABLE:
        key, t_w = name + ".weight", tables[name]
        stored = tensors.get(key)
        if share is False:
            if stored is None:
                raise ValueError(f"{key}: missing from the checkpoint and share_target_embeddings=False")
            aliased[name] = False  # the drafter's own, as stored
            continue
        if stored is None or share:
            if not has_target:
                why = "share_target_embeddings=True" if share else "missing from the checkpoint"
                raise ValueError(f"{key}: {why}; pass target= to share the target's")
            if t_w is None:
                raise ValueError(f"{name}: the target has none to share")
        if t_w is None:  # no target (or no LM head to share): the stored copy is the drafter's
            aliased[name] = False
            continue
        same_place = t_w.dtype == dtype and t_w.device == device
        if share or (stored is None and same_place):
            tensors.pop(key, None)
            aliased[name] = True  # an explicit alias of another dtype fails the runtime check, by design
            continue
        if stored is None:  # the drafter runs at another dtype/device: a cast copy instead of an alias
            tensors[key] = cast_copy(t_w)
            aliased[name] = False
            continue
        mine = stored.to(device=device, dtype=dtype)
        theirs = t_w if same_place else cast_copy(t_w)
        if torch.equal(mine, theirs):  # a copy of the target's: alias it (or share the one cast copy)
            if same_place:
                tensors.pop(key)
            else:
                tensors[key] = theirs
            aliased[name] = same_place
            continue
        # not bit-equal at the drafter's dtype: an error unless equal in the coarser dtype (e.g. a bf16 copy
        # of an fp32 target), in which case the stored values are what the drafter was trained with
        check_same_weights(key, stored, t_w)
        tensors[key] = mine
        aliased[name] = False
    return aliased


# the heads that stay float32 in a drafter of any dtype (``layers.Float32Module``)
FLOAT32_MODULES = ("confidence_head.", "copy_head.")


def loaded_state(tensors: dict[str, Tensor], dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
    """The state dict to assign: every tensor in ``dtype`` on ``device``, the confidence and copy heads in
    float32."""
    return {
        n: t.to(device=device, dtype=torch.float32 if n.startswith(FLOAT32_MODULES) else dtype)
        for n, t in tensors.items()
    }
