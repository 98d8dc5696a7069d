# SPDX-License-Identifier: Apache-2.0
"""Reading and writing DeepSpec-layout drafter checkpoints (``config.json`` + safetensors, un-prefixed names)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import Tensor

from dspark.models.config import DrafterConfig

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
EMBEDDING_NAMES = ("embed_tokens.weight", "lm_head.weight")
# Prefixes that other writers add and DeepSpec strips (torch.compile wrappers); keys that are never weights.
_STRIP_PREFIXES = ("_orig_mod.",)
_IGNORED_PREFIXES = ("rotary_emb.",)


def read_config(path: str | os.PathLike) -> DrafterConfig:
    """Parse ``<path>/config.json`` (transformers-5 ``rope_parameters`` or the older ``rope_theta``).

    Raises
    ------
    FileNotFoundError
        No ``config.json``.
    ValueError
        Naming the file: not JSON, or a field missing or of the wrong type (naming the field).
    """
    p = Path(path) / CONFIG_NAME
    if not p.is_file():
        raise FileNotFoundError(f"drafter checkpoint {path}: no {CONFIG_NAME}")
    try:
        return DrafterConfig.from_dict(read_json(p))
    except ValueError as e:
        if str(e).startswith(str(p)):
            raise
        raise ValueError(f"{p}: {e}") from e


def read_json(p: Path) -> object:
    """The JSON document in ``p``; ValueError naming the file when it is not JSON."""
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None


def _shard_files(root: Path) -> list[Path]:
    """The safetensors files of a checkpoint: ``model.safetensors`` or the shards of its index."""
    if (root / WEIGHTS_NAME).is_file():
        return [root / WEIGHTS_NAME]
    index = root / INDEX_NAME
    if not index.is_file():
        raise FileNotFoundError(f"drafter checkpoint {root}: neither {WEIGHTS_NAME} nor {INDEX_NAME}")
    doc = read_json(index)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index}: expected an object with a 'weight_map' of tensor name -> file name")
    files = [root / name for name in sorted(set(weight_map.values()))]
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"{file}: missing (named by {index})")
    return files


def read_tensors(path: str | os.PathLike) -> dict[str, Tensor]:
    """All tensors of ``model.safetensors`` or of the shards named by ``model.safetensors.index.json``.

    Raises
    ------
    FileNotFoundError
        No weights file, or a shard the index names is missing.
    ValueError
        Naming the file: empty, truncated or not safetensors; a malformed index; a tensor stored twice.
    """
    from safetensors import SafetensorError, safe_open  # the ``hf`` extra

    out: dict[str, Tensor] = {}
    for file in _shard_files(Path(path)):
        if file.stat().st_size == 0:
            raise ValueError(f"{file}: empty (0 bytes), expected a safetensors file")
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    key = name
                    for pre in _STRIP_PREFIXES:
                        key = key.removeprefix(pre)
                    if key.startswith(_IGNORED_PREFIXES):
                        continue
                    if key in out:
                        raise ValueError(f"drafter checkpoint {path}: tensor {key!r} is stored twice")
                    out[key] = f.get_tensor(name)
        except SafetensorError as e:  # the library's message names neither the file nor the likely cause
            raise ValueError(
                f"{file}: truncated or not a safetensors file ({e}); expected a complete safetensors file"
            ) from None
    return out


def check_tensors(cfg: DrafterConfig, tensors: dict[str, Tensor], where: str = "drafter checkpoint") -> None:
    """Every expected tensor present with its shape, nothing extra; ``embed_tokens``/``lm_head`` are optional.

    Raises
    ------
    ValueError
        Naming the first missing, unexpected or mis-shaped tensor.
    """
    expected = cfg.tensor_shapes(with_embeddings=True)
    for name, shape in expected.items():
        if name not in tensors:
            if name in EMBEDDING_NAMES:
                continue
            why = ""
            if name.startswith("markov_head."):
                why = f" (config: markov_rank={cfg.markov_rank}, markov_head_type={cfg.markov_head_type!r})"
            elif name.startswith("confidence_head."):
                why = " (config: enable_confidence_head=true)"
            raise ValueError(f"{where}: missing tensor {name!r}{why}")
        got = tuple(tensors[name].shape)
        if got != shape:
            raise ValueError(f"{where}: tensor {name!r} has shape {list(got)}, expected {list(shape)}")
        if not tensors[name].is_floating_point():
            raise ValueError(
                f"{where}: tensor {name!r} has dtype {tensors[name].dtype}, expected a float dtype"
            )
    for name in tensors:
        if name not in expected:
            raise ValueError(
                f"{where}: unexpected tensor {name!r} (not part of this config's layout: "
                f"markov_rank={cfg.markov_rank}, markov_head_type={cfg.markov_head_type!r}, "
                f"enable_confidence_head={cfg.enable_confidence_head}, num_hidden_layers={cfg.num_hidden_layers})"
            )


def write_checkpoint(
    path: str | os.PathLike,
    cfg: DrafterConfig,
    tensors: dict[str, Tensor],
    max_shard_bytes: int | None = None,
) -> None:
    """Write ``config.json`` and a single ``model.safetensors`` (tensors made contiguous, storage unshared).

    ``max_shard_bytes``: when the tensors take more, write shards ``model-0000k-of-0000n.safetensors`` of at
    most that size (a tensor larger than it gets a shard of its own) and HF's ``model.safetensors.index.json``
    instead; ``read_tensors`` reads either.
    """
    from safetensors.torch import save_file  # the ``hf`` extra

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    flat: dict[str, Tensor] = {}
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:  # tied weights (e.g. a target whose lm_head is its embedding): store a copy
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        flat[name] = t
    for stale in root.glob("model-*-of-*.safetensors"):
        stale.unlink()
    index = root / INDEX_NAME
    if index.exists():  # a stale index from an earlier sharded save would shadow the new weights
        index.unlink()
    umask = os.umask(0)
    os.umask(umask)
    total = sum(t.numel() * t.element_size() for t in flat.values())
    if max_shard_bytes is None or total <= max_shard_bytes:
        shards = {WEIGHTS_NAME: flat}
    else:
        (root / WEIGHTS_NAME).unlink(missing_ok=True)
        groups: list[dict[str, Tensor]] = [{}]
        size = 0
        for name, t in flat.items():
            n = t.numel() * t.element_size()
            if groups[-1] and size + n > max_shard_bytes:
                groups.append({})
                size = 0
            groups[-1][name] = t
            size += n
        shards = {f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors": g for k, g in enumerate(groups)}
        weight_map = {name: file for file, g in shards.items() for name in g}
        index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    for file, group in shards.items():
        save_file(group, str(root / file), metadata={"format": "pt"})
        # safetensors creates the file owner-only (0600); give it the permissions any other new file gets
        os.chmod(root / file, 0o666 & ~umask)
    with open(root / CONFIG_NAME, "w") as f:
        json.dump(cfg.to_dict(), f, indent=2, sort_keys=True)
        f.write("\n")


def storage_dtype(tensors: dict[str, Tensor]) -> torch.dtype:
    """The dtype the backbone was stored in (that of ``fc.weight``)."""
    return tensors["fc.weight"].dtype
