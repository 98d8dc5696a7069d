# SPDX-License-Identifier: Apache-2.0
"""Checkpoint round trip, malformed checkpoints, pairing validation, embedding sharing, from_config."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from dspark import DSparkDrafter
from dspark.models.config import DrafterConfig
from tests.models.drafter_fixtures import (
    random_checkpoint,
    tiny_config,
    tiny_llama_target,
    tiny_qwen3_target,
    write_checkpoint,
)


def _stored(path):
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("head_type,rank", [("vanilla", 6), ("gated", 4), ("rnn", 4), ("vanilla", 0)])
def test_save_load_round_trip(tmp_path, head_type, rank):
    cfg = tiny_config(head_type, rank)
    w = random_checkpoint(tmp_path / "a", cfg)
    d = DSparkDrafter.from_pretrained(tmp_path / "a")
    d.save_pretrained(tmp_path / "b")
    saved = _stored(tmp_path / "b")
    assert set(saved) == set(w)  # DeepSpec's names exactly
    for k in w:
        assert torch.equal(saved[k], w[k]), k
    new_cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    for key in (
        "block_size",
        "target_layer_ids",
        "mask_token_id",
        "markov_rank",
        "enable_confidence_head",
        "confidence_head_with_markov",
        "num_hidden_layers",
        "num_target_layers",
        "architectures",
        "max_window_layers",
        "num_anchors",
    ):
        assert new_cfg[key] == cfg[key], key
    assert new_cfg["rope_parameters"]["rope_theta"] == 10000.0
    assert ("markov_head_type" in new_cfg) == (rank > 0)
    d2 = DSparkDrafter.from_pretrained(tmp_path / "b")
    for (n1, t1), (n2, t2) in zip(d.state_dict().items(), d2.state_dict().items(), strict=True):
        assert n1 == n2 and t1.dtype == t2.dtype and torch.equal(t1, t2), n1


def test_bf16_round_trip_keeps_confidence_fp32(tmp_path):
    cfg = tiny_config("vanilla", 6)
    random_checkpoint(tmp_path / "a", cfg)
    d = DSparkDrafter.from_pretrained(tmp_path / "a", dtype=torch.bfloat16)
    assert d.fc.weight.dtype == torch.bfloat16
    assert d.confidence_head.proj.weight.dtype == torch.float32
    d.save_pretrained(tmp_path / "b")
    assert json.loads((tmp_path / "b" / "config.json").read_text())["dtype"] == "bfloat16"
    d2 = DSparkDrafter.from_pretrained(tmp_path / "b")
    assert d2.dtype == torch.bfloat16
    for (n1, t1), (_, t2) in zip(d.state_dict().items(), d2.state_dict().items(), strict=True):
        assert t1.dtype == t2.dtype and torch.equal(t1, t2), n1
    d.to(torch.float32).to(torch.bfloat16)  # a cast keeps the confidence head exactly
    assert torch.equal(d.confidence_head.proj.weight, d2.confidence_head.proj.weight)


def test_sharded_index(tmp_path):
    cfg = tiny_config("vanilla", 6)
    w = random_checkpoint(tmp_path / "a", cfg)
    from safetensors.torch import save_file

    root = tmp_path / "s"
    root.mkdir()
    names = sorted(w)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    for f, ns in shards.items():
        save_file({n: w[n] for n in ns}, str(root / f))
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {n: f for f, ns in shards.items() for n in ns}})
    )
    (root / "config.json").write_text(json.dumps(cfg))
    d = DSparkDrafter.from_pretrained(root)
    assert torch.equal(d.fc.weight, w["fc.weight"])


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda t: t.pop("layers.1.self_attn.k_norm.weight"), "layers.1.self_attn.k_norm.weight"),
        (lambda t: t.pop("markov_head.markov_w2.weight"), "markov_head.markov_w2.weight"),
        (lambda t: t.pop("confidence_head.proj.bias"), "confidence_head.proj.bias"),
        (
            lambda t: t.__setitem__("layers.2.mlp.up_proj.weight", torch.zeros(48, 32)),
            "layers.2.mlp.up_proj.weight",
        ),
        (lambda t: t.__setitem__("fc.weight", torch.zeros(32, 64)), "fc.weight"),
        (
            lambda t: t.__setitem__("markov_head.markov_w1.weight", torch.zeros(64, 5)),
            "markov_head.markov_w1.weight",
        ),
        (lambda t: t.__setitem__("lm_head.weight", torch.zeros(63, 32)), "lm_head.weight"),
    ],
)
def test_malformed_checkpoint_names_the_tensor(tmp_path, mutate, needle):
    cfg = tiny_config("vanilla", 6)
    w = random_checkpoint(tmp_path / "a", cfg)
    mutate(w)
    write_checkpoint(tmp_path / "b", cfg, w)
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        DSparkDrafter.from_pretrained(tmp_path / "b")


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("block_size", 0, "block_size"),
        ("mask_token_id", 64, "mask_token_id"),
        ("target_layer_ids", [2, 1], "target_layer_ids"),
        ("target_layer_ids", [0, 5], "target_layer_ids"),  # the target's last layer (6 layers)
        ("markov_head_type", "lstm", "markov_head_type"),
        ("vocab_size", None, "vocab_size"),
    ],
)
def test_bad_config_names_the_field(tmp_path, field, value, needle):
    cfg = tiny_config("vanilla", 6)
    random_checkpoint(tmp_path / "a", cfg)
    cfg[field] = value
    (tmp_path / "a" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=needle):
        DSparkDrafter.from_pretrained(tmp_path / "a")


def test_pairing_with_target(tmp_path):
    target = tiny_qwen3_target()
    cfg = tiny_config("vanilla", 6)
    w = random_checkpoint(tmp_path / "a", cfg, with_embeddings=False)
    d = DSparkDrafter.from_pretrained(tmp_path / "a", target=target)
    assert d.shares_embeddings == {"embed_tokens": True, "lm_head": True}
    assert d.embed_weight is target.get_input_embeddings().weight  # alias, no copy
    assert d.lm_head_weight is target.get_output_embeddings().weight
    assert "embed_tokens.weight" not in d.state_dict()
    # features from the target's own forward drive the context
    ids = torch.randint(0, 64, (1, 9))
    hs = target(ids, output_hidden_states=True).hidden_states
    feats = d.features_from_hidden_states(hs)[0]
    assert torch.equal(feats[:, :32], hs[1][0]) and torch.equal(feats[:, 64:], hs[5][0])
    d.append_context([0], [feats])
    out = d.draft([0], ids[0, -1:], 0.0)
    assert out.tokens.shape == (1, 4) and out.survival.shape == (1, 4)
    # saved with the (shared) embeddings -> DeepSpec layout with stored copies that match the target
    d.save_pretrained(tmp_path / "b")
    assert set(_stored(tmp_path / "b")) == set(w) | {"embed_tokens.weight", "lm_head.weight"}
    d2 = DSparkDrafter.from_pretrained(tmp_path / "b", target=target)  # copies equal: aliased again
    assert d2.shares_embeddings == {"embed_tokens": True, "lm_head": True}
    assert d2.embed_weight is target.get_input_embeddings().weight
    d3 = DSparkDrafter.from_pretrained(tmp_path / "b", target=target, share_target_embeddings=True)
    assert d3.embed_weight is target.get_input_embeddings().weight


def test_pairing_errors(tmp_path):
    cfg = tiny_config("vanilla", 6)
    random_checkpoint(tmp_path / "a", cfg)  # stored embeddings differ from any random target's
    with pytest.raises(ValueError, match="embed_tokens.weight"):
        DSparkDrafter.from_pretrained(tmp_path / "a", target=tiny_qwen3_target())
    with pytest.raises(ValueError, match="vocab_size"):
        DSparkDrafter.from_pretrained(tmp_path / "a", target=tiny_qwen3_target(vocab=80))
    with pytest.raises(ValueError, match="num_target_layers"):
        DSparkDrafter.from_pretrained(tmp_path / "a", target=tiny_qwen3_target(layers=8))
    with pytest.raises(ValueError, match="dtype"):
        DSparkDrafter.from_pretrained(
            tmp_path / "a", target=tiny_qwen3_target(), share_target_embeddings=True, dtype=torch.bfloat16
        )
    cfg2 = tiny_config("vanilla", 6, hidden=40)
    cfg2["head_dim"] = 10
    random_checkpoint(tmp_path / "h", cfg2, with_embeddings=False)
    with pytest.raises(ValueError, match="hidden_size"):
        DSparkDrafter.from_pretrained(tmp_path / "h", target=tiny_qwen3_target())
    random_checkpoint(tmp_path / "n", cfg, with_embeddings=False)
    with pytest.raises(ValueError, match="embed_tokens.weight"):
        DSparkDrafter.from_pretrained(tmp_path / "n")  # nothing to share


def test_from_config_llama_target_round_trip(tmp_path):
    target = tiny_llama_target()
    d = DSparkDrafter.from_config(target, block_size=5, num_layers=2, markov_rank=8, markov_head_type="rnn")
    assert d.config.target_layer_ids == [1] and d.config.num_target_layers == 4
    assert d.embed_weight is target.get_input_embeddings().weight
    d.save_pretrained(tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["markov_head_type"] == "rnn"
    d2 = DSparkDrafter.from_pretrained(tmp_path / "d", target=target)  # stored copies == the target's
    # equal stored copies are not kept: the reload aliases the target's tables like the original
    assert d2.embed_weight is target.get_input_embeddings().weight
    assert d2.lm_head_weight is target.get_output_embeddings().weight
    s2 = d2.state_dict()
    assert set(s2) == set(d.state_dict())
    for n, t in d.state_dict().items():
        assert torch.equal(t, s2[n]), n
    feats = torch.randn(6, 32)
    outs = []
    for m in (d, d2):
        m.append_context([3], [feats])
        outs.append(m.draft([3], torch.tensor([5]), 1.0, seed=4))
    assert torch.equal(outs[0].tokens, outs[1].tokens)
    # the backbone weights are equal values in different buffers, and a GEMM may round differently with
    # another buffer's alignment (AVX2 kernels): equal up to rounding, not bitwise
    torch.testing.assert_close(outs[1].survival, outs[0].survival, rtol=0, atol=1e-6)
    dfl = DSparkDrafter.from_config(target, markov_rank=0, share_embeddings=False)
    assert dfl.markov_head is None and dfl.confidence_head is None
    assert torch.equal(dfl.embed_tokens.weight, target.get_input_embeddings().weight)
    assert DrafterConfig.from_dict(dfl.config.to_dict()).markov_rank == 0


class _Tok:
    """A duck-typed tokenizer (len + get_vocab)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def get_vocab(self):
        return {f"t{i}": i for i in range(self.n)}


