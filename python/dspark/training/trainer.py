# SPDX-License-Identifier: Apache-2.0
"""The drafter training loop: AdamW, warm-up + cosine, clipping, checkpoints, resume, logs, multi-process.

One optimiser step consumes ``batch_seqs`` sequences (gradient accumulation; across ``world_size`` processes the
sequences are split by rank and gradients all-reduced, the DDP mean). Every ``log_every`` steps a JSON line goes
to ``<out>/train_log.jsonl`` with the loss terms, the learning rate, DeepSpec's per-position acceptance
``1 - L1/2`` and the τ estimate ``1 + Σ cumprod(accept)``. Checkpoints are drafter folders (DeepSpec layout,
embedding / LM head not stored when shared with the target) plus ``trainer_state.pt`` for resuming.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from dspark.models.config import DrafterConfig
from dspark.models.drafter import DSparkDrafter
from dspark.training.features import FeatureCache
from dspark.training.objective import (
    LossWeights,
    cosine_lr,
    packed_block_loss,
    sample_anchors,
    tau_estimate,
)


@dataclass
class TrainConfig:
    """Hyper-parameters of :func:`train` (DeepSpec's recipe where it applies; sizes scaled for small targets)."""

    steps: int = 1000
    batch_seqs: int = 4
    num_anchors: int = 64
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    weight_decay: float = 0.0
    # AdamW decay of the Markov head's per-id tables W1 / W2 alone (None: ``weight_decay``); see
    # docs/training.md, "Regularising the Markov head"
    markov_weight_decay: float | None = None
    grad_clip: float = 1.0
    bf16: bool = False
    compile_loss: bool = False  # torch.compile the vocabulary-sized loss terms (needs a C++ compiler on CPU)
    seed: int = 42
    log_every: int = 10
    save_every: int = 200
    weights: LossWeights = field(default_factory=LossWeights)
    # token ids the drafter will draft from (its draft vocabulary): q is trained over these only and the
    # checkpoints carry them as draft_vocab.json; None trains over the whole vocabulary
    draft_vocab: list[int] | None = None
    # one packed forward over each step's sequences (flattened anchors; the same gradient as one pass per
    # sequence, tested): fewer, larger kernels, which is what a GPU needs
    packed: bool = True
    # train only the parameters under these top-level modules (e.g. ["copy_head", "confidence_head"]); None: all
    train_only: list[str] | None = None


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextlib.contextmanager
def training_only(drafter: DSparkDrafter, modules: list[str] | None):
    """Within the block, only the parameters under the top-level ``modules`` of ``drafter`` train (the others'
    ``requires_grad`` is off, then restored); None: no change. An unknown name is an error before anything runs.
    """
    if modules is None:
        yield
        return
    known = sorted({n.split(".")[0] for n, _ in drafter.named_parameters()})
    unknown = [m for m in modules if m not in known]
    if unknown or not modules:
        raise ValueError(
            f"train_only: {unknown or modules} are not modules of this drafter; expected some of {known}"
        )
    saved = {n: p.requires_grad for n, p in drafter.named_parameters()}
    try:
        for n, p in drafter.named_parameters():
            p.requires_grad_(saved[n] and n.split(".")[0] in modules)
        yield
    finally:
        for n, p in drafter.named_parameters():
            p.requires_grad_(saved[n])


def trainable_parameters(drafter: DSparkDrafter) -> list[torch.nn.Parameter]:
    """The drafter's own parameters (aliased target embedding / LM head are not registered, hence excluded)."""
    return [p for p in drafter.parameters() if p.requires_grad]


def parameter_groups(drafter: DSparkDrafter, cfg: TrainConfig) -> list[dict]:
    """AdamW parameter groups: one group, or (with ``cfg.markov_weight_decay``) the rest and the Markov tables.

    The Markov head's ``W1`` / ``W2`` hold a row per vocabulary id, most of them seen a few times per pass over
    a small training set; a decay of their own shrinks the rows that few gradients reach without decaying the
    transformer.
    """
    if cfg.weight_decay < 0:
        raise ValueError(f"weight_decay: expected >= 0, got {cfg.weight_decay}")
    params = trainable_parameters(drafter)
    if cfg.markov_weight_decay is None:
        return [{"params": params, "weight_decay": cfg.weight_decay}]
    if cfg.markov_weight_decay < 0:
        raise ValueError(f"markov_weight_decay: expected >= 0, got {cfg.markov_weight_decay}")
    head = drafter.markov_head
    if head is None:
        raise ValueError("markov_weight_decay: the drafter has no Markov head (markov_rank 0)")
    tables = {id(head.markov_w1.weight), id(head.markov_w2.weight)}
    return [
        {"params": [p for p in params if id(p) not in tables], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if id(p) in tables], "weight_decay": cfg.markov_weight_decay},
    ]


