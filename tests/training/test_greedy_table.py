# SPDX-License-Identifier: Apache-2.0
"""The copy head's greedy table fitted by counting (``dspark.training.greedy_table``): the fit equals a
brute force that replays the slots in order (with a negative control that ignores which anchors are still
accepted), the margins agree with what serving drafts, and ``dspark train greedy-table`` writes a drafter
that loads with its table and keeps its draft vocabulary file."""

from __future__ import annotations

import json
import random

import pytest
import torch

from dspark.models.drafter import DSparkDrafter
from dspark.training.features import FeatureCache
from dspark.training.greedy_table import GRID, CopyMargins, copy_margins, fit_greedy_table
from tests.training.test_copy_channel import _drafter, _repetitive, frozen_target


def _synthetic(n: int, g: int, classes: int, seed: int) -> CopyMargins:
    rng = random.Random(seed)
    cls = torch.tensor([rng.randrange(classes) for _ in range(n)])
    margin = torch.tensor(
        [[rng.choice([float("-inf"), rng.uniform(-6, 6)]) for _ in range(g)] for _ in range(n)]
    )
    copy_right = torch.tensor([[rng.random() < 0.6 for _ in range(g)] for _ in range(n)]) & margin.isfinite()
    other_right = torch.tensor([[rng.random() < 0.4 for _ in range(g)] for _ in range(n)]) & ~copy_right
    counted = torch.tensor([[j < rng.randrange(1, g + 1) for j in range(g)] for _ in range(n)])
    return CopyMargins(cls, margin, copy_right, other_right, counted)


def _hit(m: CopyMargins, i: int, j: int, beta: float) -> bool:
    takes = m.margin[i, j].item() + beta > 0
    return bool(m.copy_right[i, j] if takes else m.other_right[i, j])


def _brute(m: CopyMargins, classes: int, min_count: int, replay: bool = True) -> torch.Tensor:
    """Cell by cell over the grid, written out; ``replay=False`` (the negative control) fits every counted
    anchor as if all earlier slots had been accepted."""
    n, g = m.margin.shape
    table = torch.zeros(g, classes)
    alive = [bool(m.counted[i, 0]) for i in range(n)]
    betas = sorted(GRID.tolist(), key=abs)
    for j in range(g):
        pool = alive if replay else [bool(m.counted[i, j]) for i in range(n)]
        for c in range(classes):
            cell = [i for i in range(n) if pool[i] and int(m.cls[i]) == c and m.margin[i, j].isfinite()]
            if len(cell) >= min_count:
                scores = [sum(_hit(m, i, j, b) for i in cell) for b in betas]
                table[j, c] = betas[scores.index(max(scores))]
        for i in range(n):
            ok = (
                _hit(m, i, j, float(table[j, int(m.cls[i])]))
                if m.margin[i, j].isfinite()
                else _hit(m, i, j, 0)
            )
            alive[i] = alive[i] and ok and (j + 1 < g and bool(m.counted[i, j + 1]))
    return table


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_equals_the_brute_force(seed):
    m = _synthetic(300, 4, 3, seed)
    fit = fit_greedy_table(m, 3, min_count=10)
    want = _brute(m, 3, 10)
    torch.testing.assert_close(fit.table, want)
    assert (fit.hits_after >= fit.hits_before).all() and fit.hits_after.sum() > fit.hits_before.sum()
    # negative control: fitting later slots on anchors already rejected gives another table
    assert not torch.equal(fit.table, _brute(m, 3, 10, replay=False))
    # a cell below min_count keeps 0
    assert (fit_greedy_table(m, 3, min_count=10_000).table == 0).all()


@pytest.fixture(scope="module", name="target")
def _target():
    return frozen_target()


def _cache(target, d, tmp_path) -> FeatureCache:
    """The target's own greedy answers to repetitive prompts (its argmax is each next token)."""
    rows = []
    for k in range(3):
        prompt = _repetitive(12, seed=k)
        out = target.generate(prompt[None], max_new_tokens=30, do_sample=False, eos_token_id=None)
        ids = out[0].tolist()
        rows.append({"id": f"r:{k}", "prompt_ids": ids[:12], "response_ids": ids[12:], "finish": "length"})
    return FeatureCache.build(target, rows, d.config.target_layer_ids, tmp_path / "feats", progress=False)