def test_tokenizer_checks(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    target = tiny_qwen3_target()
    cfg = tiny_config("vanilla", 6)
    random_checkpoint(tmp_path / "a", cfg, with_embeddings=False)
    with pytest.raises(ValueError, match="tokenizer"):
        DSparkDrafter.from_pretrained(tmp_path / "a", target=target, tokenizer=_Tok(65))
    DSparkDrafter.from_pretrained(tmp_path / "a", target=target, tokenizer=_Tok(60))
    # a checkpoint that ships a tokenizer must ship the target's
    vocab = {f"w{i}": i for i in range(60)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="w0"))).save_pretrained(
        tmp_path / "a"
    )
    other = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({**vocab, "w59": 58, "x": 59}, unk_token="w0"))
    )
    same = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="w0")))
    DSparkDrafter.from_pretrained(tmp_path / "a", target=target, tokenizer=same)
    with pytest.raises(ValueError, match="tokenizer"):
        DSparkDrafter.from_pretrained(tmp_path / "a", target=target, tokenizer=other)


def test_bf16_target_aliasing(tmp_path):
    target = tiny_qwen3_target(dtype=torch.bfloat16)
    random_checkpoint(tmp_path / "a", tiny_config("gated", 6), with_embeddings=False)
    d = DSparkDrafter.from_pretrained(tmp_path / "a", target=target)
    assert d.dtype == torch.bfloat16 and d.confidence_head.proj.weight.dtype == torch.float32
    d.append_context([0], [torch.randn(5, 96)])
    out = d.draft([0], torch.tensor([1]), 1.0, seed=3, return_base_logits=True)
    assert out.hidden.dtype == torch.bfloat16 and out.draft_logits.dtype == torch.float32
    assert out.conf.dtype == torch.float32 and bool(((out.conf > 0) & (out.conf < 1)).all())


