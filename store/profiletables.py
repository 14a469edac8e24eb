"""The tables of the profile database (:mod:`store.profiledb`): what one source's numbers for
one model on one accelerator become (:class:`Table`, with its :class:`Source` and
:class:`Accelerator`), and how a table is read at a batch size (:func:`estimate`).

The rules of :func:`estimate`, the same for every column of a table:

- a measured batch size: that row (``exact``);
- between two measured sizes: linear interpolation between the two nearest (``interpolated``);
- beyond them: from the nearest measured end ``e`` along the local slope at ``e``
  (``extrapolated``), clipped at 0; persistent memory is held at its value at ``e``;
- the *local slope* at a batch ``x`` (:func:`local_slope`): the least-squares slope of the
  measured sizes within a factor of 2 of ``x`` (``x/2 .. 2x``); when fewer than two lie there,
  the line through the two measured sizes nearest ``x``; a table of one batch size scales
  proportionally (the line through the origin), as MLPerf Storage's and the OSRE emulator's
  single points are used.

A published fit (``discs-vldb``) is not a table of numbers: it is evaluated as it is
(:meth:`store.profiledb.ProfileDatabase.lookup`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from workloads.profile import SleepProfile

#: The columns of a table, in order. ``compute_s`` is forward + backward (+ optimizer) where the
#: parts are known; persistent memory does not grow with the batch (held beyond the table).
COLUMNS = (
    "compute_s",
    "compute_std_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "h2d_s",
    "peak_bytes",
    "persistent_bytes",
)
_HELD = np.array([c == "persistent_bytes" for c in COLUMNS])


def table_values(rows: Iterable[Mapping[str, Any]]) -> np.ndarray:
    """A table's values: one row per mapping of :data:`COLUMNS` names (NaN where absent)."""
    nan = float("nan")
    return np.array(
        [[nan if r.get(c) is None else r[c] for c in COLUMNS] for r in rows], dtype=float
    ).reshape(-1, len(COLUMNS))


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """A card: its short name (``a100``), full name, the names the sources use, its memory."""

    key: str
    name: str
    names: tuple[str, ...] = ()
    capacity_bytes: int | None = None
    capacity_source: str = ""
    interconnect: str | None = None

    def matches(self, text: str) -> bool:
        wanted = _norm(text)
        return any(_norm(n) == wanted for n in (self.key, self.name, *self.names))


@dataclasses.dataclass(frozen=True)
class Source:
    """One source of numbers: its id, a title, a short citation (``cite``, repeated in each
    profile made from it) and the full citation (``text``)."""

    id: str
    title: str
    kind: str
    text: str
    cite: str


@dataclasses.dataclass(frozen=True, eq=False)
class Table:
    """One source's numbers for one model on one accelerator.

    ``batch``: the measured batch sizes, ascending; ``values``: one row per batch size, one
    column per :data:`COLUMNS` entry (NaN where the source has no such number). ``fit``: a
    published fit used instead (``batch`` then holds the range it was fitted on).
    ``measured_max``: GPEmu's largest measured batch where its table continues past it by
    regression (see :func:`store.gpemu.linear_tail_start`), else None.
    """

    source: Source
    accelerator: str
    card: str
    model: str
    batch: np.ndarray
    values: np.ndarray
    model_transfer_s: float | None = None
    measured_max: int | None = None
    fit: SleepProfile | None = None
    origin: str = ""
    host: Mapping[str, Any] | None = None  # a measured table's host record

    @property
    def batch_range(self) -> tuple[int, int]:
        return int(self.batch[0]), int(self.batch[-1])


#: What finds an accelerator of the database being read by a name its sources use (a
#: UserError when none is declared): what the readers of a source's tables are given.
Cards = Callable[[str], Accelerator]


def _slope_rows(sizes: np.ndarray, x: float) -> np.ndarray:
    """Which measured sizes give the local slope at batch ``x``: those within a factor of 2
    of ``x``, else the two nearest ``x`` (a table of at least two sizes)."""
    mask = (sizes >= x / 2) & (sizes <= 2 * x)
    if mask.sum() < 2:
        mask = np.zeros(len(sizes), dtype=bool)
        mask[np.argsort(np.abs(sizes - x), kind="stable")[:2]] = True
    return mask


def local_slope(sizes: np.ndarray, values: np.ndarray, x: float) -> np.ndarray:
    """d(values)/d(batch) near batch ``x`` for every column (the module doc's rule): the
    least-squares slope over :func:`_slope_rows`; proportional for a table of one size."""
    if len(sizes) == 1:
        return values[0] / sizes[0]
    mask = _slope_rows(sizes, x)
    xs = sizes[mask].astype(float)
    ys = values[mask]
    xc = xs - xs.mean()
    return (xc @ (ys - ys.mean(axis=0))) / (xc @ xc)


def _window(sizes: np.ndarray, x: float) -> tuple[int, int]:
    """The smallest and largest measured size the local slope at ``x`` uses."""
    used = sizes if len(sizes) == 1 else sizes[_slope_rows(sizes, x)]
    return int(used.min()), int(used.max())


def estimate(
    sizes: np.ndarray, values: np.ndarray, batch: int
) -> tuple[np.ndarray, np.ndarray, str, tuple[int, ...]]:
    """(values at ``batch``, local slopes there, method, rows used) from a table's measured
    ``sizes`` (ascending) and ``values`` (one row per size, one column per quantity)."""
    i = int(np.searchsorted(sizes, batch))
    if i < len(sizes) and sizes[i] == batch:
        return values[i], local_slope(sizes, values, batch), "exact", (batch,)
    if 0 < i < len(sizes):
        lo, hi = int(sizes[i - 1]), int(sizes[i])
        w = (batch - lo) / (hi - lo)
        value = (1 - w) * values[i - 1] + w * values[i]
        return value, local_slope(sizes, values, batch), "interpolated", (lo, hi)
    end = 0 if i == 0 else len(sizes) - 1
    e = int(sizes[end])
    slope = local_slope(sizes, values, e)
    value = np.where(_HELD, values[end], np.maximum(0.0, values[end] + slope * (batch - e)))
    return value, np.where(_HELD, 0.0, slope), "extrapolated", (e, *_window(sizes, e))


def _norm(text: str) -> str:
    return "".join(c for c in text.casefold() if c.isalnum())
