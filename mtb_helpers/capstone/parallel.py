"""``train_parallel``: the tiny GPT trained on a tp x pp x dp x cp grid of real gloo ranks.

Every rank builds its piece of the model from the same full model (``make_model(seed)``) with the
course's layers (``layers.build_stage``), then for each step:

    its batch slice:  ids [s, B] -> rows of its context chunk, columns of its data-parallel slice
                      -> [s/c, B/dp], cut into m micro-batches [s/c, B/(dp m)]
    pipeline:         the schedule's ops for its stage (``pp.stage.RankStage``: F sends the
                      activation [s/(c t), b, h] to the next stage, B sends its grad back)
    gradients:        averaged over the dp x cp group by the DP strategy (DDP all-reduce, or ZeRO-1
                      reduce-scatter, sharded AdamW step, all-gather of the parameters)
    AdamW step

Each micro-batch's loss is the mean over its tokens divided by m (``RankStage.scale_loss``), so a
last-stage rank's losses add up to the mean over its ``s/c x B/dp`` tokens; every dp x cp rank
holds as many tokens, so the mean of their losses is the whole batch's, and the average of their
gradients its gradient.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from mtb_helpers.capstone.data import batch_for_step, corpus, encode
from mtb_helpers.capstone.grid import Grid, Layout, rank_of
from mtb_helpers.capstone.layers import ParallelEmbedding, build_stage, gather_param
from mtb_helpers.capstone.model import GPTConfig, make_model
from mtb_helpers.capstone.reference import TrainConfig
from mtb_helpers.capstone.validate import DP_STRATEGIES, PP_SCHEDULES, validate
from mtb_helpers.comm.records import record
from mtb_helpers.dp.fsdp import STRATEGY_CLASSES
from mtb_helpers.dp.strategies import flat
from mtb_helpers.pp.p2p import P2P, Message
from mtb_helpers.pp.schedules import schedule as make_schedule
from mtb_helpers.pp.stage import RankStage
from mtb_helpers.runtime.ranks import run
from mtb_helpers.tp.vocab import vocab_parallel_cross_entropy

__all__ = ["GridP2P", "ParallelRun", "train_parallel", "train_on_rank", "DP_STRATEGIES",
           "PP_SCHEDULES"]



class GridP2P(P2P):
    """The pipeline's messages inside one pipeline group: stage i is global rank ``ranks[i]``."""

    def __init__(self, ranks: list[int], microbatches: int):
        super().__init__(len(ranks), microbatches, time.perf_counter, None)
        self.ranks = ranks

    def send(self, tensor: torch.Tensor, msg: Message) -> None:
        start = self.clock()
        tensor = tensor.detach().contiguous()
        # [s/(c t), b, h] activation or grad -> isend -> the next (or previous) stage's rank
        work = dist.isend(tensor, dst=self.ranks[msg.dst], tag=self.tag(msg))
        self.pending.append((work, tensor))
        self._note("send", tensor, msg, start)

    def recv(self, shape: torch.Size, dtype: torch.dtype, msg: Message) -> torch.Tensor:
        start = self.clock()
        out = torch.empty(shape, dtype=dtype)
        # the previous (or next) stage's rank -> irecv -> [s/(c t), b, h]
        dist.irecv(out, src=self.ranks[msg.src], tag=self.tag(msg)).wait()
        self._note("recv", out, msg, start)
        return out


def train_on_rank(model, layout: Layout, run_cfg: TrainConfig, microbatches: int, schedule: str,
                  sequence_parallel: bool, strategy: str, bug=None) -> dict:
    """Run on every rank: build the grid and this rank's stage, train ``run_cfg.steps`` steps.
    ``bug``: a ``Bug`` whose wrong classes stand in for ``Grid`` / ``ParallelEmbedding``."""
    swap = (lambda cls: cls) if bug is None else (lambda cls: bug.replaces.get(cls, cls))
    grid = swap(Grid).build(layout)
    try:
        return _train(grid, model, layout, run_cfg, microbatches, schedule, sequence_parallel,
                      strategy, swap)
    finally:
        grid.destroy()


