# SPDX-License-Identifier: Apache-2.0
"""The drafter's configuration: DeepSpec's ``config.json`` (a copy of the target's config plus DSpark fields)."""

from __future__ import annotations

import copy
import dataclasses
import numbers
import operator
from typing import Any

import torch

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
ARCHITECTURE = "Qwen3DSparkModel"

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


def dtype_from_name(name: Any) -> torch.dtype | None:
    """``"bfloat16"`` / ``"torch.bfloat16"`` / a ``torch.dtype`` -> ``torch.dtype`` (None when absent/unknown)."""
    if isinstance(name, torch.dtype):
        return name
    if not isinstance(name, str):
        return None
    return _DTYPES.get(name.removeprefix("torch."))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _as_int(value: Any) -> int:
    if isinstance(value, bool):  # JSON true/false are not counts
        raise TypeError
    return operator.index(value)  # int and numpy integers; floats and strings raise TypeError


def _as_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError
    return float(value)


def _as_bool(value: Any) -> bool:
    if not isinstance(value, bool):  # "false" would be truthy
        raise TypeError
    return value


def _as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError
    return value


def _as_int_list(value: Any) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise TypeError
    return [_as_int(v) for v in value]


# annotation of a DrafterConfig field (``| None`` stripped) -> (converter, what a config.json must hold)
_KINDS = {
    "int": (_as_int, "an int"),
    "float": (_as_float, "a number"),
    "bool": (_as_bool, "a bool (true/false)"),
    "str": (_as_str, "a string"),
    "list[int]": (_as_int_list, "a list of ints"),
}


_YARN_OPTIONAL = ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim")


def _yarn_fields(rope: dict, max_positions: Any) -> dict:
    """YaRN's fields from a ``rope_scaling`` / ``rope_parameters`` dict, checked (the field is named)."""
    out: dict[str, Any] = {"rope_type": "yarn"}
    original = rope.get("original_max_position_embeddings", max_positions)
    factor = rope.get("factor")
    try:
        out["original_max_position_embeddings"] = _as_int(original)
        if factor is None:  # DeepSeek-style: the ratio of the context lengths
            factor = _as_int(max_positions) / out["original_max_position_embeddings"]
        out["factor"] = _as_float(factor)
        for key in _YARN_OPTIONAL:
            if rope.get(key) is not None:
                out[key] = _as_float(rope[key])
        if rope.get("truncate") is not None:
            out["truncate"] = _as_bool(rope["truncate"])
    except TypeError:
        raise ValueError(
            "drafter config: rope_scaling (yarn): factor, original_max_position_embeddings (or "
            f"max_position_embeddings) and the optional {_YARN_OPTIONAL} must be numbers, truncate a bool; "
            f"got {rope}"
        ) from None
    if not (out["factor"] > 0 and out["original_max_position_embeddings"] > 0):
        raise ValueError(
            f"drafter config: rope_scaling (yarn): factor and original_max_position_embeddings must be > 0, got {rope}"
        )
    return out


