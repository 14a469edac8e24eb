"""The ingest's parsers over random and malformed tracer output (hypothesis): whatever the
lines, no parser raises; every well-formed line gives its row with its values, and every other
line that is not the tracer's own noise is counted as skipped (``ParseStats.skipped_lines``).

The lines are those the scripts print (``tracing/bpf/*.bt``, docs/run-format.md): calls and
openats from the syscall maps, aggregated rows, block requests, page-cache periods and process
events, mixed with bpftrace's own lines (``Attaching``, ``READY``, ``Lost N events``,
``BEHIND``, blank lines), lines cut short at any byte (bpftrace killed mid-line), kind codes no
script prints, and text that is no line of any script."""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.conftest import IN_CI
from tracing import ingest

#: A run of examples per parser: enough to meet every kind of line in many orders, within
#: seconds (the parsers are compiled once, by the first example). New examples each run on a
#: developer's machine; in CI the same ones every run (a failure there is reproducible).
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=IN_CI,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

TS = st.integers(1, 2**62)
ID = st.integers(1, 2**22)
SIGNED = st.integers(-(2**40), 2**40)
#: A thread name as the kernel keeps it (up to 15 bytes), with the commas and spaces that make
#: the map lines' keys ambiguous to a naive split.
COMM = st.text(string.ascii_letters + string.digits + "-_/:.", min_size=1, max_size=8).flatmap(
    lambda head: st.sampled_from(["", ", x", " y"]).map(lambda tail: (head + tail)[:15])
)
PATH = st.text(string.ascii_letters + string.digits + "/_.-, ()", min_size=1, max_size=40).map(
    lambda p: "/" + p.strip()
)
#: Codes of the calls printed one by one (openat has lines of its own).
CALL_CODES = [i for i, k in enumerate(ingest.SYSCALL_KINDS) if k != "openat"]

#: bpftrace's own lines: no event, not skipped.
NOISE = st.one_of(
    st.just(""),
    st.integers(1, 99).map(lambda n: f"Attaching {n} probes..."),
    TS.map(lambda t: f"READY {t}"),
    TS.map(lambda t: f"BEHIND {t}"),
)
#: Text that is no line of any script (it does not start like one, and names no warning).
JUNK = st.text(string.ascii_letters + string.digits + " ,:;[]()-", min_size=1, max_size=60).filter(
    lambda s: (
        s.strip()
        and not s.lstrip()[:1].isdigit()
        and not s.startswith(("Attaching", "READY", "BEHIND", "Lost", "T "))
        and "WARNING" not in s
    )
)


def _call(ts: int, tid: int, comm: str, code: int, pid: int, fd: int, ret: int, lat: int) -> tuple:
    line = f"@ev{(ts // 10**8) % 4}[{ts}, {tid}, {comm}]: ({code}, {pid}, {fd}, {ret}, -1, {lat})"
    return line, (ts, ingest.SYSCALL_KINDS[code], pid, tid, comm)


def _open(ts: int, tid: int, comm: str, pid: int, ret: int, lat: int, path: str) -> tuple:
    line = f"@op{(ts // 10**8) % 4}[{ts}, {tid}, {comm}]: ({pid}, {ret}, {lat}, {path})"
    return line, (ts, "openat", pid, tid, comm)


CALLS = st.builds(
    _call, TS, ID, COMM, st.sampled_from(CALL_CODES), ID, st.integers(0, 4096), SIGNED, ID
)
OPENS = st.builds(_open, TS, ID, COMM, ID, st.integers(-2, 4096), ID, PATH)


def _cut(line: str, data: st.DataObject) -> str:
    """``line`` cut short before its last byte (never empty), but not just after a ")": a
    path or a thread name may hold one, and a line cut there looks whole (as a page-cache
    count cut in its digits does: those are cut before their count)."""
    cut = line[: data.draw(st.integers(1, len(line) - 1))]
    assume(not cut.endswith(")"))
    return cut