def test_from_config_scaled_rope_target():
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = dict(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=128,
    )
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_parameters=rope,
    )
    d = DSparkDrafter.from_config(LlamaForCausalLM(cfg), markov_rank=4)
    assert d.config.rope_theta == 500000.0
    assert d.config.to_dict()["rope_parameters"] == {"rope_theta": 500000.0, "rope_type": "default"}
    with pytest.raises(ValueError, match="rope_type"):
        DrafterConfig.from_dict({**d.config.to_dict(), "rope_parameters": rope})


def test_bf16_drafter_for_fp32_target_keeps_one_cast_copy(tmp_path):
    from tests.decoding.toy_models import tiny_target

    target = tiny_target("llama", vocab=64, layers=4)
    target.lm_head.weight = target.model.embed_tokens.weight  # tied, like SmolLM2
    d32 = DSparkDrafter.from_config(target, block_size=4, num_layers=1, markov_rank=8)
    d32.save_pretrained(tmp_path / "d", include_embeddings=False)
    d = DSparkDrafter.from_pretrained(tmp_path / "d", target=target, dtype="bfloat16")
    assert d.dtype == torch.bfloat16 and d.shares_embeddings == {"embed_tokens": False, "lm_head": False}
    assert (
        d.lm_head_weight.dtype == torch.bfloat16 and d.lm_head_weight.data_ptr() == d.embed_weight.data_ptr()
    )
    assert torch.equal(d.lm_head_weight, target.lm_head.weight.to(torch.bfloat16))
    assert target.lm_head.weight.dtype == torch.float32  # the target is untouched
    with pytest.raises(ValueError, match="dtype"):  # an explicit alias still needs the same dtype
        DSparkDrafter.from_pretrained(
            tmp_path / "d", target=target, dtype="bfloat16", share_target_embeddings=True
        )


