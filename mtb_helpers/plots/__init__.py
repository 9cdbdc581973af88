"""What every figure of the course shares: the rank palette, the error-per-quantity figure, the
two-layer figures explorers redraw. Each topic draws its own figures in
``mtb_helpers/<topic>/plots.py``, from the plain data a check returns (a Report, lists, dicts); a
plot imports no check and starts no ranks (tests/test_layering.py holds it to that).

* ``palette.py``: one colour per rank everywhere in the course (Okabe & Ito's colour-blind-safe
  palette), so that rank 2 is the same green in the collectives primer, the TP shard layouts and
  the pipeline Gantt chart.
* ``errors.py``: max abs error per rank and quantity (or step) against the tolerance, the figure
  every check's notebook and explorer shows.
* ``live.py``: ``LiveFigure``, a figure whose static layer is drawn once per shape and whose
  values are drawn over it on every slider move.
"""
from mtb_helpers.plots.errors import error_legend_handles, plot_errors
from mtb_helpers.plots.live import LiveFigure, Png
from mtb_helpers.plots.palette import RANK_COLORS, rank_color, rank_legend_handles

__all__ = ["RANK_COLORS", "rank_color", "rank_legend_handles", "plot_errors",
           "error_legend_handles", "LiveFigure", "Png"]
