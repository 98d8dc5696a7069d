# SPDX-License-Identifier: Apache-2.0
"""What every packaging reads into and writes from: a :class:`Packaged` checkpoint in dspark's DeepSpec terms.

A packaging module maps its ``config.json`` to a DeepSpec-layout config dict and its tensor names to DeepSpec's
(docs/file-formats.md, "Drafter packagings"). Vocabulary-sized tables are always full size here (``[V, ...]``):
a packaging that stores only the draft vocabulary's rows (``lm_head`` ``[V', H]``, ``markov_w2`` ``[V', r]``)
is expanded with zero rows outside the draft vocabulary and marked ``draft_rows_only`` in the config, so that
writing it back gathers the same rows, bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dspark.models import checkpoint as ckpt

# config key (dspark's): the LM head and Markov W2 hold meaningful rows only at the draft vocabulary's ids
DRAFT_ROWS_ONLY = "draft_rows_only"
# the tables a draft vocabulary reduces in the engines' layouts, and their DeepSpec names
REDUCED_TABLES = ("lm_head.weight", "markov_head.markov_w2.weight")
# the DeepSpec config fields that describe the drafter's own transformer (Qwen3-shaped)
QWEN3_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "num_hidden_layers",
    "rms_norm_eps",
    "max_position_embeddings",
    "hidden_act",
    "attention_bias",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)
# the target's tables a drafter may store copies of
EMBEDDINGS = ("embed_tokens.weight", "lm_head.weight")
# dspark-only inputs that no engine's loader builds
DSPARK_ONLY = ("copy_channel", "copy_head", "context_projection", "learned_mask", "tap_norm")


@dataclasses.dataclass
class Packaged:
    """A drafter checkpoint in dspark's terms, whatever packaging it came from.

    ``config``: a DeepSpec-layout ``config.json`` dict (``DrafterConfig.from_dict`` parses it); ``tensors``:
    DeepSpec names, vocabulary tables full size; ``draft_vocab``: sorted int64 token ids or None; ``source``:
    the packaging's name; ``where``: the folder it was read from (for messages).
    """

    config: dict
    tensors: dict[str, Tensor]
    draft_vocab: Tensor | None = None
    source: str = "deepspec"
    where: str = ""


def read_json(path: Path) -> dict:
    """``path`` as a JSON object; ValueError naming the file otherwise."""
    if not path.is_file():
        raise FileNotFoundError(f"drafter checkpoint {path.parent}: no {path.name}")
    doc = ckpt.read_json(path)
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object, got a {type(doc).__name__}")
    return doc


def field(doc: dict, key: str, where: str, kind: type | tuple[type, ...], *, required: bool = True) -> Any:
    """``doc[key]`` checked against ``kind``; ValueError naming ``where`` (file and field) otherwise."""
    value = doc.get(key)
    if value is None:
        if required:
            raise ValueError(f"{where}: field {key!r} is missing")
        return None
    bad_bool = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    if bad_bool or not isinstance(value, kind):
        raise ValueError(f"{where}: field {key!r} = {value!r} has the wrong type")
    return value


def write_json(path: Path, doc: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")


def write_tensors(folder: Path, tensors: dict[str, Tensor]) -> None:
    """One ``model.safetensors`` (contiguous CPU tensors, tied storage copied)."""
    from safetensors.torch import save_file  # the ``hf`` extra

    flat, seen = {}, set()
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        if t.untyped_storage().data_ptr() in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        flat[name] = t
    save_file(flat, str(folder / ckpt.WEIGHTS_NAME), metadata={"format": "pt"})


def expand_rows(t: Tensor, ids: Tensor, vocab_size: int) -> Tensor:
    """Rows ``t[k]`` of the draft vocabulary's ids ``ids[k]`` placed in a zero ``[vocab_size, ...]`` table."""
    out = torch.zeros((vocab_size, *t.shape[1:]), dtype=t.dtype)
    out[ids] = t
    return out


