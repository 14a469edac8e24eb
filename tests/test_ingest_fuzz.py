"""The ingest's parsers over random and malformed tracer output (hypothesis): whatever the
lines, no parser raises; every well-formed line gives its row with its values, and every other
line that is not the tracer's own noise is counted as skipped (``ParseStats.skipped_lines``).

The lines are those the scripts print (``tracing/bpf/*.bt``, docs/run-format.md): calls and
openats from the syscall maps, aggregated rows, block requests, page-cache periods and process
events, mixed with bpftrace's own lines (``Attaching``, ``READY``, ``Lost N events``,
``BEHIND``, blank lines), lines cut short at any byte (bpftrace killed mid-line), kind codes no
script prints, and text that is no line of any script."""

from __future__ import annotations

import string
from pathlib import Path

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


def _write(tmp_path: Path, name: str, lines: list[str], end_newline: bool) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + ("\n" if end_newline else ""))
    return path


@SETTINGS
@given(data=st.data(), end_newline=st.booleans())
def test_syscall_lines(tmp_path: Path, data: st.DataObject, end_newline: bool) -> None:
    lines: list[str] = []
    want: list[tuple] = []
    skipped = lost = 0
    for _ in range(data.draw(st.integers(0, 40))):
        what = data.draw(st.sampled_from(["call", "open", "noise", "lost", "junk", "cut", "code"]))
        if what in ("call", "open", "cut"):
            line, row = data.draw(CALLS if what == "call" or data.draw(st.booleans()) else OPENS)
            if what == "cut":
                line, row = _cut(line, data), None
                skipped += 1
            lines.append(line)
            if row:
                want.append(row)
        elif what == "noise":
            lines.append(data.draw(NOISE))
        elif what == "lost":
            n = data.draw(st.integers(1, 10**6))
            lines.append(f"Lost {n} events")
            lost += n
        elif what == "junk":
            lines.append(data.draw(JUNK))
            skipped += 1
        else:  # an aggregated row of a kind code no script prints
            code = data.draw(st.integers(len(ingest.SYSCALL_KINDS) + 2, 10**6))
            lines.append(f"@agg0[1, 2, 3, {code}, 0, 0, 0, 0]: (1, 1, 1, 1, 1, -1)")
            skipped += 1
    stats = ingest.ParseStats()
    got = ingest.parse_syscalls(_write(tmp_path, "syscalls.txt", lines, end_newline), stats)
    assert stats.skipped_lines == skipped, (lines, stats)
    assert stats.lost_events == lost
    rows = sorted(zip(got["ts_ns"], got["kind"], got["pid"], got["tid"], got["comm"], strict=True))
    assert rows == sorted(want), lines


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
    lines: list[str] = []
    want: list[tuple] = []
    skipped = 0
    for _ in range(data.draw(st.integers(0, 40))):
        what = data.draw(st.sampled_from(["request", "noise", "junk", "cut"]))
        if what in ("request", "cut"):
            line, row = data.draw(REQUESTS)
            if what == "cut":
                line, row = _cut(line, data), None
                skipped += 1
            lines.append(line)
            if row:
                want.append(row)
        elif what == "noise":
            lines.append(data.draw(NOISE))
        else:
            lines.append(data.draw(JUNK))
            skipped += 1
    stats = ingest.ParseStats()
    got = ingest.parse_block(_write(tmp_path, "block.txt", lines, end_newline), stats)
    assert stats.skipped_lines == skipped, (lines, stats)
    columns = ("ts_ns", "offset", "bytes", "pid", "in_container", "comm", "kind")
    rows = sorted(zip(*(got[c] for c in columns), strict=True))
    assert rows == sorted(want), lines


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
    lines: list[str] = []
    want: list[tuple] = []
    skipped = 0
    for _ in range(data.draw(st.integers(0, 40))):
        what = data.draw(st.sampled_from(["event", "noise", "junk"]))
        if what == "event":
            line, row = data.draw(PROCESS_EVENTS)
            lines.append(line)
            want.append(row)
        elif what == "noise":
            lines.append(data.draw(NOISE))
        else:
            lines.append(data.draw(JUNK))
            skipped += 1
    tail_cut = data.draw(st.booleans())
    if tail_cut:  # bpftrace stopped mid-line: the text after the last newline
        lines.append(_cut(data.draw(PROCESS_EVENTS)[0], data))
        skipped += 1
    stats = ingest.ParseStats()
    got = ingest.parse_proc(_write(tmp_path, "proc.txt", lines, not tail_cut), stats)
    assert stats.skipped_lines == skipped, (lines, stats)
    rows = sorted(zip(got["ts_ns"], got["kind"], got["pid"], got["comm"], strict=True))
    assert rows == sorted(want), lines


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
    lines: list[str] = [f"T {ts}"]
    want: list[tuple] = []
    skipped = 0
    for _ in range(data.draw(st.integers(0, 40))):
        what = data.draw(st.sampled_from(["period", "pages", "noise", "junk", "cut"]))
        if what == "period":
            ts = data.draw(TS)
            lines.append(f"T {ts}")
        elif what == "pages":
            line, (name, pid, comm, pages) = data.draw(PAGES)
            lines.append(line)
            want.append((ts, CACHE_KINDS[name], pid, comm, pages, pages * 4096))
        elif what == "cut":  # within the line, before its count: a cut count looks whole
            line = data.draw(PAGES)[0]
            lines.append(line[: data.draw(st.integers(1, line.rindex("]: ") + 2))])
            skipped += 1
        elif what == "noise":
            lines.append(data.draw(NOISE))
        else:
            lines.append(data.draw(JUNK))
            skipped += 1
    tail_cut = data.draw(st.booleans())
    if tail_cut:  # bpftrace stopped mid-line: the text after the last newline
        lines.append(_cut(data.draw(PAGES)[0], data))
        skipped += 1
    stats = ingest.ParseStats()
    got = ingest.parse_cache(_write(tmp_path, "cache.txt", lines, not tail_cut), stats)
    assert stats.skipped_lines == skipped, (lines, stats)
    columns = ("ts_ns", "kind", "pid", "comm", "count", "bytes")
    rows = sorted(zip(*(got[c] for c in columns), strict=True))
    assert rows == sorted(want), lines
