"""The planner against the layouts and throughputs Narayanan et al. published (arithmetic only).

Narayanan, Shoeybi, Casper, LeGresley, Patwary, Korthikanti, Vainbrand, Kashinkunti, Bernauer,
Catanzaro, Phanishayee, Zaharia: "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC 2021 (arXiv 2104.04473), Table 1: weak scaling of GPT models from 1.7B to
1T parameters on DGX A100 nodes (8 x A100 80 GB), vocabulary 51,200, sequence 2048, mixed
precision (fp16), full activation recomputation. Where each number was checked:

  hidden, layers, parameters, GPUs, batch, teraFLOP/s per GPU, % of peak, aggregate petaFLOP/s
      the table of the Megatron-LM README that reports the paper's runs (images/cases_april2021.png,
      NVIDIA/Megatron-LM before commit 937571c), which prints "model-parallel size" = tp x pp; the
      abstract (502 petaFLOP/s on 3072 GPUs, 52 % of peak) agrees with its last row.
  heads, tp, pp, micro-batch, layers per virtual stage, DDP, recompute, fp16, seq 2048
      the authors' script for this table, examples/sc21/run_table_1.sh and CONFIG.sh of
      NVIDIA/Megatron-LM (added in de7dc40, "scripts for sc21"): TP, PP, MBS, GBS, NLS, HS, NAH,
      --activations-checkpoint-method uniform (full recompute; --checkpoint-activations in the
      first version), --num-layers-per-virtual-pipeline-stage (the interleaved schedule) for the
      76B, 145B, 310B and 530B rows, --fp16, DDP "torch" (overlapping) without a pipeline and
      Megatron's "local" one (reducing after the backward) with one.
  Not checked: the paper's PDF itself (its text was not in the search corpora); its Table 1 is
  the README's table with the heads and the tp / pp split added, which the script supplies.

``compare(row)`` builds the row's GPT (``gpt_model``), an ``a100`` cluster of its GPUs and its
published layout (``published_layout``), and returns the planner's predicted teraFLOP/s per GPU
(counted as the paper counts them: ``narayanan_flops``, recompute included), the published one,
the gap, whether the layout fits in 80 GiB by the planner's accounting, and where it ranks among
``plan()``'s layouts. The one assumption: the matmuls run at ``A100_MATMUL_EFFICIENCY`` of peak,
the same for every row (not fitted to any).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mtb_helpers.plan.budget import memory_per_rank, total_params
from mtb_helpers.plan.presets import cluster
from mtb_helpers.plan.search import PlanResult, plan
from mtb_helpers.plan.specs import ClusterSpec, Layout, ModelSpec, Spec, layout_problems
from mtb_helpers.plan.steptime import StepTime, stage_compute, step_time

__all__ = ["PublishedRow", "NARAYANAN_2021_TABLE_1", "A100_MATMUL_EFFICIENCY", "A100_PEAK",
           "gpt_model", "published_layout", "row_problems", "narayanan_flops", "step_flops",
           "Comparison", "compare", "PLAN_SEARCH",
           "megatron_2021_steps"]

VOCAB, SEQ = 51200, 2048
A100_PEAK = 312e12
# Maximum achievable matmul FLOP/s of one A100 SXM, BF16: 271.2 of 312 TFLOP/s (86.9 %), Bekman,
# "Machine Learning Engineering", compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS
# comparison table" (torch 2.6 + CUDA 12.6). An upper bound for 2021's software (the paper ran
# CUDA 11.1 in nvcr.io/nvidia/pytorch:20.12), and it is every matmul's rate, small ones too.
A100_MATMUL_EFFICIENCY = 271.2 / 312
# plan()'s search for the rank: the planner's defaults plus the paper's micro-batch sizes and the
# interleaved schedule; cp = 1 (Megatron-LM had no context parallelism in 2021; s = 2048).
PLAN_SEARCH = dict(microbatches=(1, 2, 4, 8, 16), schedules=("1f1b", "interleaved"),
                   cp_sizes=(1,), dtype="fp16")


@dataclass(frozen=True)
class PublishedRow(Spec):
    """One row of Table 1 and the run behind it (see the module docstring for the sources)."""
    name: str
    params_billion: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops_per_gpu: float
    percent_of_peak: float
    aggregate_pflops: float
    microbatch: int
    layers_per_virtual_stage: int | None = None   # interleaved schedule when set
    ddp: str = "local"                            # "torch" overlaps the gradient all-reduce
    CHOICES = {"ddp": ("torch", "local")}


NARAYANAN_2021_TABLE_1 = (
    PublishedRow("1.7B", 1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44, 4.4, 16, ddp="torch"),
    PublishedRow("3.6B", 3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44, 8.8, 16, ddp="torch"),
    PublishedRow("7.5B", 7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46, 18.2, 16, ddp="torch"),
    PublishedRow("18B", 18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 34.6, 8, ddp="torch"),
    PublishedRow("39B", 39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 70.8, 4),
    PublishedRow("76B", 76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 143.8, 2, 5),
    PublishedRow("145B", 145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 227.1, 2, 5),
    PublishedRow("310B", 310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 297.4, 1, 3),
    PublishedRow("530B", 529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 410.2, 1, 1),
    PublishedRow("1T", 1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 502.0, 1),
)


def gpt_model(row: PublishedRow) -> ModelSpec:
    """The row's GPT: 4h MLP, LayerNorm and biases, learned positions, tied embeddings, dropout
    (Megatron-LM's GPT defaults; the scripts keep them), V = 51200, s = 2048."""
    return ModelSpec(layers=row.layers, hidden=row.hidden, heads=row.heads, kv_heads=row.heads,
                     ffn_hidden=4 * row.hidden, vocab=VOCAB, seq_len=SEQ, bias=True,
                     norm="layernorm", tied_embeddings=True, learned_positions=True,
                     dropout=True, name=f"GPT {row.name}")


def published_layout(row: PublishedRow) -> Layout:
    """The run's layout: dp = GPUs / (tp pp), the script's micro-batch, batch / (dp mb) of them
    per step, interleaved with layers/(pp x layers per virtual stage) chunks where the script asks
    for it (1F1B otherwise), no ZeRO (Megatron-LM in 2021 kept optimizer states on every data-
    parallel rank), full recompute, fp16, no sequence parallelism (it came in 2022), attention
    materialized (FlashAttention came in 2022 too)."""
    dp, rest = divmod(row.gpus, row.tp * row.pp)
    if rest:
        raise ValueError(f"{row.name}: {row.gpus} GPUs is not a multiple of tp*pp = "
                         f"{row.tp}*{row.pp}: no whole number of data-parallel replicas")
    m, rest = divmod(row.batch, dp * row.microbatch)
    if rest or m == 0:
        raise ValueError(f"{row.name}: batch {row.batch} is not a multiple of dp*microbatch = "
                         f"{dp}*{row.microbatch}")
    chunks, per = 1, row.layers_per_virtual_stage
    if per is not None:
        per_stage, rest = divmod(row.layers, row.pp)
        if rest or per_stage % per:
            raise ValueError(f"{row.name}: {row.layers} layers on pp={row.pp} stages do not make "
                             f"virtual stages of {per} layers")
        chunks = per_stage // per
    return Layout(tp=row.tp, pp=row.pp, dp=dp, microbatch=row.microbatch, grad_accum=m,
                  schedule="interleaved" if chunks > 1 else "1f1b", zero_stage=0,
                  recompute="full", dtype="fp16", sequence_parallel=False, chunks=chunks,
                  attention="materialized")


def row_problems(row: PublishedRow, gpus_per_node: int = 8) -> list[str]:
    """Every way ``row`` disagrees with itself or with the paper's rules: its parameter count
    against its sizes, its GPUs against tp*pp*dp, its aggregate and % of peak against its per-GPU
    figure, and the paper's takeaway #1: tensor parallelism up to the node (8), then pipeline
    across nodes, so tp never exceeds 8 and a row with pp > 1 has tp = 8 (the README: "for numbers
    larger than 8, typically tensor parallel of size 8 was used")."""
    out = []
    params = total_params(gpt_model(row)) / 1e9
    if round(params, 1) != row.params_billion:
        out.append(f"{row.name}: l={row.layers}, h={row.hidden} make {params:.1f}B parameters, "
                   f"the row says {row.params_billion}B")
    if row.gpus % (row.tp * row.pp):
        out.append(f"{row.name}: {row.gpus} GPUs is not tp*pp*dp for tp={row.tp}, pp={row.pp}")
    if row.tp > gpus_per_node:
        out.append(f"{row.name}: tp={row.tp} exceeds {gpus_per_node} GPUs per node (takeaway #1: "
                   "tensor parallelism stays inside a node)")
    elif row.pp > 1 and row.tp < gpus_per_node:
        out.append(f"{row.name}: pp={row.pp} with tp={row.tp} < {gpus_per_node} (takeaway #1: "
                   "tensor parallelism fills the node before pipeline parallelism starts)")
    if abs(row.tflops_per_gpu * row.gpus / 1e3 - row.aggregate_pflops) > 0.5 * row.gpus / 1e3 + 0.05:
        out.append(f"{row.name}: {row.tflops_per_gpu} TFLOP/s x {row.gpus} GPUs is not "
                   f"{row.aggregate_pflops} PFLOP/s")
    if abs(100 * row.tflops_per_gpu / (A100_PEAK / 1e12) - row.percent_of_peak) > 0.5 + 50 / 312:
        out.append(f"{row.name}: {row.tflops_per_gpu} TFLOP/s is not {row.percent_of_peak} % of "
                   f"{A100_PEAK / 1e12:.0f}")
    return out


def narayanan_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """FLOPs of one iteration with full recompute, Narayanan et al. sec. 5.1:
    ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``."""
    B, s, l, h, V = batch, seq, layers, hidden, vocab
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def step_flops(model: ModelSpec, layout: Layout) -> float:
    """FLOPs of one step as the planner counts them (``stage_compute`` at 1 FLOP/s): every
    pipeline rank's forward and backward of a micro-batch, times its tp x cp x dp copies and the
    micro-batches of a step. Recompute included, as the paper counts."""
    per_rank = sum(f + b for f, b in stage_compute(model, layout, 1.0))
    return per_rank * layout.tp * layout.cp * layout.dp * layout.grad_accum


@dataclass
class Comparison:
    """One row of Table 1 against the planner (TFLOP/s are per GPU, the paper's way)."""
    row: PublishedRow
    model: ModelSpec
    cluster: ClusterSpec
    layout: Layout
    efficiency: float
    time: StepTime
    predicted_tflops: float
    peak_bytes: float
    fits: bool
    rank: int | None = None              # 1 + the planner's layouts predicted faster
    of: int | None = None                # layouts the planner found that fit
    best: Layout | None = None
    best_speedup: float | None = None    # published step / the planner's best step
    rank_2021: int | None = None         # the same among what Megatron-LM could run in 2021
    of_2021: int | None = None
    best_2021: Layout | None = None
    plan_result: PlanResult | None = field(default=None, repr=False)

    @property
    def published_tflops(self) -> float:
        return self.row.tflops_per_gpu

    @property
    def gap(self) -> float:
        """(predicted - published) / published."""
        return self.predicted_tflops / self.published_tflops - 1


def compare(row: PublishedRow, efficiency: float = A100_MATMUL_EFFICIENCY,
            rank: bool = True) -> Comparison:
    """The planner on ``row``'s published layout (ValueError if the row fails ``row_problems`` or
    the planner refuses the layout); with ``rank``, also ``plan()`` over ``PLAN_SEARCH`` with the
    same efficiency and overlap, and how many of its layouts it predicts faster (counted, not
    looked up: plan() tries 2 chunks only and sequence parallelism always, so 76B's and 530B's
    3-chunk layouts, and every published one with its sequence parallelism off, are not in its
    list). Overlap of the gradient all-reduce follows the run's DDP: torch's overlaps, Megatron-
    LM's "local" one of 2021 reduced after the backward."""
    problems = row_problems(row)
    if problems:
        raise ValueError("not a consistent Table 1 row: " + "; ".join(problems))
    gpt, a100, layout = gpt_model(row), cluster("a100", gpus=row.gpus), published_layout(row)
    refused = layout_problems(gpt, a100, layout, row.batch)
    if refused:
        raise ValueError(f"the planner refuses {row.name}'s layout {layout.short()}: "
                         + "; ".join(refused))
    overlap = row.ddp == "torch"
    t = step_time(gpt, a100, layout, efficiency, overlap=overlap)
    flops = step_flops(gpt, layout)
    peak = max(s.total for s in memory_per_rank(gpt, layout))
    out = Comparison(row, gpt, a100, layout, efficiency, t, flops / t.step / row.gpus / 1e12,
                     peak, peak <= a100.memory_bytes)
    if rank:
        res = plan(gpt, a100, row.batch, mfu=efficiency, overlap=overlap, **PLAN_SEARCH)
        out.plan_result, out.of = res, len(res.ranked)
        out.rank = 1 + sum(c.time.step < t.step for c in res.ranked)
        if res.ranked:
            out.best = res.ranked[0].layout
            out.best_speedup = t.step / res.ranked[0].time.step
        then = megatron_2021_steps(gpt, a100, res, efficiency, overlap)
        out.rank_2021, out.of_2021 = 1 + sum(s < t.step for s, _ in then), len(then)
        out.best_2021 = min(then, key=lambda x: x[0])[1] if then else None
    return out


def megatron_2021_steps(model: ModelSpec, cl: ClusterSpec, result: PlanResult, efficiency: float,
                        overlap: bool) -> list[tuple[float, Layout]]:
    """(step time, layout) of ``result``'s layouts that Megatron-LM could run in 2021: no ZeRO (its
    distributed optimizer came later), no selective recompute and no sequence parallelism (both
    Korthikanti et al. 2022) and no FlashAttention (Dao et al. 2022); each re-costed without
    sequence parallelism and with materialized attention, kept if it still fits.
    (Sequence parallelism only lowers memory, so nothing plan() refused fits without it.)"""
    out = []
    for c in result.ranked:
        if c.layout.zero_stage or c.layout.recompute == "selective":
            continue
        layout = c.layout.with_(sequence_parallel=False, attention="materialized")
        if max(s.total for s in memory_per_rank(model, layout)) <= cl.memory_bytes:
            out.append((step_time(model, cl, layout, efficiency, overlap=overlap).step, layout))
    return out