def reduce_rows(t: Tensor, ids: Tensor) -> Tensor:
    """The rows of the draft vocabulary's ids, in id order."""
    return t[ids.to(t.device)].clone()


def refuse_dspark_only(config: dict, fmt: str) -> None:
    """ValueError naming the dspark-only inputs ``fmt``'s loaders cannot build."""
    on = [k for k in DSPARK_ONLY if config.get(k)]
    if on:
        raise ValueError(
            f"format={fmt!r}: {', '.join(on)} {'is' if len(on) == 1 else 'are'} dspark-only (no loader of "
            f"this packaging builds {'it' if len(on) == 1 else 'them'}); save with format='deepspec'"
        )


def rope_theta(config: dict) -> float:
    """The default-RoPE base of a DeepSpec-layout config (``rope_parameters`` or a top-level ``rope_theta``)."""
    rope = config.get("rope_parameters") or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    return float(theta if theta is not None else config.get("rope_theta", 10000.0))


def check_rope(doc: dict, where: str) -> dict | None:
    """The drafter computes default RoPE and YaRN: name the field of any other scaling; return the dict that
    holds YaRN's fields (None for default RoPE)."""
    yarn = None
    for key in ("rope_scaling", "rope_parameters"):
        rope = doc.get(key)
        if isinstance(rope, dict):
            kind = rope.get("rope_type", rope.get("type", "default"))
            if kind == "yarn":
                yarn = yarn or rope
            elif kind not in ("default", None):
                raise ValueError(
                    f"{where}: field {key}.rope_type = {kind!r}: dspark's drafter computes only the default "
                    "RoPE and YaRN, so this drafter cannot be run or converted faithfully"
                )
    return yarn


def check_layer_types(doc: dict, where: str) -> None:
    """Sliding-window draft layers are not representable (the drafter attends to the whole context)."""
    types = doc.get("layer_types") or []
    sliding = [i for i, t in enumerate(types) if t != "full_attention"]
    if sliding or doc.get("use_sliding_window"):
        raise ValueError(
            f"{where}: field 'layer_types' has non-full-attention layers {sliding} (or use_sliding_window): "
            "dspark's drafter has full attention only, so sliding-window drafters are not supported"
        )


def backbone_config(doc: dict, where: str) -> dict:
    """The Qwen3 fields of ``doc`` (the drafter's own transformer) as a DeepSpec-layout base config."""
    yarn = check_rope(doc, where)
    check_layer_types(doc, where)
    out = {k: doc[k] for k in QWEN3_FIELDS if doc.get(k) is not None}
    if yarn is not None:  # honoured: DrafterConfig reads YaRN's fields from rope_scaling
        out["rope_scaling"] = {k: v for k, v in yarn.items() if k != "rope_theta"}
    out["model_type"] = doc.get("model_type", "qwen3")
    rope = doc.get("rope_parameters")
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = doc.get("rope_theta") if theta is None else theta
    if theta is not None:
        out["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    for key in ("dtype", "torch_dtype"):
        if doc.get(key) is not None:
            out["dtype"] = doc[key]
    return out


def qwen3_fields(config: dict) -> dict:
    """The drafter's transformer fields of a DeepSpec-layout config, as a Qwen3 config dict."""
    out = {k: config[k] for k in QWEN3_FIELDS if config.get(k) is not None}
    n = int(config["num_hidden_layers"])
    out.update(
        model_type="qwen3",
        layer_types=["full_attention"] * n,
        rope_theta=rope_theta(config),
        rope_scaling=config.get("rope_scaling"),  # YaRN's fields, or None for default RoPE
        tie_word_embeddings=False,
        use_sliding_window=False,
        sliding_window=None,
        attention_bias=False,
        hidden_act="silu",
    )
    if config.get("dtype") is not None:
        out["dtype"] = config["dtype"]
    return out