def save_checkpoint(drafter: DSparkDrafter, opt, step: int, cfg: TrainConfig, path: Path) -> None:
    """Drafter folder + optimiser state, written to a temporary folder then renamed (never half-written)."""
    tmp = path.with_name(path.name + ".tmp")
    drafter.save_pretrained(tmp, include_embeddings=False)
    torch.save({"step": step, "optimizer": opt.state_dict(), "config": asdict(cfg)}, tmp / "trainer_state.pt")
    if path.exists():
        import shutil

        shutil.rmtree(path)
    tmp.replace(path)


def latest_checkpoint(out_dir: Path) -> Path | None:
    """``out_dir/checkpoint-<step>`` with the highest step, or None."""
    best, best_step = None, -1
    for p in out_dir.glob("checkpoint-*"):
        if p.suffix == ".tmp" or not (p / "trainer_state.pt").is_file():
            continue
        try:
            s = int(p.name.split("-")[1])
        except ValueError:
            continue
        if s > best_step:
            best, best_step = p, s
    return best


def load_drafter_weights(
    drafter: DSparkDrafter,
    path: str | os.PathLike,
    what: str = "resume",
    *,
    allow_missing_inputs: bool = False,
    copy_identity: bool = False,
) -> None:
    """Load the weights of the drafter folder ``path`` (a ``final`` or ``checkpoint-*`` folder) into ``drafter``.

    The tensors must fit ``drafter``'s own layout (:func:`~dspark.models.checkpoint.check_tensors`): a folder of
    another architecture (depth, Markov rank, confidence head, tapped layers) raises ``ValueError`` naming
    ``what`` and the first missing, unexpected or mis-shaped tensor. The aliased target embedding / LM head are
    not part of a drafter folder and stay as they are.

    ``allow_missing_inputs``: ``path`` may lack the v2 input tensors ``drafter`` has (``copy_proj``,
    ``copy_embed``, ``context_proj``, ``mask_embed``, the copy head's; a DeepSpec drafter warm-starting a v2 one). They start
    neutral (``block_inputs.init_input_modules`` with ``copy_proj`` at zero), so the drafter drafts what the
    folder's did until training opens them; ``copy_identity`` starts ``copy_proj`` at the identity instead (a
    copy prior: each slot's input then holds its copied token's embedding, which a tied LM head reads as that
    token's logit). ``tap_norm`` changes what ``fc`` reads and cannot start neutral: it is never allowed to be
    missing. With it, a folder keyed by match length alone warm-starts a drafter with ``copy_extent_bounds``:
    each extent class starts as the ``copy_max_match`` class it splits (:func:`widen_copy_classes`).
    """
    from dspark.models.block_inputs import init_input_modules
    from dspark.models.checkpoint import check_tensors, read_tensors

    tensors = read_tensors(path)
    own = drafter.state_dict()
    missing = [k for k in own if k not in tensors]
    neutral = (
        "copy_proj.weight",
        "copy_embed.weight",
        "context_proj.weight",
        "mask_embed",
        "copy_head.logit_bias",
        "copy_head.logit_gate",
        "copy_head.conf_bias",
        "copy_head.greedy_bias",
    )
    if allow_missing_inputs and missing and all(k in neutral for k in missing):
        init_input_modules(drafter, drafter.embed_weight.detach(), copy_identity=copy_identity)
        tensors = {**tensors, **{k: own[k] for k in missing}}
    if allow_missing_inputs:
        tensors = widen_copy_classes(tensors, drafter.config)
    check_tensors(drafter.config, tensors, where=f"{what}: {path}")
    drafter.load_state_dict({k: tensors[k].to(own[k].dtype) for k in own}, strict=True)


