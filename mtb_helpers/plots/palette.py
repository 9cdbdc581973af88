"""The course palette: rank r always has the same colour-blind-safe colour.

A complete sum over several ranks is one band of each rank's colour (notebook 00's picture, kept
in 01-03)."""
from typing import Sequence

from matplotlib.patches import Patch, Rectangle

# Okabe & Ito (2008), "Color Universal Design", ordered so that neighbouring ranks contrast.
# Black is left out (text and arrows are black); grey marks "not held / idle".
RANK_COLORS: tuple[str, ...] = (
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#D55E00",  # vermillion
    "#F0E442",  # yellow
    "#7F7F7F",  # grey (rank 7; 8 ranks is the course maximum)
)
EMPTY_COLOR = "#EEEEEE"
FAIL_COLOR = "#D55E00"
PASS_COLOR = "#009E73"


def rank_color(rank: int) -> str:
    """The colour of ``rank`` in every figure of the course."""
    return RANK_COLORS[rank % len(RANK_COLORS)]


def rank_legend_handles(world_size: int) -> list[Patch]:
    """Legend patches "rank 0", "rank 1", ... in the course colours."""
    return [Patch(facecolor=rank_color(r), edgecolor="black", label=f"rank {r}")
            for r in range(world_size)]


def bands(x: float, y: float, width: float, height: float, colors: Sequence[str]) -> list[Rectangle]:
    """The cell at (x, y) cut into one vertical band per colour, left to right: a value that
    sums several ranks' data shows each of them (a hatch means a partial sum in the course)."""
    n = len(colors)
    return [Rectangle((x + k / n * width, y), width / n, height, facecolor=color, edgecolor="none",
                      linewidth=0) for k, color in enumerate(colors)]
