# SPDX-License-Identifier: Apache-2.0
"""Small HF causal LMs for decoder tests: random tiny Llama/Qwen3, and a Markov chain with known transitions."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from dspark.models.drafter import DSparkDrafter


def tiny_target(family: str = "llama", vocab: int = 96, seed: int = 0, layers: int = 4) -> torch.nn.Module:
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    else:
        raise ValueError(family)
    return model.eval()


def random_drafter(target, block_size: int = 4, markov_rank: int = 8, head: str = "vanilla", seed: int = 1):
    torch.manual_seed(seed)
    L = target.config.num_hidden_layers
    return DSparkDrafter.from_config(
        target,
        block_size=block_size,
        num_layers=1,
        target_layer_ids=sorted({0, L // 2 - 1, L - 2}),
        markov_rank=markov_rank,
        markov_head_type=head,
        initializer_range=0.2,
    ).eval()


def markov_chain_target(table: torch.Tensor, seed: int = 0) -> torch.nn.Module:
    """A 1-layer LlamaForCausalLM whose next-token logits are exactly ``table[previous token]`` ([V, V]).

    Attention and MLP outputs are zeroed, the embedding is a scaled one-hot, so the final hidden of token i is
    ``c * e_i`` after the final RMSNorm, and the LM head reads row i of the table.
    """
    V = table.shape[0]
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=V,
        intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    )
    model = LlamaForCausalLM(cfg).eval()
    s = 4.0
    c = s / (s * s / V + cfg.rms_norm_eps) ** 0.5
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(V) * s)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.copy_(table.t().double().div(c).float())
    return model


def markov_drafter(
    target, table: torch.Tensor, noise: float = 0.0, block_size: int = 3, seed: int = 2, conf_logits=None
):
    """A drafter whose Markov head carries ``table`` (+ noise): q_k = softmax((table[x_{k-1}] + noise) / T).

    ``conf_logits`` ([V]) makes the confidence of draft k depend only on x_{k-1}: c_k = sigmoid(conf_logits[x_{k-1}]).
    """
    V = table.shape[0]
    d = DSparkDrafter.from_config(
        target,
        block_size=block_size,
        num_layers=1,
        target_layer_ids=[0],
        markov_rank=V,
        markov_head_type="vanilla",
    ).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        d.norm.weight.zero_()  # hidden = 0 -> base logits U = 0
        d.markov_head.markov_w1.weight.copy_(torch.eye(V))
        d.markov_head.markov_w2.weight.copy_(table.t() + noise * torch.randn(V, V, generator=g))
        if conf_logits is not None:
            w = d.confidence_head.proj.weight  # [1, H + r]; hidden is 0, prev_emb = one-hot(x_{k-1})
            w.zero_()
            w[0, -V:] = torch.as_tensor(conf_logits, dtype=torch.float32)
            d.confidence_head.proj.bias.zero_()
    return d
