"""A study's settings, declared once: each key of its ``[study]`` table with its type, range or
choices and default, validated in one place, every error one line naming the file and the key.

A kind lists its :class:`Setting` s; :func:`validate` refuses unknown keys, fills the defaults
and checks each value, and returns the table as the kind's spec takes it (``Spec(**values)``);
what a kind checks beyond one key at a time (a batch size every group size divides, a profile
the database has) it checks after, on the values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from core.errors import UserError
from core.units import parse_size

#: Kinds of value: what ``Setting.kind`` may be, and what each accepts.
KINDS = {
    "whole": "a whole number from LOW to HIGH",
    "positive": "a positive number",
    "limit": "a positive number (0: none)",
    "size": "a size such as 2GiB",
    "name": "a name",
    "choice": "one of CHOICES",
    "flag": "true or false",
    "table": "a table",
    "wholes": "a non-empty list of distinct whole numbers from LOW to HIGH",
    "numbers": "a non-empty list of numbers above LOW up to HIGH",
    "fractions": "a list of numbers from 0 to 1",
    "choices": "a non-empty list of distinct ones of CHOICES",
    "texts": "a non-empty list of texts",
}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One key of a ``[study]`` table. ``kind`` is one of :data:`KINDS`; ``low`` and ``high``
    bound numbers, ``choices`` the names; ``default`` is what an absent key takes, and a key
    whose default is None may be left out, one whose default is :data:`REQUIRED` may not. ``unit``
    follows "a positive number" (``seconds``); ``why`` follows the rule in an error; ``says``
    replaces the rule's words."""

    name: str
    kind: str
    default: Any = None
    low: float = 0
    high: float = 0
    choices: tuple[str, ...] = ()
    unit: str = ""
    why: str = ""
    says: str = ""  # the rule in words, where the kind's own would say less

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"setting {self.name}: unknown kind {self.kind!r}")

    @property
    def rule(self) -> str:
        """What the value must be, in words."""
        if self.says:
            return self.says
        text = KINDS[self.kind]
        text = text.replace("LOW", _number_text(self.low)).replace("HIGH", _number_text(self.high))
        if self.kind == "choice" and 1 < len(self.choices) <= 3:
            text = f"{', '.join(self.choices[:-1])} or {self.choices[-1]}"
        text = text.replace("CHOICES", ", ".join(self.choices))
        if self.unit:
            text += f" of {self.unit}"
        return text + (f" ({self.why})" if self.why else "")

    def check(self, value: Any, where: str) -> Any:
        """``value`` as the spec takes it (lists as tuples, numbers of kind ``positive`` and
        ``numbers`` as floats); a one-line UserError naming the key otherwise."""
        if value is None and self.default is None:
            return None
        checked = _CHECKS[self.kind](self, value)
        if checked is _BAD:
            raise UserError(f"{where}: {self.name} must be {self.rule}, got {value!r}")
        return checked


_BAD = object()
#: The default of a key the table must have.
REQUIRED = object()


def _number_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(s: Setting, v: Any) -> Any:
    return v if _is_whole(v) and s.low <= v <= s.high else _BAD


def _positive(s: Setting, v: Any) -> Any:
    return float(v) if _is_number(v) and v > 0 else _BAD


def _limit(s: Setting, v: Any) -> Any:
    return None if v in ("", 0) else _positive(s, v)


def _size(s: Setting, v: Any) -> Any:
    if v in ("", 0):
        return None
    if not isinstance(v, str | int) or isinstance(v, bool):
        return _BAD
    try:
        parse_size(v)
    except UserError:
        return _BAD
    return str(v)


def _name(s: Setting, v: Any) -> Any:
    return v if isinstance(v, str) and v else _BAD


def _choice(s: Setting, v: Any) -> Any:
    return v if v in s.choices else _BAD


def _flag(s: Setting, v: Any) -> Any:
    return v if isinstance(v, bool) else _BAD


def _table(s: Setting, v: Any) -> Any:
    return dict(v) if isinstance(v, dict) else _BAD


def _list(v: Any) -> list[Any] | None:
    return list(v) if isinstance(v, list | tuple) and v else None


def _wholes(s: Setting, v: Any) -> Any:
    items = _list(v)
    if items is None or len(set(items)) != len(items):
        return _BAD
    if not all(_is_whole(x) and s.low <= x <= s.high for x in items):
        return _BAD
    return tuple(sorted(items))


def _numbers(s: Setting, v: Any) -> Any:
    items = _list(v)
    if items is None or not all(_is_number(x) and s.low < x <= s.high for x in items):
        return _BAD
    return tuple(float(x) for x in items)


def _fractions(s: Setting, v: Any) -> Any:
    if not isinstance(v, list | tuple) or not all(_is_number(x) and 0 <= x <= 1 for x in v):
        return _BAD
    return tuple(float(x) for x in v)


def _choices(s: Setting, v: Any) -> Any:
    items = _list(v)
    if items is None or len(set(items)) != len(items) or any(x not in s.choices for x in items):
        return _BAD
    return tuple(items)


def _texts(s: Setting, v: Any) -> Any:
    items = _list(v)
    return tuple(str(x) for x in items) if items is not None else _BAD


_CHECKS = {
    "whole": _whole,
    "positive": _positive,
    "limit": _limit,
    "size": _size,
    "name": _name,
    "choice": _choice,
    "flag": _flag,
    "table": _table,
    "wholes": _wholes,
    "numbers": _numbers,
    "fractions": _fractions,
    "choices": _choices,
    "texts": _texts,
}


def validate(settings: Sequence[Setting], table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The ``[study]`` table (without ``kind``) checked against ``settings``: every key known,
    every value of its kind; absent keys take their defaults (written as the spec takes them). One-line UserErrors naming
    ``where`` (the file and table) and the key."""
    names = [s.name for s in settings]
    unknown = sorted(set(table) - set(names))
    if unknown:
        raise UserError(
            f"{where}: unknown key {unknown[0]!r}; known keys: kind, {', '.join(names)}"
        )
    values = {}
    for s in settings:
        if s.name in table:
            values[s.name] = s.check(table[s.name], where)
        elif s.default is REQUIRED:
            raise UserError(f"{where} needs {s.name}")
        else:
            default = s.default  # as the spec takes it; a table copied, never shared
            values[s.name] = dict(default) if isinstance(default, dict) else default
    return values


__all__ = ["KINDS", "REQUIRED", "Setting", "validate"]
