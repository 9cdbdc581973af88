"""A figure an explorer keeps across redraws, drawn in two layers, so that a slider move does not
draw again the text that did not change (tick labels, legends, titles: ~1 ms each on a slow CPU):

* the static layer, ``build(figure, data)``: axes, limits, ticks, labels, legend, layout diagrams;
  everything that depends only on ``key`` (the shape of the picture: the world size, the names on
  the axis). It is built and rendered once per key and kept as pixels;
* the values, ``update(figure, ctx, data) -> artists``: the artists that show this run's numbers
  and verdict (points, red frames, the title). On every redraw the previous ones are removed (a
  static artist the update changed, such as a title made empty by ``build``, stays), the static
  pixels restored and only these drawn over them, then the PNG is encoded.

The same two functions make the ordinary figure the notebooks show (``LiveFigure.figure``), so
the explorer and the notebook draw one picture with one code path. Figures made here never go
through pyplot: the inline backend does not show them twice and does not keep them.
"""
from __future__ import annotations

import struct
import zlib
from collections import OrderedDict
from typing import Any, Callable, Hashable

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["LiveFigure", "Png", "png_of", "CACHE_BYTES"]

# Static layers kept over all live figures of a kernel, least recently used dropped first: ~6 MB
# for the largest figure (its pixels and the canvas it is drawn on), so 40 MB keeps every world
# size of two explorers warm while staying small against Binder's 2 GB.
CACHE_BYTES = 40 * 2 ** 20
_CACHE: OrderedDict = OrderedDict()   # (id of the LiveFigure, key) -> _Layer


class Png(bytes):
    """PNG bytes an explorer shows in an image widget (``widgets.frame`` knows the type)."""


def png_of(pixels: np.ndarray) -> Png:
    """``[height, width, 4]`` RGBA pixels (a canvas' ``buffer_rgba()``, white background) as an
    RGB PNG. Written here rather than by PIL: no per-row filter search and zlib level 1, ~40 %
    less time for ~5 % more bytes on these flat figures (the default level costs ~10 ms more)."""
    height, width, _ = pixels.shape
    rows = np.empty((height, 3 * width + 1), np.uint8)
    rows[:, 0] = 0                                    # filter type "None" on every row
    # RGBA -> RGB copied as [h, w, 3] into [h, w, 3]: ~40 % faster than through a [h, 3 w] view
    np.copyto(rows[:, 1:].reshape(height, width, 3), pixels[:, :, :3])

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)   # 8-bit RGB
    return Png(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
               + chunk(b"IDAT", zlib.compress(rows.tobytes(), 1)) + chunk(b"IEND", b""))


class _Layer:
    """One key's figure: its canvas, what ``build`` returned, the static pixels, the value
    artists drawn last (removed before the next ones are added)."""

    def __init__(self, figure: Figure, ctx: Any) -> None:
        self.figure, self.ctx, self.drawn = figure, ctx, []
        self.shown: tuple[tuple[int, int], Png] | None = None   # (checksums, PNG) last encoded
        self.canvas = FigureCanvasAgg(figure)
        self.canvas.draw()     # the one full draw, with no value artist in the figure yet
        self.background = self.canvas.copy_from_bbox(figure.bbox)
        # the static artists an update may change (a title's text) but never removes
        self.static = {id(artist) for artist in figure.findobj()}
        width, height = self.canvas.get_width_height(physical=True)
        self.nbytes = 2 * 4 * width * height


class LiveFigure:
    """``build(new_figure, data) -> ctx`` draws the static layer on ``new_figure(figsize)``;
    ``update(figure, ctx, data) -> list[Artist]`` adds the value artists; ``key(data)`` names the
    static layer (two data with the same key must give the same static layer)."""

    def __init__(self, key: Callable[[Any], Hashable],
                 build: Callable[[Callable[..., Figure], Any], Any],
                 update: Callable[[Figure, Any, Any], list[Artist]]) -> None:
        self.key, self.build, self.update = key, build, update

    def figure(self, data: Any) -> Figure:
        """The whole figure as an ordinary pyplot figure (notebooks, tests, savefig)."""
        made: list[Figure] = []

        def new_figure(figsize: tuple[float, float]) -> Figure:
            made.append(plt.figure(figsize=figsize))
            return made[-1]

        ctx = self.build(new_figure, data)
        self.update(made[0], ctx, data)
        return made[0]

    def prepare(self, data: Any) -> None:
        """Build and render the static layer of ``data``'s key now, if it is not kept already,
        and keep it: a later ``png`` of data with that key draws only the value artists. For an
        explorer that can make its first figure's static layer while its ranks start."""
        self._layer(data)

    def _layer(self, data: Any) -> tuple[tuple, _Layer]:
        """``(cache key, the kept static layer of data's key)``, built now if not kept; it becomes
        the most recently used."""
        cache_key = (id(self), self.key(data))
        layer = _CACHE.pop(cache_key, None)
        if layer is None:
            made: list[Figure] = []
            ctx = self.build(lambda figsize: made.append(
                Figure(figsize=figsize, facecolor="white")) or made[-1], data)   # opaque: RGB PNG
            layer = _Layer(made[0], ctx)
        _CACHE[cache_key] = layer
        _evict()
        return cache_key, layer

    def png(self, data: Any) -> Png:
        """The figure for ``data`` as PNG, drawing only the value artists when the static layer
        of its key is already rendered."""
        cache_key, layer = self._layer(data)
        for artist in layer.drawn:
            if id(artist) not in layer.static:
                artist.remove()
        layer.drawn = []
        try:
            layer.drawn = self.update(layer.figure, layer.ctx, data)
        except Exception:   # half-added artists: this layer is not the static layer any more
            del _CACHE[cache_key]
            raise
        layer.canvas.restore_region(layer.background)
        renderer = layer.canvas.get_renderer()
        for artist in sorted(layer.drawn, key=lambda a: a.get_zorder()):
            artist.draw(renderer)
        # The same pixels as last time on this layer (the same setting moved back to): the
        # artists were drawn, only the PNG encoding is skipped. Two checksums, 64 bits.
        pixels = np.asarray(layer.canvas.buffer_rgba())
        sums = (zlib.crc32(pixels), zlib.adler32(pixels))
        if layer.shown is None or layer.shown[0] != sums:
            layer.shown = (sums, png_of(pixels))
        return layer.shown[1]


def _evict() -> None:
    """Drop the least recently used static layers until the cache fits ``CACHE_BYTES`` (the one
    just used always stays)."""
    while len(_CACHE) > 1 and sum(layer.nbytes for layer in _CACHE.values()) > CACHE_BYTES:
        _CACHE.popitem(last=False)