@dataclasses.dataclass
class _Drawn:
    """A tracer's output drawn line by line: its lines, the rows a parser must give for them
    and how many of them it must count as skipped."""

    data: st.DataObject
    lines: list[str] = dataclasses.field(default_factory=list)
    want: list[tuple] = dataclasses.field(default_factory=list)
    skipped: int = 0

    def event(self, events: st.SearchStrategy[tuple], cut: bool = False) -> None:
        """A well-formed line of ``events`` and its row; ``cut``: the line cut short instead
        (skipped, no row)."""
        line, row = self.data.draw(events)
        if cut:
            self.bad(_cut(line, self.data))
        else:
            self.lines.append(line)
            self.want.append(row)

    def noise(self) -> None:
        """One of bpftrace's own lines: no row, not skipped."""
        self.lines.append(self.data.draw(NOISE))

    def junk(self) -> None:
        self.bad(self.data.draw(JUNK))

    def bad(self, line: str) -> None:
        """A line the parser must skip."""
        self.lines.append(line)
        self.skipped += 1

    def tail(self, events: st.SearchStrategy[tuple]) -> bool:
        """Maybe a last line of ``events`` cut short (bpftrace stopped mid-line: the text after
        the last newline); whether there is one."""
        cut = self.data.draw(st.booleans())
        if cut:
            self.event(events, cut=True)
        return cut

    def write(self, path: Path, end_newline: bool) -> Path:
        path.write_text("\n".join(self.lines) + ("\n" if end_newline else ""))
        return path

    def check(
        self,
        parse: Callable[[Path, ingest.ParseStats], Any],
        path: Path,
        columns: tuple[str, ...],
    ) -> ingest.ParseStats:
        """``parse`` of the lines written at ``path``: the lines skipped are those drawn so, and
        its rows (their ``columns``) those wanted, in any order. Returns its stats."""
        stats = ingest.ParseStats()
        got = parse(path, stats)
        assert stats.skipped_lines == self.skipped, (self.lines, stats)
        rows = sorted(zip(*(got[c] for c in columns), strict=True))
        assert rows == sorted(self.want), self.lines
        return stats


@SETTINGS
@given(data=st.data(), end_newline=st.booleans())
def test_syscall_lines(tmp_path: Path, data: st.DataObject, end_newline: bool) -> None:
    drawn = _Drawn(data)
    lost = 0
    for _ in range(data.draw(st.integers(0, 40))):
        what = data.draw(st.sampled_from(["call", "open", "noise", "lost", "junk", "cut", "code"]))
        if what in ("call", "open", "cut"):
            events = CALLS if what == "call" or data.draw(st.booleans()) else OPENS
            drawn.event(events, cut=what == "cut")
        elif what == "noise":
            drawn.noise()
        elif what == "lost":
            n = data.draw(st.integers(1, 10**6))
            drawn.lines.append(f"Lost {n} events")
            lost += n
        elif what == "junk":
            drawn.junk()
        else:  # an aggregated row of a kind code no script prints
            code = data.draw(st.integers(len(ingest.SYSCALL_KINDS) + 2, 10**6))
            drawn.bad(f"@agg0[1, 2, 3, {code}, 0, 0, 0, 0]: (1, 1, 1, 1, 1, -1)")
    path = drawn.write(tmp_path / "syscalls.txt", end_newline)
    stats = drawn.check(ingest.parse_syscalls, path, ("ts_ns", "kind", "pid", "tid", "comm"))
    assert stats.lost_events == lost


def _request(
    ts: int, sector: int, rwbs: str, size: int, lat: int, pid: int, inside: int, comm: str
) -> tuple:
    line = (
        f"@blk{(ts // 10**8) % 4}[{ts}, {8 << 20}, {sector}]: "
        f"({rwbs}, {size}, {lat}, {pid}, {inside}, {comm})"
    )
    kind = {"R": "block_read", "RA": "block_read", "W": "block_write", "WS": "block_write"}
    return line, (ts, sector * 512, size, pid, bool(inside), comm, kind.get(rwbs, "block_other"))


