"""Time (notebook 13): what communication costs, predicted by the α-β model and measured on ranks.

    from mtb_helpers.cost import Link, predict, busbw
    link = Link(alpha=5e-6, bandwidth=50e9)          # seconds per message, bytes per second
    predict("all-reduce", nbytes, world_size, link, algorithm="ring")   # seconds

``nbytes`` is nccl-tests' "size" S: all-reduce and broadcast the buffer, all-gather the gathered
output, reduce-scatter the full input, all-to-all each rank's send buffer, send/recv the message.
The formulas and their sources are in :mod:`mtb_helpers.cost.model`.
"""
from mtb_helpers.cost.model import (ALGORITHMS, COLLECTIVES, Link, algbw, busbw, busbw_factor,
                                    coefficients, n_half, normalize, predict)

__all__ = ["Link", "predict", "algbw", "busbw", "busbw_factor", "coefficients", "n_half",
           "normalize", "COLLECTIVES", "ALGORITHMS"]