def test_saved_weights_get_the_usual_file_permissions(tmp_path):
    import stat

    from tests.decoding.toy_models import tiny_target

    d = DSparkDrafter.from_config(tiny_target("llama", vocab=64, layers=4), block_size=3, markov_rank=4)
    d.save_pretrained(tmp_path / "d", include_embeddings=False)
    mode = lambda name: stat.S_IMODE((tmp_path / "d" / name).stat().st_mode)  # noqa: E731
    assert mode("model.safetensors") == mode("config.json")  # both follow the umask (not owner-only)


def test_reload_with_equal_copies_does_not_duplicate_memory(tmp_path):
    target = tiny_llama_target()  # tied: lm_head is the embedding
    d = DSparkDrafter.from_config(target, block_size=4, num_layers=1, markov_rank=8)
    d.save_pretrained(tmp_path / "d")  # stored copies of the (tied) target tables
    t_ptr = target.get_input_embeddings().weight.data_ptr()
    d2 = DSparkDrafter.from_pretrained(tmp_path / "d", target=target)
    assert d2.embed_weight.data_ptr() == t_ptr and d2.lm_head_weight.data_ptr() == t_ptr
    own = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert own(d2) == own(d)  # nothing vocabulary-sized of its own
    # a drafter dtype other than the target's: one cast copy for both tied tables, not two stored ones
    d16 = DSparkDrafter.from_pretrained(tmp_path / "d", target=target, dtype="bfloat16")
    assert d16.shares_embeddings == {"embed_tokens": False, "lm_head": False}
    assert d16.embed_weight.data_ptr() == d16.lm_head_weight.data_ptr() != t_ptr
    assert torch.equal(d16.embed_weight, target.get_input_embeddings().weight.to(torch.bfloat16))


def test_stored_copy_that_differs_is_an_error_or_the_drafters_own(tmp_path):
    target = tiny_llama_target()
    d = DSparkDrafter.from_config(target, block_size=4, num_layers=1, markov_rank=8, share_embeddings=False)
    with torch.no_grad():
        d.embed_tokens.weight[3] += 0.5  # e.g. an embedding trained with the drafter
    d.save_pretrained(tmp_path / "d", include_embeddings=True)
    with pytest.raises(ValueError, match=r"embed_tokens\.weight.*differs from the target's"):
        DSparkDrafter.from_pretrained(tmp_path / "d", target=target)  # default: guards the target revision
    d2 = DSparkDrafter.from_pretrained(tmp_path / "d", target=target, share_target_embeddings=False)
    assert d2.shares_embeddings == {"embed_tokens": False, "lm_head": False}
    t_embed, t_head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    assert torch.equal(d2.embed_weight, d.embed_tokens.weight) and not torch.equal(d2.embed_weight, t_embed)
    assert torch.equal(d2.lm_head_weight, t_head) and d2.lm_head_weight.data_ptr() != t_head.data_ptr()
    d3 = DSparkDrafter.from_pretrained(tmp_path / "d", target=target, share_target_embeddings=True)
    assert d3.embed_weight is t_embed  # the target's, whatever was stored


def test_stored_copy_equal_only_at_a_coarser_dtype_is_kept(tmp_path):
    target = tiny_qwen3_target()  # fp32
    cfg = tiny_config("vanilla", 6)
    w = random_checkpoint(tmp_path / "a", cfg, with_embeddings=False)
    w["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().to(torch.bfloat16)
    write_checkpoint(tmp_path / "b", cfg, w)
    d = DSparkDrafter.from_pretrained(tmp_path / "b", target=target)  # equal in bf16, not at fp32
    assert d.shares_embeddings == {"embed_tokens": False, "lm_head": True}
    assert torch.equal(d.embed_weight, w["embed_tokens.weight"].float())


def test_repr_says_what_is_shared_with_the_target(tmp_path):
    target = tiny_qwen3_target()
    random_checkpoint(tmp_path / "a", tiny_config("vanilla", 6), with_embeddings=False)
    shared = DSparkDrafter.from_pretrained(tmp_path / "a", target=target)
    assert "(shared with the target): embed_tokens, lm_head" in repr(shared)
    assert "(embed_tokens): Embedding" not in repr(shared)
    own = DSparkDrafter.from_config(target, markov_rank=4, share_embeddings=False)
    assert "shared with the target" not in repr(own)
    assert "(embed_tokens): Embedding(64, 32)" in repr(own) and "(lm_head): Linear" in repr(own)
    head_only = DSparkDrafter.from_config(target, markov_rank=4, share_embeddings=False)
    head_only.share_target_embeddings(target, embed=False)
    assert "(shared with the target): lm_head\n" in repr(head_only)
