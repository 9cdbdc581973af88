"""``train_parallel``: the tiny GPT trained on a tp x pp x dp x cp grid of real gloo ranks.

Every rank builds its piece of the model from the same full model (``make_model(seed)``, made by
the rank itself from the seed: ``full_model``) with the course's layers (``layers.build_stage``;
once per setting, kept between calls: ``kept.py``), puts the call's start state in, then for
each step:

    its batch slice:  ids [s, B] -> rows of its context chunk, columns of its data-parallel slice
                      -> [s/c, B/dp], cut into m micro-batches [s/c, B/(dp m)]
    pipeline:         the schedule's ops for its stage (``pp.stage.RankStage``: F sends the
                      activation [s/(c t), b, h] to the next stage, B sends its grad back)
    SP grads:         the replicated LayerNorm / bias grads summed over the tp group, one all-reduce
                      (``finalize.SequenceParallelGrads``)
    gradients:        averaged over the dp x cp group by the DP strategy (DDP all-reduce, or ZeRO-1
                      reduce-scatter, sharded AdamW step, all-gather of the parameters)
    AdamW step

Each micro-batch's loss is the mean over its tokens divided by m (``RankStage.scale_loss``), so a
last-stage rank's losses add up to the mean over its ``s/c x B/dp`` tokens; every dp x cp rank
holds as many tokens, so the mean of their losses is the whole batch's, and the average of their
gradients its gradient.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch
import torch.distributed as dist

from mtb_helpers.capstone.data import batch_for_step, corpus, encode
from mtb_helpers.capstone.grid import Grid, GridLayout
from mtb_helpers.capstone.kept import Stage, drop, kept_stage, resume
from mtb_helpers.capstone.layers import gather_param
from mtb_helpers.capstone.model import GPTConfig, TinyGPT, make_model
from mtb_helpers.capstone.reference import TrainConfig
from mtb_helpers.capstone.state import full_state, pack_snapshots, unpack
from mtb_helpers.capstone.validate import DP_STRATEGIES, PP_SCHEDULES, validate
from mtb_helpers.checking.bug import Bug, resolve, swap
from mtb_helpers.comm.records import record
from mtb_helpers.pp.p2p import P2P, Message
from mtb_helpers.pp.schedules import schedule as make_schedule
from mtb_helpers.pp.stage import RankStage
from mtb_helpers.runtime.ranks import run
from mtb_helpers.tp.vocab import VocabParallelCrossEntropy

__all__ = ["GridP2P", "ParallelRun", "train_parallel", "train_on_rank", "full_model", "full_state",
           "snapshot", "DP_STRATEGIES", "PP_SCHEDULES"]


class GridP2P(P2P):
    """The pipeline's messages inside one pipeline group: stage i is global rank ``ranks[i]``."""

    def __init__(self, ranks: list[int], microbatches: int):
        super().__init__(len(ranks), microbatches, time.perf_counter, None)
        self.ranks = ranks

    def send(self, tensor: torch.Tensor, msg: Message) -> None:
        # [s/(c t), b, h] activation or grad -> isend -> the next (or previous) stage's rank
        super().send(tensor, replace(msg, src=self.ranks[msg.src], dst=self.ranks[msg.dst]))

    def recv(self, shape: torch.Size, dtype: torch.dtype, msg: Message) -> torch.Tensor:
        # the previous (or next) stage's rank -> irecv -> [s/(c t), b, h]
        return super().recv(shape, dtype, replace(msg, src=self.ranks[msg.src], dst=self.ranks[msg.dst]))


@functools.lru_cache(maxsize=2)
def full_model(cfg: GPTConfig, seed: int, dtype: torch.dtype) -> TinyGPT:
    """``make_model(cfg, seed, dtype)``, made once per process and setting: cheaper than pickling
    the owner's (~25 ms a rank a call). Only read: ``build_stage`` copies from it."""
    return make_model(cfg, seed, dtype)


def train_on_rank(model: tuple[GPTConfig, int, torch.dtype], layout: GridLayout, run_cfg: TrainConfig,
                  microbatches: int, schedule: str, sequence_parallel: bool, strategy: str,
                  bug: Bug | None = None, first: int = 0, count: int | None = None,
                  states: list | None = None) -> dict:
    """Run on every rank: build the grid and this rank's stage of ``full_model(*model)``, train
    steps ``first`` .. ``first + count - 1`` (all ``run_cfg.steps`` by default), starting from
    this rank's entry of ``states`` (what the previous call's ``snapshots[-1]`` were) or from the
    model when None.
    ``bug``: a ``Bug`` whose wrong classes stand in for ``Grid`` / ``ParallelEmbedding`` /
    ``SequenceParallelGrads``."""
    grid = swap(bug, Grid).build(layout)
    count = run_cfg.steps - first if count is None else count
    state = None if states is None else states[dist.get_rank() if dist.is_initialized() else 0]
    key = None
    try:
        key, built = kept_stage(grid, full_model(*model), model, layout, run_cfg, sequence_parallel,
                                strategy, bug)
        return _train_stage(grid, built, model[0], layout, run_cfg, microbatches, schedule,
                            sequence_parallel, range(first, first + count), state)
    except BaseException:
        drop(key)   # it may be half-way through a step
        raise
    finally:
        grid.destroy()


