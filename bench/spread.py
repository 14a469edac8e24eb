"""How every benchmark prints a figure measured over rounds: its median and its spread."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def median_spread(values: Sequence[float], fmt: str = ".3f") -> str:
    """``median (spread min .. max)`` of ``values``, each number in format ``fmt``."""
    return f"{statistics.median(values):{fmt}} (spread {min(values):{fmt}} .. {max(values):{fmt}})"
