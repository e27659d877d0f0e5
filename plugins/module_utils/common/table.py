# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Markdown tables padded so that they also read well in a terminal."""

from __future__ import annotations


def markdown_table(headers: list[str], rows: list[list], numeric: tuple[int, ...] = ()) -> str:
    """A Markdown table; columns whose index is in `numeric` are right-aligned. None shows as '-'."""
    text = [[str(header) for header in headers]] + [
        ["-" if cell is None else str(cell) for cell in row] for row in rows
    ]
    widths = [max(3, *(len(row[column]) for row in text)) for column in range(len(headers))]

    def line(cells):
        padded = (
            cell.rjust(width) if column in numeric else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join("-" * (width + 1) + (":" if column in numeric else "-") for column, width in enumerate(widths))
        + "|"
    )
    return "\n".join([line(text[0]), rule, *(line(row) for row in text[1:])]) + "\n"


def records_table(records: list[dict], columns: list) -> str:
    """A table of dicts: each column is a key, or a [header, key] pair. Numbers are right-aligned."""
    pairs = [(column, column) if isinstance(column, str) else tuple(column) for column in columns]
    rows = [[record.get(key) for _header, key in pairs] for record in records]
    numeric = tuple(
        index
        for index, (_header, key) in enumerate(pairs)
        if any(
            isinstance(record.get(key), (int, float)) and not isinstance(record.get(key), bool) for record in records
        )
    )
    return markdown_table([header for header, _key in pairs], rows, numeric)
