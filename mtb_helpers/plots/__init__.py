"""What every figure of the course shares: the rank palette, the error-per-quantity figure, the
two-layer figures explorers redraw, the pieces figures are built from. Each topic draws its own
figures in ``mtb_helpers/<topic>/plots.py``, from the plain data a check returns (a Report, lists,
dicts); a plot imports no check and starts no ranks (tests/test_layering.py holds it to that).

* ``palette.py``: one colour per rank everywhere in the course (Okabe & Ito's colour-blind-safe
  palette), so that rank 2 is the same green in the collectives primer, the TP shard layouts and
  the pipeline Gantt chart; a complete sum is one band of each rank's colour.
* ``errors.py``: max abs error per rank and quantity (or step) against the tolerance, the figure
  every check's notebook and explorer shows.
* ``live.py``: ``LiveFigure``, a figure whose static layer is drawn once per shape and whose
  values are drawn over it on every slider move.
* ``parts.py``: what several topics drew alike (a legend right of the axes, stacked bars, the
  "0 (exact)" log axis, a label fitted to a box), written once.
* ``timelines.py``: compute and communication lanes per rank (notebooks 13 and 14).
"""
