"""The raw-output parsers against real bpftrace output saved in tests/data/raw.

The saved files were produced by tracing/bpf/*.bt on a Linux 6.18 host (a shell in a test cgroup
running python3, cat and dd). The expected numbers are computed here independently by splitting
the lines, so the vectorised parser is checked against a plain reading of the same text.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from store.rundir import PHASES_COLUMNS, READ_KINDS, WRITE_KINDS, empty_frame
from tracing import aggregates, ingest
from tracing.ingest import tables as ingest_tables

RAW = Path(__file__).parent / "data" / "raw"


def _lines(name: str) -> list[list[str]]:
    rows = []
    for line in (RAW / name).read_text().splitlines():
        if line[:1].isdigit():
            rows.append(line.split("\t"))
    return rows


def test_syscalls_counts_and_bytes_match_plain_reading() -> None:
    rows = _lines("syscalls.txt")
    expected = Counter(r[1] for r in rows)
    read_bytes = sum(max(int(r[5]), 0) for r in rows if r[1] in ("read", "pread64", "readv"))
    stats = ingest.ParseStats()
    df = ingest.parse_syscalls(RAW / "syscalls.txt", stats)
    assert Counter(df["kind"]) == expected
    assert df.loc[df["kind"].isin(READ_KINDS), "bytes"].sum() == read_bytes
    assert stats.skipped_lines == 0 and stats.lost_events == 0
    # Row by row, in file order: the columns taken as they are from each line
    # (ts, kind, pid, tid, fd, ret, arg, latency, comm, path).
    assert len(df) == len(rows) == 3830
    assert df["ts_ns"].tolist() == [int(r[0]) for r in rows]
    assert df["ts_ns"].is_monotonic_increasing  # the saved trace is in time order
    assert df["pid"].tolist() == [int(r[2]) for r in rows]
    assert df["tid"].tolist() == [int(r[3]) for r in rows]
    assert df["ret"].tolist() == [int(r[5]) for r in rows]
    assert df["latency_ns"].tolist() == [int(r[7]) for r in rows]
    assert df["comm"].tolist() == [r[8] for r in rows]
    assert df["path"].fillna("").tolist() == [r[9] for r in rows]
    # The derived columns: openat's descriptor is its return value (-1 when it failed), a
    # pread64's offset is its argument, an mmap's size its length argument.
    want_fd = [
        (int(r[5]) if int(r[5]) >= 0 else -1) if r[1] == "openat" else int(r[4]) for r in rows
    ]
    assert df["fd"].tolist() == want_fd
    assert (df["kind"] == "openat").sum() == 1384 and (
        df.loc[df["kind"] == "openat", "fd"] == -1
    ).sum() == sum(1 for r in rows if r[1] == "openat" and int(r[5]) < 0)
    preads = df["kind"] == "pread64"
    assert df.loc[preads, "offset"].tolist() == [int(r[6]) for r in rows if r[1] == "pread64"]
    mmaps = df["kind"] == "mmap"
    assert df.loc[mmaps, "bytes"].tolist() == [int(r[6]) for r in rows if r[1] == "mmap"]
    written = sum(max(int(r[5]), 0) for r in rows if r[1] == "write")
    assert df.loc[df["kind"] == "write", "bytes"].sum() == written > 0


def test_paths_are_resolved_from_openat() -> None:
    table, stats = ingest.build_events(RAW)
    df = table.to_pandas()
    # The traced python3 opened /etc/os-release, read it, pread64 10 bytes at offset 5 and mmapped it.
    opened = df[(df["kind"] == "openat") & (df["path"] == "/etc/os-release")]
    assert len(opened) == 1
    fd, pid = int(opened["fd"].iloc[0]), int(opened["pid"].iloc[0])
    after = df[(df["pid"] == pid) & (df["fd"] == fd) & (df["ts_ns"] > opened["ts_ns"].iloc[0])]
    pread = after[after["kind"] == "pread64"].iloc[0]
    assert pread["path"] == "/etc/os-release" and pread["bytes"] == 10 and pread["offset"] == 5
    assert after[after["kind"] == "mmap"]["path"].iloc[0] == "/etc/os-release"
    # Every read of python3 and cat (whose files were all opened within the trace) has a path;
    # bash's fd 255 was made by dup2, which is not traced, so it stays unresolved.
    reads = df[
        df["kind"].isin(["read", "pread64"]) & (df["fd"] > 2) & df["comm"].isin(["python3", "cat"])
    ]
    assert len(reads) > 100 and reads["path"].notna().all()


def test_block_cache_and_proc() -> None:
    stats = ingest.ParseStats()
    block = ingest.parse_block(RAW / "block.txt", stats)
    rows = _lines("block.txt")
    assert len(block) == len(rows)
    assert block["bytes"].sum() == sum(int(r[4]) for r in rows)
    n_reads = sum(1 for r in rows if "R" in r[1])
    assert (block["kind"] == "block_read").sum() == n_reads
    assert block["in_container"].sum() == sum(1 for r in rows if r[7] == "1")
    assert set(block["dev"]) == {"254:0"}  # vda: major 254, minor 0

    cache = ingest.parse_cache(RAW / "cache.txt", stats)
    pages = sum(
        int(line.rsplit(": ", 1)[1])
        for line in (RAW / "cache.txt").read_text().splitlines()
        if line.startswith("@add[")
    )
    assert cache.loc[cache["kind"] == "cache_add", "count"].sum() == pages
    assert (cache["bytes"] == cache["count"] * 4096).all()

    proc = ingest.parse_proc(RAW / "proc.txt", stats)
    assert list(proc["kind"]) == ["fork", "exec", "exit", "fork", "exec", "exit", "exit"]
    assert proc.loc[proc["kind"] == "exec", "path"].tolist() == ["/usr/bin/cat", "/usr/bin/dd"]


def test_memory_file_system_pages_are_kinds_of_their_own(tmp_path: Path) -> None:
    """cache.bt counts pages of memory file systems (/dev/shm, memfd) in @shm_add/@shm_del,
    apart from file data: shm_add/shm_delete rows, in the summary's page-cache group, never in
    cache_add/cache_delete; the rotating maps' digit is read past, and the earlier files (no
    @shm_ maps, no digit) parse as before."""
    text = "\n".join(
        [
            "READY 5",
            "T 100",
            "@add[7, python3]: 10",
            "@shm_add[7, pt_data_worker]: 300",
            "@shm_add[8, a, b]: 2",  # a thread name with a comma
            "T 200",
            "BEHIND 201",
            "@del3[7, python3]: 1",
            "@shm_del3[7, python3]: 302",
            "@shm_add3[9, x]: ",  # cut short: skipped
            "@addendum[9, x]: 4",  # another map: skipped
        ]
    )
    (tmp_path / "cache.txt").write_text(text + "\n")
    stats = ingest.ParseStats()
    cache = ingest.parse_cache(tmp_path / "cache.txt", stats)
    assert cache[["ts_ns", "kind", "pid", "comm", "count"]].values.tolist() == [
        [100, "cache_add", 7, "python3", 10],
        [100, "shm_add", 7, "pt_data_worker", 300],
        [100, "shm_add", 8, "a, b", 2],
        [200, "cache_delete", 7, "python3", 1],
        [200, "shm_delete", 7, "python3", 302],
    ]
    assert stats.lost_events == 0 and stats.behind == 1
    groups = ingest_tables._kind_groups({"shm_add": (2, 4096 * 302), "cache_add": (1, 40960)})
    assert set(groups["page_cache"]) == {"shm_add", "cache_add"}


def test_block_map_lines_parse_as_the_tab_separated_ones(tmp_path: Path) -> None:
    """block.bt prints its requests from maps (``@blkQ[ts, dev, sector]: (rwbs, bytes,
    latency, pid, in container, comm)``), in no order; the same requests as tab-separated
    lines (the earlier form, kept readable) give the same rows once ordered."""
    rows = _lines("block.txt")
    mapped = [
        f"@blk{(int(r[0]) // 100_000_000) % 4}[{r[0]}, {r[2]}, {r[3]}]: "
        f"({r[1]}, {r[4]}, {r[5]}, {r[6]}, {r[7]}, {r[8]})"
        for r in reversed(rows)
    ]
    # a thread name with a comma and a closing parenthesis, and an empty rwbs
    mapped.append("@blk2[300000000000, 266338304, 8, 4096]: (R, 4096, 5, 7, 1, a, b)")
    mapped.append("@blk1[300000000001, 266338304, 16]: (R, 4096, 5, 7, 1, a, b))")
    mapped.append("@blk1[300000000002, 266338304, 24]: (, 512, 5, -1, 0, kworker/0:1)")
    path = tmp_path / "block.txt"
    path.write_text("Attaching 5 probes...\nREADY 1\n\n" + "\n".join(mapped) + "\n\n")
    stats = ingest.ParseStats()
    got = ingest.parse_block(path, stats).sort_values("ts_ns", kind="stable")
    want = ingest.parse_block(RAW / "block.txt", ingest.ParseStats())
    assert stats.skipped_lines == 1  # the line with four numbers in its key
    assert len(got) == len(want) + 2
    extra = got.tail(2)
    assert extra["comm"].tolist() == ["a, b)", "kworker/0:1"]
    assert extra["kind"].tolist() == ["block_read", "block_other"]
    assert extra["pid"].tolist() == [7, -1]
    pd.testing.assert_frame_equal(
        got.head(len(want)).reset_index(drop=True), want.reset_index(drop=True)
    )


def _as_map_lines(text: str) -> str:
    """Tab-separated syscall lines as syscalls.bt prints them now: from rotating maps, each
    100 ms period's calls together and in no particular order (here: reversed)."""
    periods: dict[int, list[str]] = {}
    rest = []
    for line in text.splitlines():
        if not line[:1].isdigit():
            rest.append(line)
            continue
        ts, kind, pid, tid, fd, ret, arg, lat, comm, path = line.split("\t")
        q = int(ts) // 100_000_000
        if kind == "openat":
            out = f"@op{q % 4}[{ts}, {tid}, {comm}]: ({pid}, {ret}, {lat}, {path})"
        else:
            code = ingest.SYSCALL_KINDS.index(kind)
            out = f"@ev{q % 4}[{ts}, {tid}, {comm}]: ({code}, {pid}, {fd}, {ret}, {arg}, {lat})"
        periods.setdefault(q, []).append(out)
    lines = [line for q in sorted(periods) for line in reversed(periods[q])]
    return "\n".join(rest[:2] + lines + rest[2:]) + "\n"


