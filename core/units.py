"""Parsing and formatting of byte sizes."""

from __future__ import annotations

import re

from core.errors import UserError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
#: How sizes are read, for the help of every option that takes one.
SIZE_HELP = (
    "Decimal units (kB, MB, GB) are powers of 1000; binary units (KiB, MiB, GiB) and "
    "docker's single letters (k, m, g) powers of 1024; a bare number is bytes."
)
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse a size such as ``500MB``, ``2GiB``, ``1.5e9`` or ``2g`` into bytes.

    Decimal units (kB, MB, GB, TB) are powers of 1000; binary units (KiB, MiB, GiB, TiB) and
    the docker-style single letters (k, m, g, t) are powers of 1024.
    """
    if isinstance(text, int):
        if text < 0:
            raise UserError(f"size {text} is negative: give a positive size such as 500MB")
        return text
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise UserError(
            f"cannot parse size {text!r}: use a number with an optional unit, "
            "e.g. 500MB, 2GiB, 1.5e9 (units: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise UserError(f"size {text!r} must be at least one byte")
    return value


def format_size(n: float) -> str:
    """Format a byte count with a binary unit, e.g. ``1.5 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
