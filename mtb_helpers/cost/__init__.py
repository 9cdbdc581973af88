"""Time (notebook 13): what communication costs, predicted by the α-β model and measured on ranks.

The model (:mod:`mtb_helpers.cost.model`, formulas and sources there) and this machine's
calibration (:mod:`mtb_helpers.cost.calibrate`: ``calibrate(world_size, sizes, collectives)``
-> ``Calibration`` with ``.rows``, ``.fits[name].alpha/.bandwidth/.residuals``, ``.table()``)::

    from mtb_helpers.cost import Link, predict, busbw
    link = Link(alpha=5e-6, bandwidth=50e9)          # seconds per message, bytes per second
    predict("all-reduce", nbytes, world_size, link, algorithm="ring")   # seconds
    coefficients("all-reduce", p, "ring")            # (a, b): T = a·α + b·nbytes/β
    algbw(nbytes, seconds); busbw("all-reduce", nbytes, seconds, p)    # nccl-tests' definitions

``nbytes`` is nccl-tests' "size" S: all-reduce and broadcast the buffer, all-gather the gathered
output, reduce-scatter the full input, all-to-all each rank's send buffer, send/recv the message.
Collective names: "broadcast", "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
"send/recv" (torch's spellings "all_reduce", "send", ... are accepted). Algorithms: ``ALGORITHMS``.

Emulated links on real ranks (:mod:`mtb_helpers.runtime.link`)::

    from mtb_helpers import run
    results = run(fn, *args, world_size=4, link=Link(5e-6, 50e9), time_scale=200.0, **kwargs)
    results[r]                     # rank r's return value, as without a link (results is a list)
    tl = results.timeline          # LinkTimeline: tl.ranks[r] is rank r's list of LinkEvent
    tl.events(rank=None, kind=None, name=None)   # filtered, rank by rank
    tl.makespan, tl.time_scale, tl.link, tl.label(), tl.in_model_time()

Inside ``fn`` every op issued through ``torch.distributed`` (all_reduce, broadcast, reduce,
all_gather[_into_tensor], reduce_scatter[_tensor], all_to_all[_single], gather, scatter, barrier,
send/recv/isend/irecv, batch_isend_irecv, the object collectives) runs on the rank's comm stream
and takes ``predict(...)`` x ``time_scale`` seconds; ``async_op=True`` returns a handle at once
(``wait()``, ``is_completed()``), so communication overlaps with computation. Computation is
given a modelled duration with::

    from mtb_helpers.cost import padded
    with padded("fc1.fwd", seconds):   # inside a rank: the block takes seconds x time_scale
        y = fc1(x)
    y = pad_backward(y, "fc1.bwd", seconds_bwd)   # identity; its backward takes seconds_bwd

Each ``LinkEvent`` is ``(kind, name, bytes, start, end, modelled)``: kind "compute" (a padded block)
or "comm"; name the padded block's or the torch.distributed function's ("all_reduce", "send",
"recv", "barrier"); bytes nccl-tests' S (0 for compute); start/end seconds of this machine's
clock from one zero shared by all ranks; modelled the seconds asked for (time scale included).
``e.seconds = end - start``; ``e.overrun`` is how much longer the real work took than modelled
(0 when honoured). ``tl.in_model_time()`` divides every time by the time scale. A link faster
than this machine's gloo at that time scale is refused (ValueError naming the smallest time scale
that works) before ``fn`` starts. PyTorch's DDP, DTensor and FSDP2 issue their collectives from
C++: those are not emulated.

A step's time predicted from its collective records (:mod:`mtb_helpers.cost.step`)::

    predict_step_time(records, link, compute)      # collectives one after another (TP, SP, DP, ...)
    predict_pipeline_step_time("1f1b", stages, microbatches, (F, B), message_bytes, link)
    predict_grid_step_time(ranks, compute, link)   # the capstone: tp x pp x dp x cp, per-op records
"""
from mtb_helpers.cost.calibrate import Calibration, Fit, calibrate
from mtb_helpers.cost.model import (ALGORITHMS, COLLECTIVES, Link, algbw, busbw, busbw_factor,
                                    coefficients, n_half, normalize, predict)
from mtb_helpers.cost.step import predict_grid_step_time, predict_pipeline_step_time, predict_step_time
from mtb_helpers.runtime.link import pad_backward, padded
from mtb_helpers.runtime.timeline import LinkEvent, LinkTimeline, RunResults

# cost.Event and cost.Timeline, the names of before (issue 34 gave every class one name in the
# package: pp's simulator keeps Event and Timeline), still import; new code says LinkEvent/LinkTimeline
Event, Timeline = LinkEvent, LinkTimeline

__all__ = ["Link", "predict", "calibrate", "Calibration", "Fit", "padded", "pad_backward", "LinkEvent",
           "LinkTimeline", "RunResults", "algbw", "busbw", "busbw_factor", "coefficients", "n_half",
           "normalize", "COLLECTIVES", "ALGORITHMS", "predict_step_time", "predict_pipeline_step_time",
           "predict_grid_step_time"]