def test_syscall_map_lines_give_the_same_events(tmp_path: Path) -> None:
    """syscalls.bt prints calls from maps (``@evQ[ts, tid, comm]: (kind, pid, fd, ret, arg,
    latency)``, openat as ``@opQ[ts, tid, comm]: (pid, ret, latency, path)``); the same calls
    as tab-separated lines (the earlier form) give the same events, paths joined alike."""
    raw = tmp_path / "raw"
    shutil.copytree(RAW, raw)
    text = _as_map_lines((RAW / "syscalls.txt").read_text())
    assert "@op" in text and "@ev" in text and "\t" not in text
    # a thread name with a comma, and a path with a comma and a parenthesis
    text += "@op1[1, 5, a, b]: (5, 3, 10, /x/a, b (1).npy)\n"
    text += "@ev1[2, 5, a, b]: (0, 5, 3, 7, -1, 10)\n"
    (raw / "syscalls.txt").write_text(text)
    got, stats = ingest.build_events(raw)
    want, _ = ingest.build_events(RAW)
    assert stats.skipped_lines == 0 and stats.lost_events == 0
    order = ["ts_ns", "tid", "kind", "fd", "ret"]
    got = got.to_pandas()
    extra = got[got["tid"] == 5].reset_index(drop=True)
    assert extra["path"].tolist() == ["/x/a, b (1).npy"] * 2
    assert extra["comm"].tolist() == ["a, b"] * 2 and extra["bytes"].tolist() == [0, 7]
    got = got[got["tid"] != 5].sort_values(order).reset_index(drop=True)
    want = want.to_pandas().sort_values(order).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_categorical=False)