def test_margins_agree_with_served_greedy_drafts(target, tmp_path):
    """At the first slot, serving with greedy offset β drafts the copy exactly when ``margin + β > 0``."""
    d = _drafter(target, copy_head=True, copy_extent_bounds=[5], copy_greedy_bias=True)
    with torch.no_grad():
        d.copy_head.logit_bias.normal_(generator=torch.Generator().manual_seed(0))
    cache = _cache(target, d, tmp_path)
    m = copy_margins(d, cache, [0])
    s = cache[0]
    ids, mask = s.input_ids, s.loss_mask.bool()
    anchors = torch.nonzero(mask[:-1] & mask[1:]).view(-1)
    from dspark.training.objective import packed_copy_inputs

    tok, cls = packed_copy_inputs(d.config, [ids], [anchors], d.device)
    assert m.margin.shape == (anchors.numel(), d.config.block_size) and torch.equal(m.cls, cls)
    checked = 0
    for beta in (-2.0, 0.0, 3.0):
        with torch.no_grad():
            d.copy_head.greedy_bias.fill_(beta)
        for r, a in enumerate(anchors.tolist()):
            if not m.margin[r, 0].isfinite() or abs(float(m.margin[r, 0]) + beta) < 1e-3:
                continue
            d.finish_all()
            d.append_context([9], [s.features[:a].float()])
            cont = [t for t in tok[r].tolist() if t >= 0]
            out = d.draft([9], ids[a : a + 1], 0.0, copy_continuations=[cont], copy_matches=[int(cls[r])])
            assert (int(out.tokens[0, 0]) == cont[0]) == (float(m.margin[r, 0]) + beta > 0), (r, beta)
            checked += 1
    d.finish_all()
    assert checked >= 20
    with pytest.raises(ValueError, match="no response anchors"):
        copy_margins(d, cache, [])


def test_greedy_table_cli(target, tmp_path, monkeypatch):
    import dspark.cli as cli
    import dspark.models.loading as loading

    d = _drafter(target, copy_head=True, copy_extent_bounds=[5])
    with torch.no_grad():
        d.copy_head.logit_bias.normal_(generator=torch.Generator().manual_seed(1))
    d.set_draft_vocab(list(range(0, 96, 2)) + [1, 3])
    cache = _cache(target, d, tmp_path)
    src = tmp_path / "src"
    d.save_pretrained(src, include_embeddings=False)
    vocab = json.loads((src / "draft_vocab.json").read_text())
    (src / "draft_vocab.json").write_text(json.dumps({**vocab, "coverage": 0.5}))  # a field to keep
    monkeypatch.setattr(loading, "load_target", lambda spec: (target, None))
    argv = ["train", "greedy-table", "--drafter", str(src), "--features", str(tmp_path / "feats")]
    argv += ["--out", str(tmp_path / "out"), "--min-count", "1"]
    assert cli.main(argv) == 0
    back = DSparkDrafter.from_pretrained(tmp_path / "out", target=target)
    want = fit_greedy_table(copy_margins(d, cache, [0, 1, 2]), d.config.num_copy_classes, min_count=1).table
    assert back.config.copy_greedy_bias and want.abs().sum() > 0
    assert torch.equal(back.copy_head.greedy_bias.detach(), want)
    assert json.loads((tmp_path / "out" / "draft_vocab.json").read_text())["coverage"] == 0.5
    for k, v in d.state_dict().items():  # everything else as it was
        torch.testing.assert_close(back.state_dict()[k], v, msg=k)
    with pytest.raises(SystemExit, match="--out: .* exists"):
        cli.main(argv)
    plain = tmp_path / "plain"
    _drafter(target).save_pretrained(plain, include_embeddings=False)
    argv[argv.index(str(src))] = str(plain)
    argv[argv.index(str(tmp_path / "out"))] = str(tmp_path / "out2")
    with pytest.raises(SystemExit, match="has no copy head"):
        cli.main(argv)