def _train(grid, model, layout, run_cfg, m, schedule, sequence_parallel, strategy, swap) -> dict:
    at, cfg = grid.index, model.cfg
    tp_group = grid.tensor_group()
    module = build_stage(model, at["pp"], layout.pp, sequence_parallel, tp_group,
                         grid.context_group(), swap(ParallelEmbedding))
    params = flat(module.parameters())
    start = {"params": params, "exp_avg": torch.zeros_like(params),
             "exp_avg_sq": torch.zeros_like(params), "step": 0}
    opt = STRATEGY_CLASSES[strategy](module, start, run_cfg.adam(), group=grid.gradient_group(),
                                     copy_model=False)

    def loss_fn(logits, target):   # logits [s/c, b, V/t], target [s/c, b] -> mean over its tokens
        return vocab_parallel_cross_entropy(logits, target, "mean", group=tp_group,
                                            vocab_size=cfg.vocab)

    n, bd = cfg.seq // layout.cp, run_cfg.batch // layout.dp
    rows, cols = slice(at["cp"] * n, (at["cp"] + 1) * n), slice(at["dp"] * bd, (at["dp"] + 1) * bd)
    boundary = (torch.Size([n // layout.tp if sequence_parallel else n, bd // m, cfg.hidden]),
                module[0].pos.dtype if at["pp"] == 0 else next(module.parameters()).dtype)
    ops = make_schedule(schedule, layout.pp, m)[at["pp"]]
    tokens, losses = encode(corpus()), []
    for step in range(run_cfg.steps):
        ids, targets = batch_for_step(step, run_cfg.batch, cfg.seq, tokens)
        x, y = ids[rows, cols], targets[rows, cols]                  # [s/c, B/dp]
        stage = RankStage(at["pp"], layout.pp, m, {0: module}, list(x.chunk(m, dim=1)),
                          list(y.chunk(m, dim=1)), loss_fn, GridP2P(grid.pipeline_ranks(), m),
                          [boundary] * layout.pp)
        run_op = {"F": stage.forward, "B": stage.backward}
        opt.zero_grad()
        with record() as rec:
            for op in ops:
                run_op[op.kind](op.microbatch, op.chunk)
            stage.p2p.finish()
            opt.reduce_gradients()   # the dp x cp group: sum, then / (dp c)
            opt.step()
        losses.append(sum(stage.losses.values()) if stage.losses else None)
    return {"index": dict(at), "losses": losses, "record": rec.without_tensors(),
            "params": {name: p.detach().clone() for name, p in module.named_parameters()}}


@dataclass
class ParallelRun:
    """What ``train_parallel`` returns: the loss of every step (the whole batch's mean), the full
    parameters gathered from the shards, and per rank its coordinates, shards and last record."""
    layout: Layout
    losses: list[float]
    params: dict[str, torch.Tensor]
    per_rank: list[dict] = field(default_factory=list)
    config: dict = field(default_factory=dict)

    @property
    def records(self) -> list:
        return [r["record"] for r in self.per_rank]


def train_parallel(tp: int = 1, pp: int = 1, dp: int = 1, cp: int = 1, steps: int = 5,
                   microbatches: int = 2, schedule: str = "1f1b", sequence_parallel: bool = True,
                   seed: int = 0, dtype: torch.dtype = torch.float64, strategy: str = "ddp",
                   batch: int = 8, lr: float = 1e-2, weight_decay: float = 0.01,
                   cfg: GPTConfig = GPTConfig(), bug=None, timeout: float = 120.0) -> ParallelRun:
    """Train the tiny GPT for ``steps`` AdamW steps on ``tp * pp * dp * cp`` ranks. Sizes that do
    not divide are refused with a ValueError before any rank starts (``validate``)."""
    layout = Layout(tp, pp, dp, cp)
    run_cfg = TrainConfig(steps, batch, lr, weight_decay, seed)
    validate(layout, cfg, run_cfg, microbatches, schedule, sequence_parallel, strategy)
    model = make_model(cfg, seed, dtype)
    results = run(train_on_rank, model, layout, run_cfg, microbatches, schedule, sequence_parallel,
                  strategy, bug, world_size=layout.world_size, timeout=timeout)
    last = [r for r in results if r["index"]["pp"] == pp - 1 and r["index"]["tp"] == 0]
    losses = [sum(r["losses"][k] for r in last) / len(last) for k in range(steps)]
    params = {}
    for stage in range(pp):
        owners = [results[rank_of(layout, tp=j, pp=stage)] for j in range(tp)]
        for name in owners[0]["params"]:
            params.update(gather_param([o["params"][name] for o in owners], name))
    order = [name for name, _ in model.named_parameters()]
    config = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "steps": steps, "microbatches": microbatches,
              "schedule": schedule, "sequence_parallel": sequence_parallel, "strategy": strategy,
              "batch": batch, "lr": lr, "weight_decay": weight_decay, "seed": seed,
              "dtype": str(dtype).replace("torch.", ""), "model": cfg.to_dict()}
    return ParallelRun(layout, losses, {name: params[name] for name in order}, results, config)
