"""Versioned files: every file the project writes and reads again says what it is (its layout's
version, the twintrace that wrote it, when), and a reader brings an older one up to date or says
in one line why it cannot.

A :class:`Layout` is one kind of file: its name in messages, its current version, and a
migration from each older version it ever had (``{N: update_from_N}``, each turning a body of
version N into one of N + 1, as asv's results do with ``update_to_N``). Writing stamps the body
(:func:`stamp`, :func:`write_json`); reading checks it and runs the chain from its version to
the current one (:func:`upgrade`, :func:`load_json`). A file of a version with no way up (a
newer twintrace's, or one never written) is a :class:`~core.errors.UserError` naming the file,
its version, the versions this twintrace reads and the twintrace that wrote it.

The stamp: ``schema_version`` (the layout's version), ``twintrace_version``, ``created_at`` (UTC,
ISO 8601) and, for a layout that names one, ``kind`` (what the file holds, checked on reading:
a study's results are refused as another study's). TOML files (profiles, the profile database)
are read and written by their own modules and checked here (:func:`upgrade`).

Pure standard library: the workload images read profiles through it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core import __version__ as TWINTRACE_VERSION
from core.atomic import atomic_write_json
from core.errors import UserError

#: The stamp's fields (written before the body's own).
STAMP = ("schema_version", "twintrace_version", "created_at")


def utc_now() -> str:
    """Now, in UTC, as ISO 8601 with milliseconds (every ``created_at`` and ``started_at``)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Layout:
    """One kind of versioned file (see the module doc)."""

    #: What the file is, in messages ("run manifest", "sleep profile", ...).
    what: str
    #: The version this code writes.
    version: int
    #: ``{N: update_from_N}``: a body of version N (a copy: change it freely) to one of N + 1.
    migrations: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]] = field(
        default_factory=dict
    )
    #: What to do with a file this twintrace cannot read (after "use the twintrace that made
    #: it (...)" when the file says which).
    remedy: str = ""
    #: The ``kind`` the file names, when its layout has one (checked on reading).
    kind: str | None = None
    #: The version a file without ``schema_version`` has (None: such a file is refused).
    unversioned: int | None = None

    def readable(self) -> tuple[int, ...]:
        """The versions this code reads: the current one and those a chain of migrations brings
        up to it."""
        versions = [self.version]
        for old in sorted(self.migrations, reverse=True):
            if old + 1 in versions:
                versions.append(old)
        return tuple(sorted(versions))


def stamp(layout: Layout, body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` stamped as ``layout``'s current version (a ``created_at`` already in the body is
    kept: a file rewritten keeps the time it was first made)."""
    head: dict[str, Any] = {
        "schema_version": layout.version,
        "twintrace_version": TWINTRACE_VERSION,
        "created_at": body.get("created_at") or utc_now(),
    }
    if layout.kind is not None:
        head["kind"] = layout.kind
    return {**head, **{k: v for k, v in body.items() if k not in head}}


def upgrade(layout: Layout, data: Any, where: str) -> dict[str, Any]:
    """``data`` (a file's body, read) checked as ``layout`` and brought up to its current
    version; a one-line UserError naming ``where`` when it cannot be."""
    if not isinstance(data, dict):
        fix = layout.remedy or "re-create it"
        raise UserError(f"{where} is damaged (not a {layout.what}, not a JSON object): {fix}")
    if layout.kind is not None and data.get("kind") != layout.kind:
        raise UserError(
            f"{where} is not a {layout.what} (its kind is {data.get('kind')!r}, not "
            f"{layout.kind!r})"
        )
    version = data.get("schema_version", layout.unversioned)
    if version == layout.version and not isinstance(version, bool):
        return data if "schema_version" in data else {**data, "schema_version": version}
    if isinstance(version, bool) or version not in layout.readable():
        made_by = data.get("twintrace_version")
        which = f"use twintrace {made_by}, which made it" if made_by else ""
        which = "; ".join(part for part in (which, layout.remedy) if part)
        readable = " or ".join(map(str, layout.readable()))
        raise UserError(
            f"{where}: {layout.what} of schema_version {version!r}, but twintrace "
            f"{TWINTRACE_VERSION} reads schema_version {readable}" + (f": {which}" if which else "")
        )
    data = dict(data)
    while version != layout.version:
        data = layout.migrations[version](data)
        version += 1
        data["schema_version"] = version
    return data


def read_json(path: Path, what: str, missing: str = "", damaged: str = "re-create it") -> Any:
    """The JSON at ``path``; a missing (``missing``: what to do then), unreadable or damaged
    (``damaged``: what to do then) file is a one-line UserError naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} does not exist" + (f": {missing}" if missing else "")) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(
            f"{path} is damaged (not valid JSON: {exc}); it was cut short or edited: {damaged}"
        ) from None
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}") from None


def load_json(path: Path, layout: Layout, missing: str = "") -> dict[str, Any]:
    """A JSON file of ``layout``, checked and up to date (:func:`read_json`, :func:`upgrade`)."""
    data = read_json(path, layout.what, missing, layout.remedy or "re-create it")
    return upgrade(layout, data, str(path))


def write_json(path: Path, layout: Layout, body: Mapping[str, Any]) -> None:
    """Write ``body`` stamped as ``layout`` (:func:`stamp`) to ``path``, atomically."""
    atomic_write_json(path, stamp(layout, body))
