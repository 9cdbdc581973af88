"""Matplotlib figures for the course. They only draw plain data; they never start ranks.

One colour per rank everywhere in the course (Okabe & Ito's colour-blind-safe palette), so that
rank 2 is the same green in the collectives primer, the TP shard layouts and the pipeline Gantt chart.
"""
from mtb_helpers.plots.palette import RANK_COLORS, rank_color, rank_legend_handles

__all__ = ["RANK_COLORS", "rank_color", "rank_legend_handles"]
