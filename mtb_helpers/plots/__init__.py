"""What every figure of the course shares: the rank palette (palette.py). Each topic draws its own
figures in ``mtb_helpers/<topic>/plots.py``, from the plain data a check returns (a Report, lists,
dicts); a plot imports no check and starts no ranks (tests/test_layering.py holds it to that).

One colour per rank everywhere in the course (Okabe & Ito's colour-blind-safe palette), so that
rank 2 is the same green in the collectives primer, the TP shard layouts and the pipeline Gantt chart.
"""
from mtb_helpers.plots.palette import RANK_COLORS, rank_color, rank_legend_handles

__all__ = ["RANK_COLORS", "rank_color", "rank_legend_handles"]
