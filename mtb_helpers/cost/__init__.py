"""Time (notebook 13): what communication costs, predicted by the α-β model and measured on ranks.

The model (:mod:`mtb_helpers.cost.model`: its formulas, sources and what ``nbytes`` counts for
each collective) and this machine's calibration (:mod:`mtb_helpers.cost.calibrate`)::

    from mtb_helpers.cost import Link, predict, busbw
    link = Link(alpha=5e-6, bandwidth=50e9)          # seconds per message, bytes per second
    predict("all-reduce", nbytes, world_size, link, algorithm="ring")   # seconds
    coefficients("all-reduce", p, "ring")            # (a, b): T = a·α + b·nbytes/β
    algbw(nbytes, seconds); busbw("all-reduce", nbytes, seconds, p)    # nccl-tests' definitions
    calibrate(world_size, sizes, collectives)        # Calibration: .rows, .fits[name], .table()

Emulated links on real ranks (:mod:`mtb_helpers.runtime.link`; what each rank did and when:
:mod:`mtb_helpers.runtime.timeline`)::

    results = run(fn, *args, world_size=4, link=Link(5e-6, 50e9), time_scale=200.0, **kwargs)
    results[r], results.timeline   # rank r's return value; LinkTimeline of every rank's LinkEvents
    with padded("fc1.fwd", seconds):   # inside a rank: the block takes seconds x time_scale
        y = fc1(x)
    y = pad_backward(y, "fc1.bwd", seconds_bwd)   # identity; its backward takes seconds_bwd

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

__all__ = ["Link", "predict", "calibrate", "Calibration", "Fit", "padded", "pad_backward", "LinkEvent",
           "LinkTimeline", "RunResults", "algbw", "busbw", "busbw_factor", "coefficients", "n_half",
           "normalize", "COLLECTIVES", "ALGORITHMS", "predict_step_time", "predict_pipeline_step_time",
           "predict_grid_step_time"]
