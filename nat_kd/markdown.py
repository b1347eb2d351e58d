"""Markdown output shared by the analysis report and the study results."""
from __future__ import annotations

import math


def cell(value, spec: str = "") -> str:
    """A value formatted with ``spec`` (as ``format``), or ``-`` where it is missing (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def table(header: list[str], rows: list[list]) -> str:
    """A Markdown table: the header, its rule, and one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
