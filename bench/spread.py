"""How every benchmark runs its rounds and prints a figure measured over them: its median and
its spread."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def median_spread(values: Sequence[float], fmt: str = ".3f") -> str:
    """``median (spread min .. max)`` of ``values``, each number in format ``fmt``."""
    return f"{statistics.median(values):{fmt}} (spread {min(values):{fmt}} .. {max(values):{fmt}})"


def warm_rounds(rounds: int, measure: Callable[[], T], show: Callable[[T], str]) -> list[T]:
    """``measure()`` once to warm up (not kept), then ``rounds`` times, each printed as
    ``round N: show(result)`` as it comes; the kept results."""
    measure()
    kept = []
    for i in range(rounds):
        kept.append(measure())
        print(f"round {i + 1}: {show(kept[-1])}", flush=True)
    return kept
