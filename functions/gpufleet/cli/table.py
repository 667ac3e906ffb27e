"""Plain-text tables and values for the human output of the everyday commands."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def cell(key: str, value: Any) -> str:
    """One value as people read it; the key says what kind of number it is."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if key.endswith("_usd"):
            return f"{value:.6f}"
        if key.endswith("_seconds"):
            return f"{value:.1f}"
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ", ".join(str(item) for item in value) or "-"
    return str(value)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def render(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """`rows` under `columns` ((key, header) pairs), numbers right-aligned."""
    texts = [[cell(key, row.get(key)) for key, _ in columns] for row in rows]
    widths = [
        max([len(header), *(len(line[i]) for line in texts)])
        for i, (_, header) in enumerate(columns)
    ]
    right = [any(_numeric(row.get(key)) for row in rows) for key, _ in columns]

    def line(values: Sequence[str]) -> str:
        parts = [
            value.rjust(width) if align else value.ljust(width)
            for value, width, align in zip(values, widths, right, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line([header for _, header in columns]), *(line(t) for t in texts)])


def render_fields(document: Mapping[str, Any]) -> str:
    """A `key: value` line per field, keys aligned."""
    width = max((len(key) for key in document), default=0)
    return "\n".join(f"{key + ':':<{width + 1}} {cell(key, v)}" for key, v in document.items())