def test_truncated_line_and_lost_events_are_handled(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    shutil.copytree(RAW, raw)
    # bpftrace -k: a failed map update (a full map) is a warning and two lines of context
    warning = (
        "syscalls.bt:120:9-130: WARNING: Failed to map_update_elem: Argument list too long (-7)\n"
        "        @agg0[pid, tid, $fd, $k, $g, $b, $sl, $ll] = ($v.0 + 1, $v.1 + $u);\n"
        "        ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~\n"
    )
    with open(raw / "block.txt", "a") as fh:
        fh.write(warning.replace("syscalls.bt", "block.bt") * 2)
        fh.write(
            "block.bt:9:3-20: WARNING: Failed to map_delete_elem: No such file (-2)\n @x\n ~\n"
        )
        fh.write("BEHIND 9\n")
    with open(raw / "cache.txt", "a") as fh:
        fh.write(warning.replace("syscalls.bt", "cache.bt"))
        fh.write("BEHIND 12\n")
    with open(raw / "syscalls.txt", "a") as fh:
        fh.write("Lost 17 events\n")
        fh.write("BEHIND 10\nBEHIND 11\n")  # the scripts' mark of user space falling behind
        fh.write(warning)
        fh.write("123456789\tread\t42\t42\t3")  # bpftrace stopped mid-line
    table, stats = ingest.build_events(raw)
    assert stats.lost_events == 17 + 1 + 2 + 1
    assert stats.behind == 2 + 1 + 1
    assert stats.skipped_lines == 1
    assert table.num_rows == ingest.build_events(RAW)[0].num_rows


def test_schema_and_summary() -> None:
    table, stats = ingest.build_events(RAW)
    assert table.schema.names == ingest.EVENTS_SCHEMA.names
    assert table.column("ts_ns").to_pandas().is_monotonic_increasing
    summary = ingest.summarize(table, empty_frame(PHASES_COLUMNS), stats)
    assert summary["syscalls"]["openat"]["count"] == sum(
        1 for r in _lines("syscalls.txt") if r[1] == "openat"
    )
    assert summary["processes"] == {"fork": 2, "exec": 2, "exit": 3}
    block_reads = [r for r in _lines("block.txt") if "R" in r[1]]
    assert summary["block"]["block_read"] == {
        "count": len(block_reads),
        "bytes": sum(int(r[4]) for r in block_reads),
    }
    assert len(block_reads) > 0 and summary["steps"] == 0


@pytest.mark.parametrize("name", ["syscalls", "block", "cache", "proc"])
def test_every_script_has_a_header(name: str) -> None:
    text = (Path(ingest.__file__).parent.parent / "bpf" / f"{name}.bt").read_text()
    for field in ("Purpose", "Probes", "Output", "Overhead", "Usage"):
        assert f"// {field}" in text


def test_reads_through_a_dup_of_the_descriptor_are_resolved() -> None:
    # tests/data/raw-dup: real syscalls.bt output of `np.save("/tmp/arr.npy", np.zeros(100000));
    # np.load("/tmp/arr.npy")`. np.load reads the array through a dup() of the file's descriptor.
    table, stats = ingest.build_events(RAW.parent / "raw-dup")
    df = table.to_pandas()
    assert (df["kind"] == "dup").sum() >= 1
    arr = df[df["path"] == "/tmp/arr.npy"]
    copies = arr[arr["kind"] == "dup"]
    assert len(copies) == 2  # one in np.save, one in np.load
    new_fd = int(copies["ret"].iloc[-1])
    # Through the copy, np.load reads the 128-byte header, seeks back and reads the whole file.
    via_copy = arr[
        arr["kind"].isin(READ_KINDS)
        & (arr["fd"] == new_fd)
        & (arr["ts_ns"] > copies["ts_ns"].iloc[-1])
    ]
    assert via_copy["bytes"].sum() == 128 + 800_128
    writes = arr[arr["kind"].isin(WRITE_KINDS)]
    assert writes["bytes"].sum() == 800_128  # 128-byte header + 100000 float64


def _raw(
    tmp_path: Path, syscalls: list[tuple], proc: list[str] = (), extra: list[str] = ()
) -> Path:
    """A raw directory: syscall lines (ts, kind, pid, fd, ret, path[, tid]) and proc lines."""
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = []
    for row in syscalls:
        ts, kind, pid, fd, ret, path = row[:6]
        tid = row[6] if len(row) > 6 else pid
        lines.append(f"{ts}\t{kind}\t{pid}\t{tid}\t{fd}\t{ret}\t-1\t10\tc{tid}\t{path or ''}")
    (raw / "syscalls.txt").write_text("\n".join([*lines, *extra]) + "\n")
    (raw / "proc.txt").write_text("".join(f"{line}\n" for line in proc))
    return raw


def _paths(raw: Path, **kw) -> list[str]:
    table, _ = ingest.build_events(raw, **kw)
    df = table.to_pandas()
    return list(df.loc[df["kind"].astype(str) != "fork", "path"].fillna("-"))


def test_a_closed_descriptor_number_reused_by_an_untraced_call_gets_no_path(
    tmp_path: Path,
) -> None:
    # A DataLoader worker reads an image on fd 19 and closes it; fd 19 is then reused for a
    # socket (socket() is not traced) whose reads must not be counted as the image's.
    raw = _raw(
        tmp_path,
        [
            (10, "openat", 7, -1, 19, "/data/a.jpg"),
            (11, "read", 7, 19, 900, None),
            (13, "close", 7, 19, 0, None),
            (14, "read", 7, 19, 4, None),  # a socket on the reused number
            (15, "openat", 7, -1, 19, "/data/b.jpg"),
            (16, "read", 7, 19, 700, None),
            # pid 8 was forked from 7 at ts 12 (fd 19 = a.jpg then); it reads the inherited
            # descriptor, closes it, and reads a reused fd 19 again.
            (17, "read", 8, 19, 50, None),
            (18, "close", 8, 19, 0, None),
            (19, "read", 8, 19, 4, None),
        ],
        ["12\tfork\t7\t7\t8\tpython\t"],
    )
    assert _paths(raw) == [
        "/data/a.jpg",
        "/data/a.jpg",
        "/data/a.jpg",
        "-",
        "/data/b.jpg",
        "/data/b.jpg",
        "/data/a.jpg",
        "/data/a.jpg",
        "-",
    ]


def test_descriptors_follow_the_process_tree_in_time_order(tmp_path: Path) -> None:
    # Fixed with the streaming join (the merge_asof join of before got these wrong or
    # unresolved): a fork's child inherits its parent's table as it is at the fork, so a call
    # of the child's pid before the fork inherits nothing; a grandchild inherits what its
    # parent inherited; a dup of an inherited descriptor copies it; dup of a dup of a dup.
    raw = _raw(
        tmp_path,
        [
            (10, "openat", 7, -1, 5, "/data/a"),
            (11, "read", 8, 5, 1, None),  # pid 8 before it was forked: nothing inherited
            (13, "read", 8, 5, 1, None),  # inherited
            (14, "dup", 8, 5, 6, None),  # a copy of an inherited descriptor
            (15, "read", 8, 6, 1, None),
            (17, "read", 9, 5, 1, None),  # the grandchild
            (18, "dup", 7, 5, 9, None),
            (19, "dup", 7, 9, 10, None),
            (20, "dup", 7, 10, 11, None),
            (21, "dup", 7, 11, 11, None),  # dup2(fd, fd)
            (22, "read", 7, 11, 1, None),
            (23, "dup", 7, 1, 11, None),  # a copy of a descriptor of unknown file
            (24, "read", 7, 11, 1, None),
        ],
        ["12\tfork\t7\t7\t8\tpython\t", "16\tfork\t8\t8\t9\tpython\t"],
    )
    assert _paths(raw) == ["/data/a", "-", *["/data/a"] * 9, "-", "-"]


def test_aggregated_rows_are_joined_like_calls(tmp_path: Path) -> None:
    agg = "@agg1[7, 71, 5, 3, 2, 1, 20, 13]: (50, 52428800, 500000, 20000, {ts}, -1)"
    raw = _raw(
        tmp_path,
        [
            (100, "openat", 7, -1, 5, "/ckpt/model.pt", 71),
            (110, "write", 7, 5, 4096, None, 71),
            (500, "close", 7, 5, 0, None, 71),
            (510, "write", 7, 5, 7, None, 72),  # another thread, after the close
        ],
        extra=[
            agg.format(ts=400),  # printed after later lines: within the reorder window
            agg.replace("[7, 71", "[7, 72").format(ts=520),
            agg.replace("[7, 71", "[7, 73").format(ts=530),  # a thread without a line
            "@agg1[7, 71, 5, 3, 2, 1, 20",  # cut short
        ],
    )
    table, stats = ingest.build_events(raw)
    df = table.to_pandas()
    df["kind"] = df["kind"].astype(str)
    assert list(df["ts_ns"]) == [100, 110, 400, 500, 510, 520, 530]
    rows = df[df["count"] == 50]
    assert list(rows["path"].fillna("-")) == ["/ckpt/model.pt", "-", "-"]
    assert list(rows["comm"]) == ["c71", "c72", ""]
    assert (rows["kind"] == "write").all() and (rows["bytes"] == 52428800).all()
    assert (rows["ret"] == 52428800).all() and (rows["offset"] == -1).all()
    assert (rows["latency_ns"] == 500000).all() and (rows["latency_max_ns"] == 20000).all()
    lines = df[df["count"] == 1]
    assert (lines["latency_max_ns"] == lines["latency_ns"]).all()
    assert stats.skipped_lines == 1
    heard: list[int] = []
    totals, _ = ingest.write_events(raw, tmp_path / "events.parquet", progress=heard.append)
    assert totals.per_kind()["write"] == (2 + 150, 4096 + 7 + 3 * 52428800)
    # the rows written so far, after each round: the last is all of them
    assert heard and heard == sorted(heard) and heard[-1] == len(df)


def test_progress_of_long_work_is_said_at_most_every_so_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tracing import processing

    clock = [100.0]
    monkeypatch.setattr(processing.time, "monotonic", lambda: clock[0])
    said: list[int] = []
    report = processing._every(5.0, said.append)
    for second in range(12):  # a value a second for 12 s: said at 5 s and 10 s only
        clock[0] = 100.0 + second
        report(second)
    assert said == [5, 10]


def test_the_fast_aggregate_parser_agrees_with_tracing_aggregates(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    lines = []
    for _ in range(300):
        f = rng.integers(0, 10**9, 14)
        line = (
            f"@agg{f[0] % 7}[{f[0]}, {f[1]}, {f[2] - 500}, {f[3] % 6}, {f[4]}, {f[5]}, "
            f"{f[6] % 40}, {f[7] % 40}]: ({f[8]}, {f[9] - 10}, {f[10]}, {f[11]}, {f[12]}, {f[13] - 2})"
        )
        if rng.random() < 0.2:
            line = line[: int(rng.integers(1, len(line)))]  # cut short
        elif rng.random() < 0.1:
            line = line.replace(", ", ",", 1)
        lines.append(line)
    (tmp_path / "syscalls.txt").write_text("\n".join(lines) + "\n")
    stats = ingest.ParseStats()
    got = ingest.parse_syscalls(tmp_path / "syscalls.txt", stats)
    want, bad = aggregates.parse_aggregate_lines(lines)
    assert stats.skipped_lines == len(bad) > 0
    for column in aggregates.COLUMNS:
        assert got[column].tolist() == want[column].tolist(), column


def test_an_aggregated_row_of_an_unknown_kind_is_a_skipped_line(tmp_path: Path) -> None:
    line = "@agg0[1, 1, 3, 99, 0, 0, 0, 0]: (1, 1, 1, 1, 1, -1)"
    (tmp_path / "syscalls.txt").write_text(line + "\n")
    stats = ingest.ParseStats()
    assert ingest.parse_syscalls(tmp_path / "syscalls.txt", stats).empty
    assert stats.skipped_lines == 1 and stats.skipped_examples == [line]


def _proc_rows(rows: list[tuple[int, str, int, int]]) -> pd.DataFrame:
    """Process events (ts_ns, kind, pid, child) as parse_proc makes them."""
    return pd.DataFrame(
        {
            "ts_ns": [r[0] for r in rows],
            "kind": [r[1] for r in rows],
            "pid": np.array([r[2] for r in rows], dtype=np.int32),
            "ret": np.array([r[3] for r in rows], dtype=np.int64),
        }
    )


def test_containers_are_attributed_by_following_forks_from_each_first_process() -> None:
    # Container a starts at pid 10 and forks 11, which forks 12; container b starts at 20 and
    # forks 21. Pid 99 belongs to neither; the fork of 12 is listed before its parent's fork
    # but happens after it, so order by time matters.
    proc = _proc_rows(
        [(3, "fork", 11, 12), (1, "fork", 10, 11), (2, "fork", 20, 21), (4, "exec", 12, -1)]
    )
    assert ingest.container_owners(proc, {10: "a", 20: "b"}) == {
        10: "a",
        11: "a",
        12: "a",
        20: "b",
        21: "b",
    }
    events = pd.DataFrame(
        {
            "pid": np.array([12, 21, 99, 10, 20], dtype=np.int32),
            "in_container": [True] * 4 + [False],
        }
    )
    roles = ingest.attribute_containers(events, proc, {10: "a", 20: "b"})
    assert list(roles.fillna("-")) == ["a", "b", "-", "a", "-"]
    # One container: every in-container event is its own, whatever the pid.
    single = ingest.attribute_containers(events, proc, {10: "main"})
    assert list(single.fillna("-")) == ["main"] * 4 + ["-"]


def test_build_events_fills_the_container_column_from_the_roots() -> None:
    table, _ = ingest.build_events(RAW)
    df = table.to_pandas()
    assert df["container"].isna().all()  # no manifest, no roots: unknown
    leader = int(df.loc[df["kind"].astype(str) == "exec", "pid"].iloc[0])
    table, _ = ingest.build_events(RAW, {leader: "main"})
    df = table.to_pandas()
    assert (df.loc[df["in_container"], "container"] == "main").all()
    assert df.loc[~df["in_container"], "container"].isna().all()


def test_the_parsers_grow_their_tables_and_buffers_as_they_fill(tmp_path: Path) -> None:
    """More thread names than a parser's table holds (1,024) and more rows than its first guess
    of a block's rows: each kernel stops, its table or buffer is grown
    (tracing.ingest.parse.run_growing), and it goes on where it stopped: the same rows as a
    parse that needed no growing."""
    from tracing.ingest import parse

    comms = [f"w{i}" for i in range(1500)]
    syscalls = tmp_path / "syscalls.txt"
    syscalls.write_text(
        "".join(
            f"{1000 + i}\tread\t{7 + i % 3}\t{7 + i % 3}\t3\t4096\t-1\t500\t{comms[i % 1500]}\t\n"
            for i in range(6000)
        )
    )
    block = tmp_path / "block.txt"
    block.write_text(
        "".join(
            f"{1000 + i}\tRA\t266338304\t{8 * i}\t4096\t2000\t{7 + i % 3}\t0\t{comms[i % 1500]}\n"
            for i in range(3000)
        )
    )
    stats = ingest.ParseStats()
    want_sys = ingest.parse_syscalls(syscalls, stats)
    want_blk = ingest.parse_block(block, stats)
    real = (parse._SyscallParser.__init__, parse._BlockParser.__init__)

    def tiny_syscalls(self: object, seen: object = None) -> None:
        real[0](self, seen)  # type: ignore[arg-type]
        self.rows_per_byte = self.aggs_per_byte = 1e-9  # type: ignore[attr-defined]

    def tiny_block(self: object) -> None:
        real[1](self)  # type: ignore[arg-type]
        self.rows_per_byte = 1e-9  # type: ignore[attr-defined]

    grows: list[str] = []
    run = parse.run_growing

    def counted(kernel, info, start, grow):  # noqa: ANN001, ANN202
        def seen(status):  # noqa: ANN001, ANN202
            def call() -> None:
                grows.append(status.name)
                grow[status]()

            return call

        return run(kernel, info, start, {status: seen(status) for status in grow})

    patch = pytest.MonkeyPatch()
    try:
        patch.setattr(parse._SyscallParser, "__init__", tiny_syscalls)
        patch.setattr(parse._BlockParser, "__init__", tiny_block)
        patch.setattr(parse, "run_growing", counted)
        got_sys = ingest.parse_syscalls(syscalls, ingest.ParseStats())
        got_blk = ingest.parse_block(block, ingest.ParseStats())
    finally:
        patch.undo()
    assert {"FULL_NAMES", "FULL_ROWS"} <= set(grows), grows
    pd.testing.assert_frame_equal(got_sys, want_sys)
    pd.testing.assert_frame_equal(got_blk, want_blk)
    assert len(got_sys) == 6000 and set(got_sys["comm"]) == set(comms)
    assert len(got_blk) == 3000


def test_a_request_whose_completion_was_not_seen_takes_its_place_in_time(tmp_path: Path) -> None:
    """block.bt prints a request whose completion no program saw as a tab-separated line with
    latency 0 and its issue time, when the next request of its sector is issued (seconds
    later, maybe) or at the end: the events put it in time order, with its bytes."""
    raw = tmp_path / "raw"
    shutil.copytree(RAW, raw)
    first = int(_lines("block.txt")[0][0])
    unseen = f"{first - 2_000_000_000}\tRA\t266338304\t999424\t4194304\t0\t15337\t1\tpython3\n"
    with (raw / "block.txt").open("a") as fh:
        fh.write(unseen)
    events, _ = ingest.build_events(raw)
    frame = events.to_pandas()
    assert frame["ts_ns"].is_monotonic_increasing
    blocks = frame[frame["kind"].astype(str).str.startswith("block_")]
    want = ingest.parse_block(RAW / "block.txt", ingest.ParseStats())
    assert len(blocks) == len(want) + 1
    row = blocks[blocks["offset"] == 999424 * 512].iloc[0]
    assert (row["ts_ns"], row["bytes"], row["latency_ns"], row["kind"]) == (
        first - 2_000_000_000,
        4194304,
        0,
        "block_read",
    )
    assert int(blocks["bytes"].sum()) == int(want["bytes"].sum()) + 4194304