# the tensors indexed by copy class, and the dimension it runs along
COPY_CLASS_DIMS = {
    "copy_embed.weight": 0,
    "copy_head.logit_bias": -1,
    "copy_head.conf_bias": -1,
    "copy_head.greedy_bias": -1,
}


def widen_copy_classes(tensors: dict[str, Tensor], config: DrafterConfig) -> dict[str, Tensor]:
    """``tensors`` with each copy-class tensor of a drafter keyed by match length alone (``copy_max_match + 1``
    classes) widened to ``config``'s ``num_copy_classes``: an extent class starts as a copy of the
    ``copy_max_match`` class it splits, so the drafter drafts as before until trained. Others are returned
    as they are (``check_tensors`` judges them)."""
    plain, wanted = config.copy_max_match + 1, config.num_copy_classes
    if wanted == plain:
        return tensors
    source = torch.tensor([*range(plain), *[plain - 1] * (wanted - plain)])
    out = dict(tensors)
    for name, dim in COPY_CLASS_DIMS.items():
        t = tensors.get(name)
        if t is not None and t.shape[dim] == plain:
            out[name] = t.index_select(dim % t.dim(), source)
    return out


def train(
    drafter: DSparkDrafter,
    cache: FeatureCache,
    cfg: TrainConfig,
    out_dir: str | os.PathLike,
    *,
    indices: list[int] | None = None,
    resume: bool = True,
    progress: bool = True,
) -> list[dict]:
    """Train ``drafter`` on the sequences ``indices`` of ``cache`` (all by default); returns the log rows.

    The target's embedding / LM head stay frozen (aliased, not trained), and with ``cfg.train_only`` all but
    those modules (:func:`training_only`). Resumes from the newest ``checkpoint-*`` in ``out_dir`` when
    ``resume``. Deterministic for a given seed, world size and data.
    """
    if not drafter.config.sample_from_anchor:  # the objective's labels assume the anchor's slot drafts x_1
        raise ValueError(
            "drafter: sample_from_anchor=false (DFlash's block layout, e.g. a z-lab or SpecForge checkpoint) "
            "cannot be trained by dspark train; convert a DeepSpec-layout drafter or start from scratch"
        )
    with training_only(drafter, cfg.train_only):
        return _train(drafter, cache, cfg, out_dir, indices, resume, progress)


