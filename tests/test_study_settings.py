"""A study's settings declared once (experiments/study.py): each kind of value accepts what it
says and refuses the rest in one line naming the file and the key; unknown and missing keys
are named; defaults are what the spec takes, tables never shared."""

from __future__ import annotations

import math
from typing import Any

import pytest

from core.errors import UserError
from experiments.study import KINDS, REQUIRED, Setting, validate

WHERE = "s.toml: [study]"


@pytest.mark.parametrize(
    ("setting", "good", "bad"),
    [
        (Setting("n", "whole", 1, low=1, high=4), [(1, 1), (4, 4)], [0, 5, 2.0, True, "2"]),
        (Setting("t", "positive", unit="seconds"), [(2, 2.0), (0.5, 0.5)], [0, -1, True, "1"]),
        (Setting("c", "limit"), [(0, None), ("", None), (1.5, 1.5)], [-1, "x"]),
        (Setting("m", "size"), [("2GiB", "2GiB"), (0, None), (4096, "4096")], ["lots", 1.5]),
        (Setting("a", "name"), [("v100", "v100")], ["", 3]),
        (Setting("v", "choice", "x", choices=("x", "y")), [("y", "y")], ["z", None]),
        (Setting("f", "flag", True), [(False, False)], [1, "yes"]),
        (Setting("o", "table", {}), [({"a": 1}, {"a": 1})], [[1], "a=1"]),
        (
            Setting("g", "wholes", (1,), low=1, high=64),
            [([4, 2], (2, 4))],
            [[], [2, 2], [0], [65], [1.0]],
        ),
        (
            Setting("r", "numbers", (1.0,), low=0, high=math.inf),
            [([1, 0.5], (1.0, 0.5))],
            [[], [0], [-1], "1"],
        ),
        (Setting("q", "fractions", ()), [([], ()), ([0, 1], (0.0, 1.0))], [[1.5], [-0.1]]),
        (
            Setting("k", "choices", ("a",), choices=("a", "b")),
            [(["b", "a"], ("b", "a"))],
            [[], ["a", "a"], ["c"]],
        ),
        (Setting("w", "texts", ("x",)), [(["40mbit"], ("40mbit",))], [[], "40mbit"]),
    ],
    ids=lambda v: v.kind if isinstance(v, Setting) else None,
)
def test_each_kind_takes_what_it_says_and_names_the_key_otherwise(
    setting: Setting, good: list[tuple[Any, Any]], bad: list[Any]
) -> None:
    for value, taken in good:
        assert validate((setting,), {setting.name: value}, WHERE) == {setting.name: taken}
    for value in bad:
        with pytest.raises(UserError) as caught:
            validate((setting,), {setting.name: value}, WHERE)
        message = str(caught.value)
        assert message == f"{WHERE}: {setting.name} must be {setting.rule}, got {value!r}"
        assert "\n" not in message


def test_every_kind_is_tested() -> None:
    tested = {"whole", "positive", "limit", "size", "name", "choice", "flag", "table", "wholes"}
    tested |= {"numbers", "fractions", "choices", "texts"}
    assert tested == set(KINDS)


def test_unknown_and_missing_keys_and_defaults() -> None:
    settings = (
        Setting("dataset", "name", REQUIRED),
        Setting("epochs", "whole", 2, low=1, high=9),
        Setting("options", "table", {}),
    )
    with pytest.raises(
        UserError,
        match=r"^s.toml: \[study\]: unknown key 'colour'; known keys: "
        "kind, dataset, epochs, options$",
    ):
        validate(settings, {"dataset": "d", "colour": 1}, WHERE)
    with pytest.raises(UserError, match=r"^s.toml: \[study\] needs dataset$"):
        validate(settings, {}, WHERE)
    first = validate(settings, {"dataset": "d"}, WHERE)
    assert first == {"dataset": "d", "epochs": 2, "options": {}}
    first["options"]["x"] = 1  # a spec's table is its own
    assert validate(settings, {"dataset": "d"}, WHERE)["options"] == {}


def test_the_rule_in_words() -> None:
    assert Setting("v", "choice", choices=("a", "b")).rule == "a or b"
    assert Setting("v", "choice", choices=("a", "b", "c", "d")).rule == "one of a, b, c, d"
    assert (
        Setting("s", "whole", low=0, high=2**31 - 1).rule == "a whole number from 0 to 2147483647"
    )
    assert Setting("t", "positive", unit="seconds", why="a run's").rule == (
        "a positive number of seconds (a run's)"
    )
    with pytest.raises(ValueError, match="unknown kind"):
        Setting("x", "colour")