@functools.lru_cache(maxsize=1)
def _tokens() -> torch.Tensor:
    """The corpus as token ids ``[n]``, made once per rank process (~10 ms a call otherwise)."""
    return encode(corpus())


def snapshot(opt, out: torch.Tensor) -> dict:
    """This rank's training state now, copied into ``out`` (``[Ψ + 2 (hi - lo)]``, its slice of
    the flat tensor the call's result carries): its flat parameters ``[Ψ]`` (all of its stage's
    tp shard), then the slice ``own = (lo, hi)`` of Adam's ``exp_avg`` / ``exp_avg_sq`` it
    updates (all of them under DDP, its ZeRO-1 shard of the padded ``[Ψ_pad]`` otherwise); the
    returned tensors are views of ``out``."""
    state = opt.optimizer.state[opt.master]
    now = (opt.flat[:opt.layout.numel], state["exp_avg"], state["exp_avg_sq"])
    copies = out.split([len(t) for t in now])
    for copy, t in zip(copies, now):
        copy.copy_(t)
    return {"params": copies[0], "own": tuple(opt.own), "exp_avg": copies[1],
            "exp_avg_sq": copies[2], "step": int(state["step"])}


def _train_stage(grid, built: Stage, cfg, layout, run_cfg, m, schedule, sequence_parallel, steps,
                 state) -> dict:
    at, tp_group = grid.index, grid.tensor_group()
    module, opt, sp_grads = built.module, built.opt, built.sp_grads
    opt.load(resume(built.initial, state))

    # logits [s/c, b, V/t], target [s/c, b] -> mean over its tokens: the max, then the sum of
    # exponentials and the target logit in one all-reduce (the module made once a call, not per F)
    loss_fn = VocabParallelCrossEntropy("mean", group=tp_group, vocab_size=cfg.vocab, fuse_sums=True)

    n, bd = cfg.seq // layout.cp, run_cfg.batch // layout.dp
    rows, cols = slice(at["cp"] * n, (at["cp"] + 1) * n), slice(at["dp"] * bd, (at["dp"] + 1) * bd)
    boundary = (torch.Size([n // layout.tp if sequence_parallel else n, bd // m, cfg.hidden]),
                module[0].pos.dtype if at["pp"] == 0 else next(module.parameters()).dtype)
    ops = make_schedule(schedule, layout.pp, m)[at["pp"]]
    # every snapshot of the call copied straight into the one flat tensor that travels back
    lo, hi = opt.own
    room = torch.empty((len(steps) + 1) * (opt.layout.numel + 2 * (hi - lo)), dtype=opt.flat.dtype)
    cuts = iter(room.chunk(len(steps) + 1))
    tokens, losses, snapshots = _tokens(), [], [snapshot(opt, next(cuts))]
    for step in steps:
        ids, targets = batch_for_step(step, run_cfg.batch, cfg.seq, tokens)
        x, y = ids[rows, cols], targets[rows, cols]                  # [s/c, B/dp]
        stage = RankStage(at["pp"], layout.pp, m, {0: module}, list(x.chunk(m, dim=1)),
                          list(y.chunk(m, dim=1)), loss_fn, GridP2P(grid.pipeline_ranks(), m),
                          [boundary] * layout.pp, count_saved=False)   # its bytes: never shown
        run_op = {"F": stage.forward, "B": stage.backward}
        opt.zero_grad()
        with record() as rec:
            for op in ops:
                run_op[op.kind](op.microbatch, op.chunk)
            stage.p2p.finish()
            if sp_grads is not None:
                sp_grads.finalize()  # the tp group: [Ψ_rep] partial sums -> their sum
            opt.reduce_gradients()   # the dp x cp group: sum, then / (dp c)
            opt.step()
        losses.append(sum(stage.losses.values()) if stage.losses else None)
        snapshots.append(snapshot(opt, next(cuts)))   # the state after this step (the next's start)
    # the parameters themselves travel once, as the last snapshot's (state.unpack cuts them)
    return {"index": dict(at), "losses": losses, "record": rec.without_tensors(),
            "params": {"names": built.names, "shapes": list(built.shapes)},
            "snapshots": pack_snapshots(snapshots, room)}   # one tensor: see state.py


@dataclass
class ParallelRun:
    """What ``train_parallel`` returns: the loss of every step (the whole batch's mean), the full
    parameters gathered from the shards, and per rank its coordinates, shards and last record."""
    layout: GridLayout
    losses: list[float]
    params: dict[str, torch.Tensor]
    per_rank: list[dict] = field(default_factory=list)
    config: dict = field(default_factory=dict)

    @property
    def records(self) -> list:
        return [r["record"] for r in self.per_rank]


FIRST_CALL_STEPS = 5     # a short run (the notebook's) is one call to the ranks
CALL_SHARE = 0.25        # later calls: as many steps as the measured pace fits in this share of
                         # the timeout (and in PROGRESS_EVERY seconds when progress is shown)
PROGRESS_EVERY = 2.0


def train_parallel(tp: int = 1, pp: int = 1, dp: int = 1, cp: int = 1, steps: int = 5,
                   microbatches: int = 2, schedule: str = "1f1b", sequence_parallel: bool = True,
                   seed: int = 0, dtype: torch.dtype = torch.float64, strategy: str = "ddp",
                   batch: int = 8, lr: float = 1e-2, weight_decay: float = 0.01,
                   cfg: GPTConfig = GPTConfig(), bug=None, timeout: float = 60.0,
                   progress: Callable | None = None, on_call: Callable | None = None) -> ParallelRun:
    """Train the tiny GPT for ``steps`` AdamW steps on ``tp * pp * dp * cp`` ranks. Sizes that do
    not divide are refused with a ValueError before any rank starts (``validate``).

    ``timeout`` guards one call to the ranks, not the run: the run is cut into calls of a few
    steps (the first ``FIRST_CALL_STEPS``, then as many as the measured pace fits in a quarter of
    ``timeout``), each resuming from the state the last one returned, so a run of any length is
    allowed and a hang is reported within ``timeout`` seconds. After every call:
    ``on_call(first_step, results)`` (every rank's result, with its ``snapshots``: the state
    before each step of the call and after the last) and ``progress(done, steps, loss,
    seconds_per_step)``."""
    layout = GridLayout(tp, pp, dp, cp)
    run_cfg = TrainConfig(steps, batch, lr, weight_decay, seed)
    validate(layout, cfg, run_cfg, microbatches, schedule, sequence_parallel, strategy, timeout)
    wrong = resolve(bug, "capstone")
    model = full_model(cfg, seed, dtype)
    done, states, losses, pace, results = 0, None, [], None, []
    while done < steps:
        budget = timeout * CALL_SHARE if progress is None else min(timeout * CALL_SHARE,
                                                                    PROGRESS_EVERY)
        count = min(steps - done, FIRST_CALL_STEPS if pace is None else max(1, int(budget / pace)))
        began = time.perf_counter()
        results = run(train_on_rank, (cfg, seed, dtype), layout, run_cfg, microbatches, schedule,
                      sequence_parallel, strategy, wrong, done, count, states,
                      world_size=layout.world_size, timeout=timeout)
        pace = (time.perf_counter() - began) / count
        results = [unpack(r) for r in results]
        last = [r for r in results if r["index"]["pp"] == pp - 1 and r["index"]["tp"] == 0]
        losses += [sum(r["losses"][k] for r in last) / len(last) for k in range(count)]
        if on_call is not None:
            on_call(done, results)
        # the next call's start, copied out of the flat tensor (a view would pickle all of it)
        states = [{k: v.clone() if isinstance(v, torch.Tensor) else v
                   for k, v in r.pop("snapshots")[-1].items()} for r in results]
        done += count
        if progress is not None:
            progress(done, steps, losses[-1], pace)
    params = {}
    for stage in range(pp):
        owners = [results[layout.mesh().rank_of(tp=j, pp=stage)] for j in range(tp)]
        for name in owners[0]["params"]:
            params.update(gather_param([o["params"][name] for o in owners], name))
    order = [name for name, _ in model.named_parameters()]
    config = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "steps": steps, "microbatches": microbatches,
              "schedule": schedule, "sequence_parallel": sequence_parallel, "strategy": strategy,
              "batch": batch, "lr": lr, "weight_decay": weight_decay, "seed": seed,
              "dtype": str(dtype).replace("torch.", ""), "model": cfg.to_dict()}
    return ParallelRun(layout, losses, {name: params[name] for name in order}, results, config)
