"""core/versioned.py: a file's stamp, its migrations from every older version, and the one line
a file it cannot read gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core import __version__, versioned
from core.errors import UserError


def _rename_created(body: dict) -> dict:
    body["created_at"] = body.pop("created")
    return body


def _add_unit(body: dict) -> dict:
    return {**body, "unit": "s"}


LAYOUT = versioned.Layout(
    "test results", 3, {1: _rename_created, 2: _add_unit}, remedy="run it again", kind="test"
)


def test_a_written_file_reads_back_stamped(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    versioned.write_json(path, LAYOUT, {"value": 1.5})
    raw = json.loads(path.read_text())
    assert list(raw)[:4] == ["schema_version", "twintrace_version", "created_at", "kind"]
    assert raw["twintrace_version"] == __version__ and raw["kind"] == "test"
    assert versioned.load_json(path, LAYOUT) == raw
    # rewritten, a file keeps the time it was first made
    versioned.write_json(path, LAYOUT, raw)
    assert json.loads(path.read_text())["created_at"] == raw["created_at"]


def test_every_older_version_is_brought_up_to_date(tmp_path: Path) -> None:
    assert LAYOUT.readable() == (1, 2, 3)
    v1 = {"schema_version": 1, "kind": "test", "created": "then", "value": 2}
    data = versioned.upgrade(LAYOUT, v1, "r.json")
    assert data == {
        "schema_version": 3,
        "kind": "test",
        "created_at": "then",
        "value": 2,
        "unit": "s",
    }
    assert v1["created"] == "then"  # the body read is not changed
    v2 = {"schema_version": 2, "kind": "test", "created_at": "then"}
    assert versioned.upgrade(LAYOUT, v2, "r.json")["unit"] == "s"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"schema_version": 9, "kind": "test", "twintrace_version": "9.0"},
         r"r\.json: test results of schema_version 9, but twintrace .* reads schema_version "
         r"1 or 2 or 3: use twintrace 9\.0, which made it; run it again"),
        ({"schema_version": True, "kind": "test"}, "schema_version True"),
        ({"kind": "test"}, "schema_version None"),
        ({"schema_version": 3, "kind": "other"}, r"r\.json is not a test results .*'other'"),
        ([1, 2], r"r\.json is damaged \(not a test results, not a JSON object\): run it again"),
    ],
)  # fmt: skip
def test_a_file_it_cannot_read_is_one_line_naming_it(body: object, message: str) -> None:
    with pytest.raises(UserError, match=message) as info:
        versioned.upgrade(LAYOUT, body, "r.json")
    assert "\n" not in str(info.value)


def test_missing_and_damaged_files_say_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    with pytest.raises(UserError, match=r"r\.json does not exist: run the study first"):
        versioned.load_json(path, LAYOUT, missing="run the study first")
    path.write_text('{"schema_version": 3, "ki')
    with pytest.raises(UserError, match=r"r\.json is damaged .*cut short or edited: run it again"):
        versioned.load_json(path, LAYOUT)


def test_a_layout_may_take_files_that_predate_the_field() -> None:
    layout = versioned.Layout("profile", 1, unversioned=1)
    assert versioned.upgrade(layout, {"a": 1}, "p") == {"a": 1, "schema_version": 1}
