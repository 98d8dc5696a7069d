# SPDX-License-Identifier: Apache-2.0
"""Feature cache, training loop (learning, resume = unbroken run), and two-process gloo training."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import torch
import torch.multiprocessing as mp

from dspark.models.drafter import DSparkDrafter
from dspark.training.features import FeatureCache, target_features
from dspark.training.trainer import TrainConfig, latest_checkpoint, parameter_groups, train
from tests.decoding.toy_models import random_drafter, tiny_target


def _rows(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        p = torch.randint(0, 90, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g).tolist()
        # a repetitive response, so that the drafter has something learnable
        base = torch.randint(0, 90, (3,), generator=g).tolist()
        r = (base * 8)[: int(torch.randint(12, 24, (1,), generator=g))]
        rows.append({"id": f"t:{i}", "prompt_ids": p, "response_ids": r, "finish": "length"})
    return rows


def _setup(tmp_path, rank=8):
    t = tiny_target("llama", vocab=96, layers=4)
    for p in t.parameters():
        p.requires_grad_(False)
    d = random_drafter(t, block_size=4, markov_rank=rank)
    cache = FeatureCache.build(
        t, _rows(12), d.config.target_layer_ids, tmp_path / "feats", shard_size=5, progress=False
    )
    return t, d, cache


def test_feature_cache_round_trip_and_resume(tmp_path):
    t, d, cache = _setup(tmp_path)
    assert len(cache) == 12 and len(cache.index["shards"]) == 3
    rows = _rows(12)
    s = cache[7]
    ids = rows[7]["prompt_ids"] + rows[7]["response_ids"]
    assert s.input_ids.tolist() == ids
    assert s.loss_mask.tolist() == [False] * len(rows[7]["prompt_ids"]) + [True] * len(
        rows[7]["response_ids"]
    )
    for i, (tok, mask) in zip([7, 2, 8], cache.tokens([7, 2, 8]), strict=True):  # tokens only, same rows
        assert torch.equal(tok, cache[i].input_ids) and torch.equal(mask, cache[i].loss_mask)
    f, last = target_features(t, ids, d.config.target_layer_ids)
    torch.testing.assert_close(s.features.float(), f, atol=0.05, rtol=0.02)  # bf16 storage
    torch.testing.assert_close(s.last_hidden.float(), last, atol=0.05, rtol=0.02)
    # p_lse: the fp32 log-normaliser of the stored hidden's logits at response rows, NaN at prompt rows
    n_prompt = len(rows[7]["prompt_ids"])
    ref_lse = torch.logsumexp(s.last_hidden.float() @ t.lm_head.weight.float().T, -1)
    assert s.p_lse.dtype == torch.float32 and s.p_lse[:n_prompt].isnan().all()
    torch.testing.assert_close(s.p_lse[n_prompt:], ref_lse[n_prompt:])
    # building again with more rows only adds the new ones
    more = _rows(15)
    cache2 = FeatureCache.build(
        t, more, d.config.target_layer_ids, tmp_path / "feats", shard_size=5, progress=False
    )
    assert len(cache2) == 15 and len(cache2.index["shards"]) == 4
    with pytest.raises(ValueError, match="layers"):
        FeatureCache.build(t, more, [0], tmp_path / "feats", progress=False)


def test_training_lowers_loss_and_resume_matches_unbroken_run(tmp_path):
    t, d, cache = _setup(tmp_path)
    init = {k: v.clone() for k, v in d.state_dict().items()}
    cfg = TrainConfig(steps=12, batch_seqs=2, num_anchors=8, lr=3e-3, log_every=3, save_every=6)
    logs = train(d, cache, cfg, tmp_path / "run_a", progress=False)
    assert logs[-1]["loss"] < logs[0]["loss"]
    assert logs[-1]["tau_estimate"] > logs[0]["tau_estimate"]
    final_a = {k: v.clone() for k, v in d.state_dict().items()}
    # a run stopped at step 6 then resumed gives the same weights as the unbroken run
    d.load_state_dict(init)
    train(d, cache, cfg, tmp_path / "run_b", progress=False)
    shutil.rmtree(tmp_path / "run_b" / "checkpoint-12")  # as if it had stopped after step 6
    assert latest_checkpoint(tmp_path / "run_b").name == "checkpoint-6"
    d.load_state_dict(init)  # resume must restore the weights itself
    train(d, cache, cfg, tmp_path / "run_b", progress=False)
    for k, v in d.state_dict().items():
        torch.testing.assert_close(v, final_a[k], msg=k)
    # the checkpoint loads as a drafter that shares the target's embedding / LM head
    ck = latest_checkpoint(tmp_path / "run_b")
    loaded = DSparkDrafter.from_pretrained(ck, target=t)
    for k, v in loaded.state_dict().items():
        torch.testing.assert_close(v, final_a[k], msg=k)
    lines = [json.loads(x) for x in (tmp_path / "run_a" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [3, 6, 9, 12] and len(lines[0]["accept"]) == 4


def test_training_over_a_draft_vocabulary_saves_it_with_the_drafter(tmp_path):
    t, d, cache = _setup(tmp_path)
    dv = list(range(0, 96, 2))  # the repetitive responses use odd ids too: CE skips those labels
    cfg = TrainConfig(
        steps=4, batch_seqs=2, num_anchors=8, lr=3e-3, log_every=2, save_every=4, draft_vocab=dv
    )
    logs = train(d, cache, cfg, tmp_path / "run", progress=False)
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["ce"]) for r in logs)
    loaded = DSparkDrafter.from_pretrained(tmp_path / "run" / "checkpoint-4", target=t)
    assert loaded.draft_vocab.tolist() == dv
    s = cache[0]
    loaded.append_context([0], [s.features[:5].float()])
    drafted = loaded.draft([0], s.input_ids[5:6], temperature=1.0).tokens
    assert set(drafted.view(-1).tolist()) <= set(dv)
    loaded.finish_all()
    with pytest.raises(ValueError, match="token_ids"):
        train(d, cache, TrainConfig(steps=1, draft_vocab=[5, 500]), tmp_path / "bad", progress=False)


def test_markov_weight_decay_shrinks_the_markov_tables_only(tmp_path):
    t, d, cache = _setup(tmp_path)
    tables = {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight"}
    names = {id(p): k for k, p in d.named_parameters()}
    groups = parameter_groups(d, TrainConfig(weight_decay=0.01, markov_weight_decay=0.3))
    assert [g["weight_decay"] for g in groups] == [0.01, 0.3]
    assert {names[id(p)] for p in groups[1]["params"]} == tables
    assert {names[id(p)] for g in groups for p in g["params"]} == set(names.values())
    assert len(parameter_groups(d, TrainConfig(weight_decay=0.01))) == 1
    # one step from the same weights on the same batch: the gradients are equal, so AdamW's decoupled decay is
    # the whole difference: p * (1 - lr * wd) on the tables, nothing elsewhere
    init = {k: v.clone() for k, v in d.state_dict().items()}
    after = {}
    for wd in (0.0, 40.0):
        d.load_state_dict(init)
        cfg = TrainConfig(
            steps=1, batch_seqs=2, num_anchors=8, lr=5e-3, warmup_ratio=0.0, markov_weight_decay=wd
        )
        lr = train(d, cache, cfg, tmp_path / f"wd{wd}", progress=False)[-1]["lr"]
        after[wd] = {k: v.clone() for k, v in d.state_dict().items()}
    assert lr == 5e-3
    for k, v in after[40.0].items():
        if k in tables:
            torch.testing.assert_close(v, after[0.0][k] - lr * 40.0 * init[k], msg=k)
            assert not torch.allclose(v, after[0.0][k])
        else:
            torch.testing.assert_close(v, after[0.0][k], msg=k)
    with pytest.raises(ValueError, match="markov_weight_decay: expected >= 0"):
        parameter_groups(d, TrainConfig(markov_weight_decay=-1.0))
    with pytest.raises(ValueError, match="weight_decay: expected >= 0"):
        train(d, cache, TrainConfig(steps=1, weight_decay=-0.1), tmp_path / "bad", progress=False)
    dflash = random_drafter(t, block_size=4, markov_rank=0)
    with pytest.raises(ValueError, match="markov_weight_decay: the drafter has no Markov head"):
        parameter_groups(dflash, TrainConfig(markov_weight_decay=0.1))


def _ddp_worker(rank: int, world: int, tmp: str, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        t = tiny_target("llama", vocab=96, layers=4)
        for p in t.parameters():
            p.requires_grad_(False)
        d = random_drafter(t, block_size=4, markov_rank=8)
        cache = FeatureCache(os.path.join(tmp, "feats"))
        cfg = TrainConfig(steps=4, batch_seqs=2, num_anchors=8, lr=3e-3, log_every=2, save_every=100)
        train(d, cache, cfg, os.path.join(tmp, "ddp"), progress=False)
        torch.save(d.state_dict(), os.path.join(tmp, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_process_gloo_equals_single_process(tmp_path):
    t, d, cache = _setup(tmp_path)
    cfg = TrainConfig(steps=4, batch_seqs=2, num_anchors=8, lr=3e-3, log_every=2, save_every=100)
    train(d, cache, cfg, tmp_path / "single", progress=False)
    single = d.state_dict()
    ctx = mp.get_context("spawn")
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=_ddp_worker, args=(r, 2, str(tmp_path), port)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for k, v in single.items():
        torch.testing.assert_close(got[0][k], got[1][k], msg=k)  # ranks agree
        torch.testing.assert_close(got[0][k], v, atol=1e-5, rtol=1e-4, msg=k)  # = one process, same batches


def test_fit_cli_warm_start_bf16_and_summary(tmp_path, monkeypatch):
    import dspark.cli as cli
    import dspark.models.loading as loading

    t, d, cache = _setup(tmp_path)
    monkeypatch.setattr(loading, "load_target", lambda spec: (t, None))
    out = tmp_path / "cli_run"
    argv = ["train", "fit", "--features", str(tmp_path / "feats"), "--out", str(out), "--num-layers", "1"]
    argv += [
        "--block-size",
        "4",
        "--markov-rank",
        "8",
        "--steps",
        "3",
        "--batch-seqs",
        "2",
        "--num-anchors",
        "8",
    ]
    argv += ["--init", "norm", "--feature-scaling", "--bf16", "--no-compile-loss", "--log-every", "1"]
    argv += ["--ce-weight", "0.5", "--kl-weight", "0.25", "--markov-init", "bigram"]
    argv += ["--weight-decay", "0.01", "--markov-weight-decay", "0.2"]
    assert cli.main(argv) == 0
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["config"]["init"] == "norm" and summary["config"]["ce_weight"] == "0.5"
    assert summary["config"]["weight_decay"] == "0.01" and summary["config"]["markov_weight_decay"] == "0.2"
    assert summary["config"]["kl_weight"] == "0.25" and summary["config"]["markov_init"] == "bigram"
    lines = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in lines)
    assert all(math.isfinite(r["kl"]) and r["kl"] >= 0 for r in lines)
    loaded = DSparkDrafter.from_pretrained(out / "final", target=t)
    assert loaded.config.target_layer_ids == cache.layer_ids and loaded.markov_head is not None
    rank0 = [a if a != "8" else "0" for a in argv]  # --markov-rank 0: no Markov head to start as a bigram
    with pytest.raises(SystemExit, match="bigram"):
        cli.main(rank0)


def test_fit_cli_init_from_a_trained_drafter(tmp_path, monkeypatch):
    import dspark.cli as cli
    import dspark.models.loading as loading

    t, d, cache = _setup(tmp_path)
    monkeypatch.setattr(loading, "load_target", lambda spec: (t, None))
    src = tmp_path / "src"
    d.save_pretrained(src, include_embeddings=False)
    out = tmp_path / "warm"

    def argv(rank: int, *extra: str) -> list[str]:
        return [
            *("train", "fit", "--features", str(tmp_path / "feats"), "--out", str(out)),
            *("--num-layers", str(len(d.layers)), "--block-size", "4", "--markov-rank", str(rank)),
            *("--steps", "1", "--batch-seqs", "2", "--num-anchors", "8", "--no-compile-loss", "--lr", "0"),
            *("--init-from", str(src), *extra),
        ]

    # lr 0: one step leaves the weights where --init-from put them, the source drafter's
    assert cli.main(argv(8)) == 0
    loaded = DSparkDrafter.from_pretrained(out / "final", target=t).state_dict()
    for k, v in d.state_dict().items():
        torch.testing.assert_close(loaded[k], v, msg=k)
    shutil.rmtree(out)
    with pytest.raises(ValueError, match=r"--init-from: .*tensor 'markov_head.* has shape"):
        cli.main(argv(4))
    with pytest.raises(ValueError, match=r"--init-from: .*unexpected tensor '(markov|confidence)_head"):
        cli.main(argv(0))
    with pytest.raises(SystemExit, match="--init-from"):
        cli.main(argv(8, "--init", "norm"))


def test_fit_cli_carries_a_greedy_table_from_init_from(tmp_path, monkeypatch):
    """``--copy-greedy-bias`` keeps the source's greedy table through training (no loss term reads it); without
    the flag the table is an unexpected tensor, and the flag without a copy head is refused."""
    import dspark.cli as cli
    import dspark.models.loading as loading

    t, _, cache = _setup(tmp_path)
    monkeypatch.setattr(loading, "load_target", lambda spec: (t, None))
    torch.manual_seed(3)
    src_drafter = DSparkDrafter.from_config(
        t,
        block_size=4,
        num_layers=1,
        target_layer_ids=cache.layer_ids,
        markov_rank=8,
        copy_head=True,
        copy_greedy_bias=True,
    )
    with torch.no_grad():
        src_drafter.copy_head.greedy_bias.uniform_(1.0, 9.0)
    src = tmp_path / "src"
    src_drafter.save_pretrained(src, include_embeddings=False)
    out = tmp_path / "warm"

    def argv(*extra: str) -> list[str]:
        return [
            *("train", "fit", "--features", str(tmp_path / "feats"), "--out", str(out)),
            *("--num-layers", "1", "--block-size", "4", "--markov-rank", "8", "--copy-head"),
            *("--steps", "2", "--batch-seqs", "2", "--num-anchors", "8", "--no-compile-loss", "--lr", "1e-2"),
            *("--init-from", str(src), *extra),
        ]

    assert cli.main(argv("--copy-greedy-bias")) == 0
    trained = DSparkDrafter.from_pretrained(out / "final", target=t)
    assert trained.config.copy_greedy_bias
    torch.testing.assert_close(trained.copy_head.greedy_bias, src_drafter.copy_head.greedy_bias)
    moved = trained.copy_head.logit_bias.detach() - src_drafter.copy_head.logit_bias.detach()
    assert moved.abs().max() > 0  # the rest of the copy head did train (lr 1e-2, two steps)
    shutil.rmtree(out)
    with pytest.raises(ValueError, match=r"unexpected tensor 'copy_head.greedy_bias'"):
        cli.main(argv())
    no_head = [a for a in argv("--copy-greedy-bias") if a != "--copy-head"]
    with pytest.raises(SystemExit, match="--copy-greedy-bias: .*--copy-head"):
        cli.main(no_head)