@dataclasses.dataclass
class DrafterConfig:
    """The fields of a DSpark drafter config that the model reads (see docs/drafter.md).

    ``raw`` keeps the whole ``config.json`` (the inherited target fields included) so that ``save_pretrained``
    writes back the same keys; only the DSpark fields and ``dtype`` are refreshed from the attributes.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_hidden_layers: int
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    num_target_layers: int | None = None
    markov_rank: int = 0
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    # drafter v2 inputs (docs/drafter.md, "Copy channel"); all off in DeepSpec's checkpoints
    copy_channel: bool = False  # the history's lookup continuation enters the block (copy_proj, copy_embed)
    copy_min_match: int = 2  # the continuation's match rule (LookupConfig's min_match / max_match)
    copy_max_match: int = 3
    # extents at which a copy_max_match copy gets a class of its own (docs/drafter.md, "Copy classes"); [] keys
    # the copy inputs by match length alone, as before
    copy_extent_bounds: list[int] = dataclasses.field(default_factory=list)
    context_projection: bool = False  # context row a-1 projected (context_proj) into every block row
    learned_mask: bool = False  # a trained MASK input (mask_embed) instead of mask_token_id's embedding
    tap_norm: bool = False  # an RMSNorm per tapped layer before fc (tap_norm.weight, (m * H,))
    copy_head: bool = False  # a learned bonus on the copied token's logit and confidence (copy_head.*)
    copy_greedy_bias: bool = False  # the copy head's extra bonus for greedy rows (copy_head.greedy_bias)
    # False: DFlash's layout (z-lab, SpecForge): the anchor's slot predicts nothing, the block has
    # block_size + 1 slots and slot j + 1 drafts token j (docs/file-formats.md, "Drafter packagings")
    sample_from_anchor: bool = True
    # YaRN's fields (rope_type "yarn": factor, original_max_position_embeddings, ...; layers.yarn_inv_freq)
    rope_scaling: dict | None = None
    dtype: torch.dtype | None = None
    raw: dict = dataclasses.field(default_factory=dict, repr=False)

    # ---- derived --------------------------------------------------------------------------------------------
    @property
    def num_taps(self) -> int:
        """Number of tapped target layers (``m``); ``fc`` maps ``m * H`` features to ``H``."""
        return len(self.target_layer_ids)

    @property
    def uses_copies(self) -> bool:
        """Whether drafting reads the history's lookup continuation (``copy_channel`` or ``copy_head``)."""
        return self.copy_channel or self.copy_head

    @property
    def num_copy_classes(self) -> int:
        """Classes of the copy inputs' ``copy_match``: 0 (no copy), the match lengths ``1 .. copy_max_match``,
        then one per ``copy_extent_bounds`` entry (``dspark.decoding.lookup.match_class``'s layout)."""
        return self.copy_max_match + 1 + len(self.copy_extent_bounds)

    @property
    def block_slots(self) -> int:
        """Slots of the block forward: ``block_size`` drafts, plus the anchor's when it predicts nothing."""
        return self.block_size + (0 if self.sample_from_anchor else 1)

    @property
    def has_markov(self) -> bool:
        return self.markov_rank > 0

    @property
    def confidence_input_rank(self) -> int:
        """``r`` part of the confidence head's input ``[h_k; W1[x_{k-1}]]`` (0 without the Markov feature)."""
        return self.markov_rank if (self.has_markov and self.confidence_head_with_markov) else 0

    # ---- parsing --------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict) -> DrafterConfig:
        """Parse a DeepSpec drafter ``config.json`` dict; ValueError naming the field when one is missing/bad.

        Every field is checked against its annotated type (an int is not a bool, a number may be an int), so a
        value like ``"block_size": "seven"`` or ``"enable_confidence_head": "false"`` is an error naming it.
        """
        if not isinstance(d, dict):
            raise ValueError(f"drafter config: expected a JSON object, got a {type(d).__name__}")

        def get(key: str, default: Any = None) -> Any:
            value = d.get(key)
            return default if value is None else _typed(key, value, key)

        def need(key: str) -> Any:
            if d.get(key) is None:
                raise ValueError(f"drafter config: {key}: missing (expected {_FIELD_KINDS[key][1]})")
            return get(key)

        hidden = need("hidden_size")
        heads = need("num_attention_heads")
        rope = d.get("rope_parameters") or {}
        if isinstance(rope, dict) and "full_attention" in rope and isinstance(rope["full_attention"], dict):
            rope = rope["full_attention"]
        rope_type = (
            rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        )
        scaling = d.get("rope_scaling")
        if isinstance(scaling, dict):
            rope_type = scaling.get("rope_type", scaling.get("type", rope_type))
        if rope_type not in ("default", "yarn", None):
            raise ValueError(
                f"drafter config: rope_parameters.rope_type {rope_type!r} is not supported "
                "(only 'default' and 'yarn')"
            )
        yarn = None
        if rope_type == "yarn":
            yarn = _yarn_fields(
                scaling if isinstance(scaling, dict) else rope, d.get("max_position_embeddings")
            )
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        if theta is not None:
            theta = _typed("rope_theta", theta, "rope_parameters.rope_theta")
        else:
            theta = get("rope_theta", 10000.0)
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"drafter config: hidden_act {act!r} is not supported (only 'silu')")
        if d.get("attention_bias"):
            raise ValueError(
                "drafter config: attention_bias=true is not supported (DeepSpec drafters have none)"
            )
        # config.json's block_size is the block's length; without sample_from_anchor one slot drafts nothing
        from_anchor = get("sample_from_anchor", True)
        cfg = cls(
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_attention_heads=heads,
            # 0 / null fall back to the defaults, as transformers' configs do
            num_key_value_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or hidden // max(heads, 1),  # heads < 1: validate() names it
            vocab_size=need("vocab_size"),
            num_hidden_layers=need("num_hidden_layers"),
            block_size=need("block_size") - (0 if from_anchor else 1),
            mask_token_id=need("mask_token_id"),
            target_layer_ids=need("target_layer_ids"),
            num_target_layers=get("num_target_layers"),
            markov_rank=get("markov_rank", 0),
            markov_head_type=get("markov_head_type") or "vanilla",
            enable_confidence_head=get("enable_confidence_head", False),
            confidence_head_with_markov=get("confidence_head_with_markov", True),
            rms_norm_eps=get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            copy_channel=get("copy_channel", False),
            copy_min_match=get("copy_min_match", 2),
            copy_max_match=get("copy_max_match", 3),
            copy_extent_bounds=get("copy_extent_bounds", []),
            context_projection=get("context_projection", False),
            learned_mask=get("learned_mask", False),
            tap_norm=get("tap_norm", False),
            copy_head=get("copy_head", False),
            copy_greedy_bias=get("copy_greedy_bias", False),
            sample_from_anchor=from_anchor,
            rope_scaling=yarn,
            dtype=dtype_from_name(d.get("dtype", d.get("torch_dtype"))),
            raw=copy.deepcopy(d),
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Checks that need only the config (the pairing with a target is checked in ``pairing.py``)."""
        if self.block_size < 1:
            raise ValueError(
                f"drafter config: block_size must be >= {self.block_slots - self.block_size + 1}"
                f"{'' if self.sample_from_anchor else ' (sample_from_anchor=false)'}, got {self.block_slots}"
            )
        if not self.sample_from_anchor and (self.uses_copies or self.context_projection or self.learned_mask):
            raise ValueError(
                "drafter config: sample_from_anchor=false is supported only without the v2 inputs "
                "(copy_channel, copy_head, context_projection, learned_mask)"
            )
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"drafter config: mask_token_id {self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})"
            )
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"drafter config: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"drafter config: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"drafter config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_hidden_layers < 1:
            raise ValueError(f"drafter config: num_hidden_layers must be >= 1, got {self.num_hidden_layers}")
        ids = self.target_layer_ids
        if not ids:
            raise ValueError("drafter config: target_layer_ids is empty")
        if any(i < -1 for i in ids) or any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
            raise ValueError(
                f"drafter config: target_layer_ids must be strictly increasing, each -1 or a 0-based target "
                f"layer index, got {ids}"
            )
        if self.num_target_layers is not None and ids[-1] >= self.num_target_layers - 1:
            raise ValueError(
                f"drafter config: target_layer_ids {ids} must stay below the target's last layer "
                f"(num_target_layers = {self.num_target_layers}; its last hidden state is normed)"
            )
        if self.uses_copies and not 1 <= self.copy_min_match <= self.copy_max_match:
            raise ValueError(
                f"drafter config: copy_min_match / copy_max_match must satisfy 1 <= min <= max, got "
                f"{self.copy_min_match} / {self.copy_max_match}"
            )
        if self.copy_greedy_bias and not self.copy_head:
            raise ValueError("drafter config: copy_greedy_bias needs the copy head (copy_head: true)")
        b = self.copy_extent_bounds
        rising = all(y > x for x, y in zip(b, b[1:], strict=False))
        if b and (not self.uses_copies or b[0] <= self.copy_max_match or not rising):
            raise ValueError(
                f"drafter config: copy_extent_bounds must be strictly increasing, each above copy_max_match "
                f"({self.copy_max_match}), on a drafter that reads copies (copy_channel or copy_head), got {b}"
            )
        if self.markov_rank < 0:
            raise ValueError(f"drafter config: markov_rank must be >= 0, got {self.markov_rank}")
        if self.has_markov and self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(
                f"drafter config: markov_head_type must be one of {MARKOV_HEAD_TYPES}, got {self.markov_head_type!r}"
            )

    def to_dict(self) -> dict:
        """The ``config.json`` dict: ``raw`` with the DSpark fields (DeepSpec's names and format) refreshed."""
        d = copy.deepcopy(self.raw)
        d.pop("torch_dtype", None)
        d.pop("rope_theta", None)
        d.pop("rope_scaling", None)
        if self.rope_scaling is not None:
            d["rope_scaling"] = dict(self.rope_scaling)
        d.update(
            architectures=[ARCHITECTURE],
            model_type=d.get("model_type", "qwen3"),
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            num_hidden_layers=self.num_hidden_layers,
            layer_types=["full_attention"] * self.num_hidden_layers,
            block_size=self.block_slots,
            mask_token_id=self.mask_token_id,
            target_layer_ids=list(self.target_layer_ids),
            markov_rank=self.markov_rank,
            enable_confidence_head=self.enable_confidence_head,
            confidence_head_with_markov=self.confidence_head_with_markov,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_theta": self.rope_theta, "rope_type": "default"},
            tie_word_embeddings=False,
            hidden_act="silu",
            attention_bias=False,
        )
        if self.num_target_layers is not None:
            d["num_target_layers"] = self.num_target_layers
        for key in V2_FIELDS:  # written only when on, so a DeepSpec drafter's config.json is unchanged
            d.pop(key, None)
        if self.uses_copies:
            d.update(copy_min_match=self.copy_min_match, copy_max_match=self.copy_max_match)
        if self.copy_extent_bounds:
            d["copy_extent_bounds"] = list(self.copy_extent_bounds)
        for key in (
            "copy_channel",
            "context_projection",
            "learned_mask",
            "tap_norm",
            "copy_head",
            "copy_greedy_bias",
        ):
            if getattr(self, key):
                d[key] = True
        d.pop("sample_from_anchor", None)
        if not self.sample_from_anchor:  # written only when off, like the v2 flags
            d["sample_from_anchor"] = False
        if self.has_markov:
            d["markov_head_type"] = self.markov_head_type
        else:
            d.pop("markov_head_type", None)
        if self.dtype is not None:
            d["dtype"] = dtype_name(self.dtype)
        return d

    # ---- expected tensors -----------------------------------------------------------------------------------
    def tensor_shapes(self, *, with_embeddings: bool = True) -> dict[str, tuple[int, ...]]:
        """Every tensor name of DeepSpec's layout and its shape (``embed_tokens``/``lm_head`` optionally)."""
        H, V, D = self.hidden_size, self.vocab_size, self.head_dim
        q, kv, inter, r = (
            self.num_attention_heads * D,
            self.num_key_value_heads * D,
            self.intermediate_size,
            self.markov_rank,
        )
        s: dict[str, tuple[int, ...]] = {}
        if with_embeddings:
            s["embed_tokens.weight"] = (V, H)
        for i in range(self.num_hidden_layers):
            p = f"layers.{i}."
            s[p + "input_layernorm.weight"] = (H,)
            s[p + "self_attn.q_proj.weight"] = (q, H)
            s[p + "self_attn.k_proj.weight"] = (kv, H)
            s[p + "self_attn.v_proj.weight"] = (kv, H)
            s[p + "self_attn.o_proj.weight"] = (H, q)
            s[p + "self_attn.q_norm.weight"] = (D,)
            s[p + "self_attn.k_norm.weight"] = (D,)
            s[p + "post_attention_layernorm.weight"] = (H,)
            s[p + "mlp.gate_proj.weight"] = (inter, H)
            s[p + "mlp.up_proj.weight"] = (inter, H)
            s[p + "mlp.down_proj.weight"] = (H, inter)
        s["norm.weight"] = (H,)
        if self.tap_norm:
            s["tap_norm.weight"] = (self.num_taps * H,)
        s["fc.weight"] = (H, self.num_taps * H)
        if self.copy_channel:
            s["copy_proj.weight"] = (H, H)
            s["copy_embed.weight"] = (self.num_copy_classes, H)
        if self.context_projection:
            s["context_proj.weight"] = (H, H)
        if self.learned_mask:
            s["mask_embed"] = (H,)
        s["hidden_norm.weight"] = (H,)
        if with_embeddings:
            s["lm_head.weight"] = (V, H)
        if self.has_markov:
            s["markov_head.markov_w1.weight"] = (V, r)
            s["markov_head.markov_w2.weight"] = (V, r)
            if self.markov_head_type == "gated":
                s["markov_head.gate_proj.weight"] = (r, H + r)
                s["markov_head.gate_proj.bias"] = (r,)
            elif self.markov_head_type == "rnn":
                s["markov_head.joint_proj.weight"] = (3 * r, 2 * r + H)
                s["markov_head.joint_proj.bias"] = (3 * r,)
        if self.enable_confidence_head:
            s["confidence_head.proj.weight"] = (1, H + self.confidence_input_rank)
            s["confidence_head.proj.bias"] = (1,)
        if self.copy_head:
            g, n = self.block_size, self.num_copy_classes
            s["copy_head.logit_bias"] = (g, n)
            s["copy_head.logit_gate"] = (H,)
            s["copy_head.conf_bias"] = (g, 2, n)
            if self.copy_greedy_bias:
                s["copy_head.greedy_bias"] = (g, n)
        return s


# the config keys of the drafter v2 inputs (absent from DeepSpec's configs)
V2_FIELDS = (
    "copy_channel",
    "copy_min_match",
    "copy_max_match",
    "copy_extent_bounds",
    "context_projection",
    "learned_mask",
    "tap_norm",
    "copy_head",
    "copy_greedy_bias",
)

# field name -> (converter, expected), read off the dataclass annotations so a new field is checked too
_FIELD_KINDS = {
    f.name: _KINDS[str(f.type).removesuffix(" | None")]
    for f in dataclasses.fields(DrafterConfig)
    if str(f.type).removesuffix(" | None") in _KINDS
}


def _typed(field: str, value: Any, where: str) -> Any:
    """``value`` of config key ``where`` converted to the type of ``field``; ValueError naming it otherwise."""
    convert, expected = _FIELD_KINDS[field]
    try:
        return convert(value)
    except TypeError:
        raise ValueError(
            f"drafter config: {where}: expected {expected}, got {value!r} ({type(value).__name__})"
        ) from None
