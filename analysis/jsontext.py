"""Vectorised JSON text: columns of numbers and strings turned into lines of JSON with numpy.

Every line of a chunk has the same width: a field (one JSON value, or a constant) is a byte
matrix ``width x rows`` holding each row's text right-aligned after spaces, which JSON allows
before any value. Fields are stacked in one column-major matrix (each row of it a contiguous
copy) and one transposing copy turns it into the chunk's lines, back to back (:func:`join`). A
boolean gather that dropped the padding measured ten times slower; the padding costs about a
fifth of the size. Integers become digits by array arithmetic, strings are JSON-escaped once per
distinct value (:class:`Texts`), floats get the shortest text that reads back as the same double.

Example::

    text = join([const('{"ts":'), *micros(ts_ns), const("}\\n")], len(ts_ns))
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

SPACE = ord(" ")


@dataclasses.dataclass(frozen=True)
class Field:
    """One JSON value per row (or one constant): text right-aligned in a byte matrix."""

    text: np.ndarray  # uint8, (width, rows), or (width, 1) for a constant

    @property
    def width(self) -> int:
        return self.text.shape[0]


def const(text: str) -> Field:
    """The same text on every row (keys, punctuation)."""
    return Field(np.frombuffer(text.encode(), dtype=np.uint8)[:, None])


_POWERS = 10 ** np.arange(20, dtype=np.uint64)  # 10**19 is the largest that fits in uint64


def _digits(magnitude: np.ndarray, negative: np.ndarray | None = None) -> Field:
    """Decimal text of ``magnitude`` (uint64), right-aligned, with ``-`` where ``negative``."""
    n = len(magnitude)
    if n == 0:
        return Field(np.full((1, 0), SPACE, dtype=np.uint8))
    count = 1 + np.searchsorted(_POWERS[1:], magnitude, side="right")
    length = count if negative is None else count + negative
    width = int(length.max())
    text = np.full((width, n), SPACE, dtype=np.uint8)
    # 32-bit division is several times faster, and most values (pids, sizes) fit.
    kind = np.uint32 if int(magnitude.max()) < 2**32 else np.uint64
    rest = magnitude.astype(kind)
    ten = kind(10)
    for place in range(int(count.max())):  # units first, in the last row
        digit = (rest % ten).astype(np.uint8) + np.uint8(48)
        np.copyto(text[width - 1 - place], digit, where=place < count)
        rest //= ten
    if negative is not None and negative.any():
        cols = np.flatnonzero(negative)
        text[width - 1 - count[cols], cols] = ord("-")
    return Field(text)


def ints(values: np.ndarray) -> Field:
    """Integers as JSON numbers."""
    values = np.asarray(values, dtype=np.int64)
    # abs(INT64_MIN) wraps to itself, and its uint64 view is then the right magnitude, 2**63.
    return _digits(np.abs(values).astype(np.uint64), values < 0)


def micros(ns: np.ndarray) -> list[Field]:
    """Nanoseconds as microseconds with three decimals, exact: ``-1500`` -> ``-1.500``."""
    ns = np.asarray(ns, dtype=np.int64)
    magnitude = np.abs(ns).astype(np.uint64)
    whole = _digits(magnitude // np.uint64(1000), ns < 0)
    frac = magnitude % np.uint64(1000)
    text = np.empty((4, len(ns)), dtype=np.uint8)
    text[0] = ord(".")
    text[1] = 48 + (frac // np.uint64(100)).astype(np.uint8)
    text[2] = 48 + (frac // np.uint64(10) % np.uint64(10)).astype(np.uint8)
    text[3] = 48 + (frac % np.uint64(10)).astype(np.uint8)
    return [whole, Field(text)]


class Texts:
    """JSON texts of a small set of values, indexed by code (-1: ``null``)."""

    def __init__(self, texts: Sequence[str]) -> None:
        encoded = [t.encode() for t in texts] + [b"null"]
        self.width = max(len(t) for t in encoded)
        # Column per value: a field is then this table's columns taken by code.
        self.table = np.full((self.width, len(encoded)), SPACE, dtype=np.uint8)
        for col, text in enumerate(encoded):  # once per distinct value, not per event
            # Right-aligned like numbers: all padding then sits between a key's colon and its
            # value, where pretty-printed JSON has its space.
            self.table[self.width - len(text) :, col] = np.frombuffer(text, dtype=np.uint8)

    @classmethod
    def strings(cls, values: Sequence[Any]) -> Texts:
        """JSON string literals of ``values`` (exact escaping by :func:`json.dumps`)."""
        return cls([json.dumps(str(v)) for v in values])

    def field(self, codes: np.ndarray) -> Field:
        codes = np.where(codes < 0, self.table.shape[1] - 1, codes)
        return Field(np.take(self.table, codes, axis=1))


def texts_of(values: pd.Series) -> tuple[np.ndarray, Texts]:
    """Codes (-1 for missing) and the JSON string texts of the distinct values."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    return np.asarray(codes, dtype=np.int64), Texts.strings(list(uniques))


def floats(values: np.ndarray) -> Field:
    """Finite floats as JSON numbers: the shortest text that reads back as the same double."""
    strings = pc.cast(pa.array(np.asarray(values, dtype=np.float64)), pa.string())
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int32)[: len(strings) + 1]
    data = np.frombuffer(strings.buffers()[2], dtype=np.uint8)
    lengths = np.diff(offsets)
    width = int(lengths.max()) if len(lengths) else 1
    pad = width - lengths  # right-aligned, as numbers
    inside = np.arange(width)[:, None] >= pad[None, :]
    positions = offsets[:-1][None, :] + np.arange(width)[:, None] - pad[None, :]
    positions = np.clip(positions, 0, len(data) - 1)
    return Field(np.where(inside, data[positions], SPACE).astype(np.uint8))


def join(fields: Sequence[Field], rows: int) -> bytes:
    """The rows' lines: the fields stacked, then transposed to row-major bytes."""
    text = np.empty((sum(f.width for f in fields), rows), dtype=np.uint8)
    at = 0
    for field in fields:  # a few dozen fields, each a contiguous block copy
        text[at : at + field.width] = field.text
        at += field.width
    return text.T.tobytes()


def row_bytes(fields: Sequence[Field]) -> int:
    """The length of a line made of ``fields``."""
    return sum(f.width for f in fields)
