# SPDX-License-Identifier: Apache-2.0
"""Target features for drafter training: tapped layer outputs and the final-normed hidden of every token.

For a sequence ``input_ids`` ``[S]`` (prompt + regenerated response) the target runs once and gives

* ``features`` ``[S, m * H]``: the outputs of the decoder layers ``target_layer_ids`` (HF ``hidden_states[l + 1]``)
  concatenated in that order — what serving feeds the drafter's context (``DSparkDrafter.append_context``);
* ``last_hidden`` ``[S, H]``: the final-normed hidden; ``lm_head(last_hidden[t])`` is the target's distribution
  of token ``t + 1`` (the teacher of the L1 and confidence terms);
* ``p_lse`` ``[S]`` fp32: ``logsumexp(lm_head(last_hidden[t]))`` of the stored (rounded) hidden, in fp32, at the
  response rows (NaN at prompt rows, which no loss reads). With it, training over a draft vocabulary of ``V'`` ids
  gets the target's probabilities of those ids from a ``V'``-column product instead of the whole LM head.

:class:`FeatureCache` stores them as bf16 safetensors shards (a few hundred sequences per shard) so several
epochs and several drafters (DSpark and the DFlash ablation) share one target pass; docs/training.md says when
to cache and when to compute online (:func:`target_features` is the same computation).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor


@dataclass
class Sample:
    """One training sequence and its target features."""

    input_ids: Tensor  # [S] int64
    loss_mask: Tensor  # [S] bool: response tokens (what the drafter learns to predict)
    features: Tensor  # [S, m * H]
    last_hidden: Tensor  # [S, H]
    p_lse: Tensor | None = None  # [S] float32 (NaN at prompt rows); None in caches built without it


def final_norm(target) -> torch.nn.Module:
    """The target's final norm (``model.norm``), whose output the LM head reads.

    Raises
    ------
    ValueError
        When the target has no such module.
    """
    base = target.get_decoder() if hasattr(target, "get_decoder") else target.model
    norm = getattr(base, "norm", None)
    if norm is None:
        raise ValueError(f"target: {type(target).__name__} has no final norm module `model.norm` to tap")
    return norm


@torch.no_grad()
def target_features(
    target, input_ids: Sequence[int] | Tensor, layer_ids: Sequence[int]
) -> tuple[Tensor, Tensor]:
    """``(features [S, m*H], last_hidden [S, H])`` of one sequence (one plain HF forward, no cache).

    ``layer_ids`` are 0-based decoder layer indices (layer ``i`` is HF's ``hidden_states[i + 1]``) or ``-1``, the
    embedding output (``hidden_states[0]``), as the serving path (:class:`dspark.models.target.TargetAdapter`) taps
    them.
    """
    from dspark.models.support import decoder_layers, tap_layers

    ids = torch.as_tensor(input_ids, dtype=torch.int64).view(1, -1).to(next(target.parameters()).device)
    layers = decoder_layers(target)
    if layers is None:
        raise ValueError(f"target: {type(target).__name__} has no decoder layer list to tap")
    bad = [i for i in layer_ids if not -1 <= i < len(layers)]
    if bad:
        raise ValueError(f"layer_ids: {bad} outside [-1, {len(layers)}) (-1: the embedding output)")
    captured: dict[object, Tensor] = {}
    hooks = tap_layers(layers, sorted(set(layer_ids)), captured.__setitem__)
    hooks.append(final_norm(target).register_forward_hook(lambda m, i, o: captured.__setitem__("last", o)))
    try:
        target.model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    feats = torch.cat([captured[i].reshape(ids.shape[1], -1) for i in layer_ids], -1)
    return feats, captured["last"].reshape(ids.shape[1], -1)


@torch.no_grad()
def response_lse(lm_head: Tensor, last_hidden: Tensor, prompt_len: int) -> Tensor:
    """``[S]`` fp32 ``logsumexp`` of the target's logits ``last_hidden[t] · lm_headᵀ`` at rows ``t >= prompt_len``
    (NaN before), in fp32 from ``last_hidden`` ``[S, H]`` as given (the stored, rounded values) and the LM head
    ``(V, H)`` (pass the fp32 weights the drafter will be trained with)."""
    w = lm_head.float()
    out = torch.full((last_hidden.shape[0],), float("nan"), dtype=torch.float32)
    rows = last_hidden[prompt_len:].to(w.device, torch.float32)
    for b in range(0, rows.shape[0], 256):  # [256, V] fp32 logits at a time
        out[prompt_len + b : prompt_len + b + 256] = torch.logsumexp(rows[b : b + 256] @ w.T, -1).cpu()
    return out


def loss_mask_for(prompt_len: int, total_len: int) -> Tensor:
    """Response tokens are positions ``prompt_len .. total_len - 1``."""
    m = torch.zeros(total_len, dtype=torch.bool)
    m[prompt_len:] = True
    return m


class FeatureCache:
    """Directory of bf16 safetensors shards written by :meth:`build`; index in ``index.json``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        idx = self.path / "index.json"
        if not idx.is_file():
            raise FileNotFoundError(f"feature cache: {idx} not found (build it with `dspark train features`)")
        self.index = json.loads(idx.read_text())
        for key in ("layer_ids", "shards", "samples"):
            if key not in self.index:
                raise ValueError(f"feature cache: {idx} has no '{key}'")
        self._handles: dict[str, object] = {}

    @property
    def layer_ids(self) -> list[int]:
        return list(self.index["layer_ids"])

    def __len__(self) -> int:
        return len(self.index["samples"])

    def sample_ids(self) -> list[str]:
        return [s["id"] for s in self.index["samples"]]

    def _shard(self, name: str):
        """An open (memory-mapped) handle of shard ``name``; reading a sample reads only its tensors, so samples
        drawn from different shards in a row cost no more than samples of one shard."""
        from safetensors import safe_open

        if name not in self._handles:
            self._handles[name] = safe_open(str(self.path / name), framework="pt")
        return self._handles[name]

    def __getitem__(self, i: int) -> Sample:
        s = self.index["samples"][i]
        h = self._shard(s["shard"])
        k = s["key"]
        ids = h.get_tensor(f"{k}.input_ids").to(torch.int64)
        return Sample(
            ids,
            loss_mask_for(s["prompt_len"], ids.numel()),
            h.get_tensor(f"{k}.features"),
            h.get_tensor(f"{k}.last_hidden"),
            h.get_tensor(f"{k}.p_lse") if f"{k}.p_lse" in h.keys() else None,
        )

    def tokens(self, indices: Sequence[int] | None = None) -> Iterator[tuple[Tensor, Tensor]]:
        """``(input_ids [S] int64, loss_mask [S] bool)`` of each sample in ``indices`` (all by default), in that
        order, without reading the features (each shard is opened once, memory-mapped)."""
        for i in range(len(self)) if indices is None else indices:
            s = self.index["samples"][i]
            ids = self._shard(s["shard"]).get_tensor(f"{s['key']}.input_ids").to(torch.int64)
            yield ids, loss_mask_for(s["prompt_len"], ids.numel())

    @staticmethod
    def build(
        target,
        rows: Sequence[dict],
        layer_ids: Sequence[int],
        out_dir: str | os.PathLike,
        *,
        shard_size: int = 128,
        min_response_tokens: int = 8,
        dtype: torch.dtype = torch.bfloat16,
        progress: bool = True,
        lm_head: Tensor | None = None,
    ) -> FeatureCache:
        """Run the target over regenerated ``rows`` (``prompt_ids`` + ``response_ids``) and write the shards.

        Resumable: shards already listed in ``index.json`` are kept and their samples skipped. Rows with fewer
        than ``min_response_tokens`` response tokens are dropped. ``lm_head`` ``(V, H)``: the weights ``p_lse`` is
        computed with (the target's output embedding by default; pass the fp32 head when the target runs in a
        lower precision here but the drafter trains against the fp32 one).
        """
        from safetensors.torch import save_file
        from tqdm.auto import tqdm

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        idx_path = out / "index.json"
        index = (
            json.loads(idx_path.read_text())
            if idx_path.is_file()
            else {
                "layer_ids": list(layer_ids),
                "dtype": str(dtype).removeprefix("torch."),
                "shards": [],
                "samples": [],
            }
        )
        if list(index["layer_ids"]) != list(layer_ids):
            raise ValueError(
                f"feature cache {out}: built for layers {index['layer_ids']}, asked for {list(layer_ids)}"
            )
        done = {s["id"] for s in index["samples"]}
        todo = [r for r in rows if r["id"] not in done and len(r["response_ids"]) >= min_response_tokens]
        head = (target.get_output_embeddings().weight if lm_head is None else lm_head).detach().float()
        bar = tqdm(total=len(todo), desc="target features", unit="seq", disable=not progress)
        for b in range(0, len(todo), shard_size):
            chunk = todo[b : b + shard_size]
            name = f"shard-{len(index['shards']):05d}.safetensors"
            tensors, metas = {}, []
            for j, r in enumerate(chunk):
                ids = list(r["prompt_ids"]) + list(r["response_ids"])
                feats, last = target_features(target, ids, layer_ids)
                key = f"s{j}"
                tensors[f"{key}.input_ids"] = torch.tensor(ids, dtype=torch.int32)
                tensors[f"{key}.features"] = feats.to(dtype).contiguous().cpu()
                last = last.to(dtype)  # p_lse is of the stored (rounded) hidden, on the target's device
                tensors[f"{key}.last_hidden"] = last.contiguous().cpu()
                tensors[f"{key}.p_lse"] = response_lse(head, last, len(r["prompt_ids"]))
                metas.append(
                    {
                        "id": r["id"],
                        "shard": name,
                        "key": key,
                        "prompt_len": len(r["prompt_ids"]),
                        "length": len(ids),
                    }
                )
                bar.update(1)
            save_file(tensors, str(out / name))
            index["shards"].append(name)
            index["samples"].extend(metas)
            tmp = idx_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(index))
            tmp.replace(idx_path)
        bar.close()
        return FeatureCache(out)