REQUESTS = st.builds(
    _request, TS, st.integers(0, 2**40), st.sampled_from(["R", "RA", "W", "WS", "FF", "D", ""]),
    st.integers(1, 2**30), ID, ID, st.integers(0, 1), COMM,
)  # fmt: skip


@SETTINGS
@given(data=st.data(), end_newline=st.booleans())
def test_block_lines(tmp_path: Path, data: st.DataObject, end_newline: bool) -> None:
    drawn = _Drawn(data)
    for _ in range(data.draw(st.integers(0, 40))):
        what = data.draw(st.sampled_from(["request", "noise", "junk", "cut"]))
        if what in ("request", "cut"):
            drawn.event(REQUESTS, cut=what == "cut")
        elif what == "noise":
            drawn.noise()
        else:
            drawn.junk()
    path = drawn.write(tmp_path / "block.txt", end_newline)
    columns = ("ts_ns", "offset", "bytes", "pid", "in_container", "comm", "kind")
    drawn.check(ingest.parse_block, path, columns)


def _process_event(ts: int, kind: str, pid: int, child: int, comm: str, path: str) -> tuple:
    arg = path if kind == "exec" else ""
    line = f"{ts}\t{kind}\t{pid}\t{pid}\t{child if kind == 'fork' else -1}\t{comm}\t{arg}"
    return line, (ts, kind, pid, comm)


PROCESS_EVENTS = st.builds(
    _process_event, TS, st.sampled_from(["fork", "exec", "exit"]), ID, ID, COMM, PATH
)


@SETTINGS
@given(data=st.data())
def test_process_lines(tmp_path: Path, data: st.DataObject) -> None:
    drawn = _Drawn(data)
    for _ in range(data.draw(st.integers(0, 40))):
        what = data.draw(st.sampled_from(["event", "noise", "junk"]))
        if what == "event":
            drawn.event(PROCESS_EVENTS)
        elif what == "noise":
            drawn.noise()
        else:
            drawn.junk()
    path = drawn.write(tmp_path / "proc.txt", not drawn.tail(PROCESS_EVENTS))
    drawn.check(ingest.parse_proc, path, ("ts_ns", "kind", "pid", "comm"))


CACHE_KINDS = {
    "add": "cache_add",
    "del": "cache_delete",
    "shm_add": "shm_add",
    "shm_del": "shm_delete",
}


def _pages(name: str, pid: int, comm: str, pages: int) -> tuple:
    return f"@{name}[{pid}, {comm}]: {pages}", (name, pid, comm, pages)


PAGES = st.builds(_pages, st.sampled_from(sorted(CACHE_KINDS)), ID, COMM, st.integers(1, 2**31))


@SETTINGS
@given(data=st.data())
def test_page_cache_lines(tmp_path: Path, data: st.DataObject) -> None:
    ts = data.draw(TS)
    drawn = _Drawn(data, [f"T {ts}"])
    for _ in range(data.draw(st.integers(0, 40))):
        what = data.draw(st.sampled_from(["period", "pages", "noise", "junk", "cut"]))
        if what == "period":
            ts = data.draw(TS)
            drawn.lines.append(f"T {ts}")
        elif what == "pages":
            line, (name, pid, comm, pages) = data.draw(PAGES)
            drawn.lines.append(line)
            drawn.want.append((ts, CACHE_KINDS[name], pid, comm, pages, pages * 4096))
        elif what == "cut":  # within the line, before its count: a cut count looks whole
            line = data.draw(PAGES)[0]
            drawn.bad(line[: data.draw(st.integers(1, line.rindex("]: ") + 2))])
        elif what == "noise":
            drawn.noise()
        else:
            drawn.junk()
    path = drawn.write(tmp_path / "cache.txt", not drawn.tail(PAGES))
    drawn.check(ingest.parse_cache, path, ("ts_ns", "kind", "pid", "comm", "count", "bytes"))
