"""A small RGB raster and its PNG encoding, standard library only (zlib): the line charts of
`gpufleet report` need nothing more, and the CLI gains no plotting dependency.

PNG: signature, IHDR (8-bit truecolor), one IDAT of filter-0 scanlines, IEND; each chunk with
its CRC-32 (the W3C PNG specification, sections 5 and 11).
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Sequence

Color = tuple[int, int, int]

WHITE: Color = (255, 255, 255)
GRID: Color = (225, 225, 225)
FRAME: Color = (120, 120, 120)
# Distinct series colours (Tableau 10), cycled.
PALETTE: tuple[Color, ...] = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
)
_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Canvas:
    def __init__(self, width: int, height: int, background: Color = WHITE) -> None:
        self.width = width
        self.height = height
        self._rows = [bytearray(bytes(background) * width) for _ in range(height)]

    def dot(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            self._rows[y][3 * x : 3 * x + 3] = bytes(color)

    def fill(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """The rectangle from (x0, y0) to (x1, y1), both included."""
        for y in range(max(0, min(y0, y1)), min(self.height, max(y0, y1) + 1)):
            for x in range(max(0, min(x0, x1)), min(self.width, max(x0, x1) + 1)):
                self._rows[y][3 * x : 3 * x + 3] = bytes(color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Bresenham's line, both ends included."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        error = dx + dy
        while True:
            self.dot(x0, y0, color)
            if x0 == x1 and y0 == y1:
                return
            doubled = 2 * error
            if doubled >= dy:
                error += dy
                x0 += sx
            if doubled <= dx:
                error += dx
                y0 += sy

    def polyline(self, points: Sequence[tuple[int, int]], color: Color) -> None:
        for (x0, y0), (x1, y1) in itertools.pairwise(points):
            self.line(x0, y0, x1, y1, color)
        if len(points) == 1:
            self.dot(*points[0], color)

    def frame(self, x0: int, y0: int, x1: int, y1: int, color: Color = FRAME) -> None:
        for a, b, c, d in ((x0, y0, x1, y0), (x1, y0, x1, y1), (x1, y1, x0, y1), (x0, y1, x0, y0)):
            self.line(a, b, c, d, color)

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(row) for row in self._rows)
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            _SIGNATURE
            + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw, 9))
            + _chunk(b"IEND", b"")
        )


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