def _train(
    drafter: DSparkDrafter,
    cache: FeatureCache,
    cfg: TrainConfig,
    out_dir: str | os.PathLike,
    indices: list[int] | None,
    resume: bool,
    progress: bool,
) -> list[dict]:
    from tqdm.auto import tqdm

    rank, world = _rank_world()
    out = Path(out_dir)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    if cfg.batch_seqs % world:
        raise ValueError(f"batch_seqs: {cfg.batch_seqs} must be a multiple of the world size {world}")
    idx = list(range(len(cache))) if indices is None else list(indices)
    if not idx:
        raise ValueError("indices: no training sequences")
    groups = parameter_groups(drafter, cfg)
    params = [p for g in groups for p in g["params"]]
    draft_ids = None
    if cfg.draft_vocab is not None:
        drafter.set_draft_vocab(cfg.draft_vocab)  # validates the ids; saved with every checkpoint
        draft_ids = drafter.draft_vocab.to(drafter.device)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8)
    start = 0
    if resume and (ck := latest_checkpoint(out)) is not None:
        load_drafter_weights(drafter, ck)
        state = torch.load(ck / "trainer_state.pt", weights_only=False)
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
    gen = torch.Generator().manual_seed(cfg.seed)
    # the sample order is a pure function of (seed, step): a resumed run sees the same data as an unbroken one
    per_step = cfg.batch_seqs
    epoch_len = len(idx)

    def batch_for(step: int) -> list[int]:
        first = step * per_step
        out_ids = []
        for k in range(first, first + per_step):
            ep, pos = divmod(k, epoch_len)
            perm = torch.randperm(epoch_len, generator=torch.Generator().manual_seed(cfg.seed + ep)).tolist()
            out_ids.append(idx[perm[pos]])
        return out_ids

    logs: list[dict] = []
    log_path = out / "train_log.jsonl"
    drafter.train()
    bar = tqdm(
        total=cfg.steps, initial=start, desc="training", unit="step", disable=not progress or rank != 0
    )
    t_last = time.perf_counter()
    acc_sum = torch.zeros(drafter.config.block_size, dtype=torch.float64)
    cnt_sum = torch.zeros(drafter.config.block_size, dtype=torch.float64)
    terms = torch.zeros(5, dtype=torch.float64)  # loss, ce, l1, bce, kl
    autocast_bf16 = cfg.bf16  # on the drafter's device: CPU (AVX-512 BF16 / AMX) or CUDA
    # the LM head is frozen: cast it to the autocast dtype once instead of once per forward
    lm_head = drafter.lm_head_weight.detach().to(torch.bfloat16) if autocast_bf16 else None
    for step in range(start, cfg.steps):
        lr = cosine_lr(step, cfg.steps, cfg.lr, cfg.warmup_ratio)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        mine = batch_for(step)[rank::world]
        seqs, anchor_sets = [], []
        for i in mine:
            s = cache[i]
            gen.manual_seed(cfg.seed * 1_000_003 + step * 131 + i)
            anchors = sample_anchors(s.loss_mask, cfg.num_anchors, gen)
            if anchors.numel():
                seqs.append(s)
                anchor_sets.append(anchors)
        # one packed pass over this rank's sequences (or one pass per sequence): the same gradient
        groups_of = [list(range(len(seqs)))] if cfg.packed else [[k] for k in range(len(seqs))]
        for group in groups_of if seqs else []:
            with torch.autocast(drafter.device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
                lo = packed_block_loss(
                    drafter,
                    [seqs[k] for k in group],
                    [anchor_sets[k] for k in group],
                    cfg.weights,
                    compile_loss=cfg.compile_loss,
                    lm_head=lm_head,
                    draft_ids=draft_ids,
                )
            (lo.loss / cfg.batch_seqs).backward()
            terms += torch.tensor(
                [float(lo.loss.detach()), float(lo.ce), float(lo.l1), float(lo.bce), float(lo.kl)],
                dtype=torch.float64,
            )
            acc_sum += lo.accept.double().cpu() * lo.counted.double().cpu()
            cnt_sum += lo.counted.double().cpu()
        if world > 1:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)
        gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        bar.update(1)
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            stats = torch.cat([terms, acc_sum, cnt_sum])
            if world > 1:
                dist.all_reduce(stats)
            g = drafter.config.block_size
            terms_g, acc_g, cnt_g = stats[:5], stats[5 : 5 + g], stats[5 + g :]
            n_seq = cfg.log_every * cfg.batch_seqs
            accept = acc_g / cnt_g.clamp_min(1)
            now = time.perf_counter()
            row = {
                "step": done,
                "lr": lr,
                "loss": float(terms_g[0]) / n_seq,
                "ce": float(terms_g[1]) / n_seq,
                "l1": float(terms_g[2]) / n_seq,
                "bce": float(terms_g[3]) / n_seq,
                "kl": float(terms_g[4]) / n_seq,
                "grad_norm": float(gnorm),
                "accept": [round(float(a), 4) for a in accept],
                "tau_estimate": tau_estimate(accept),
                "sec_per_step": (now - t_last) / cfg.log_every,
            }
            t_last = now
            logs.append(row)
            terms.zero_()
            acc_sum.zero_()
            cnt_sum.zero_()
            if rank == 0:
                with open(log_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
                bar.set_postfix(loss=f"{row['loss']:.3f}", tau=f"{row['tau_estimate']:.2f}")
        if rank == 0 and (done % cfg.save_every == 0 or done == cfg.steps):
            save_checkpoint(drafter, opt, done, cfg, out / f"checkpoint-{done}")
        if world > 1:
            dist.barrier()
    bar.close()
    drafter.eval()
    return logs
