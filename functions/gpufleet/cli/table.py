"""Plain-text tables and values for the human output of the everyday commands.

Everything printed for people goes through `printable`: a job's key, name, failure reason or log
line is data from submitters and jobs, and a control character in it (an ANSI escape sequence,
a carriage return, a bidi override) would reach the operator's terminal as a command. `--raw`
prints the text as it is; `--json` output is escaped by JSON itself.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any


def add_raw_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--raw",
        action="store_true",
        help="print control characters in names, reasons and output as they are (not escaped)",
    )


def printable(text: str, raw: bool = False) -> str:
    """`text` with every character Python would not print (control and format characters,
    separators other than the space) written as its escape, e.g. `\\x1b`; as it is with `raw`."""
    if raw or text.isprintable():
        return text
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


def cell(key: str, value: Any, raw: bool = False) -> str:
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
        return printable(", ".join(str(item) for item in value), raw) or "-"
    return printable(str(value), raw)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def render(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]], raw: bool = False
) -> str:
    """`rows` under `columns` ((key, header) pairs), numbers right-aligned."""
    texts = [[cell(key, row.get(key), raw) for key, _ in columns] for row in rows]
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


def render_fields(document: Mapping[str, Any], raw: bool = False) -> str:
    """A `key: value` line per field, keys aligned."""
    width = max((len(key) for key in document), default=0)
    return "\n".join(
        f"{printable(key, raw) + ':':<{width + 1}} {cell(key, v, raw)}"
        for key, v in document.items()
    )
