"""bench/tracer_peers.py's readers and completeness, on real DFTracer 2.2.0 output (lines
recorded in a twintrace/unet3d:sleep container and the storm job) and on a twintrace
events table with aggregated rows."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from bench.tracer_peers import (
    DFTRACER_MOUNT,
    PRELOAD,
    Counts,
    check_dftracer,
    completeness,
    dftracer_found,
    dftracer_setup,
    twintrace_found,
)

X, Y = "/data/case_00010_x.npy", "/data/case_00010_y.npy"
# A forked DataLoader worker's file: np.load of one case (x and y), as DFTracer writes it. numpy
# reads the data through fdopen(dup(fd)) + fread, which DFTracer does not see: only the header's
# read is there.
WORKER = """\
{"name":"HH","cat":"dftracer","type":1,"pid":10,"tid":10,"ph":4,"args":{"hhash":"918fc7cc7c61e20e","name":"5fed081ec564","value":"918fc7cc7c61e20e"}}
{"id":1,"name":"start","cat":"dftracer","type":1,"pid":10,"tid":10,"ts":1795592350543680,"dur":0,"ph":1,"args":{"hhash":"918fc7cc7c61e20e","ppid":1,"cmd_hash":"aa1c500d0eac4b07","exec_hash":"950200472a9dd19c","version":20003,"date":"Wed Nov 25 07:39:10 2026","cwd":"32580c7ce20516ec"}}
{"name":"FH","cat":"dftracer","type":1,"pid":10,"tid":10,"ph":4,"args":{"hhash":"918fc7cc7c61e20e","name":"/data/case_00010_x.npy","value":"4d70bbe3de180eb9"}}
{"id":2,"name":"open64","cat":"POSIX","type":3,"pid":10,"tid":10,"ts":1795592350552705,"dur":8,"ph":1,"args":{"hhash":"918fc7cc7c61e20e","flags":524288,"fhash":"4d70bbe3de180eb9"}}
{"id":3,"name":"lseek64","cat":"POSIX","type":3,"pid":10,"tid":10,"ts":1795592350552731,"dur":2,"ph":1,"args":{"hhash":"918fc7cc7c61e20e","ret":0,"whence":1,"offset":0,"fhash":"4d70bbe3de180eb9"}}
{"id":4,"name":"read","cat":"POSIX","type":3,"pid":10,"tid":10,"ts":1795592350552810,"dur":6,"ph":1,"args":{"hhash":"918fc7cc7c61e20e","ret":4096,"count":4096,"fhash":"4d70bbe3de180eb9"}}
{"id":7,"name":"lseek64","cat":"POSIX","type":3,"pid":10,"tid":10,"ts":1795592350554037,"dur":1,"ph":1,"args":{"hhash":"918fc7cc7c61e20e","ret":1387280,"whence":0,"offset":1387280,"fhash":"4d70bbe3de180eb9"}}
{"id":8,"name":"close","cat":"POSIX","type":3,"pid":10,"tid":10,"ts":1795592350554082,"dur":2,"ph":1,"args":{"hhash":"918fc7cc7c61e20e","ret":0,"fhash":"4d70bbe3de180eb9"}}
{"name":"FH","cat":"dftracer","type":1,"pid":10,"tid":10,"ph":4,"args":{"hhash":"918fc7cc7c61e20e","name":"/data/case_00010_y.npy","value":"da4dc3e0220e986e"}}
{"id":9,"name":"open64","cat":"POSIX","type":3,"pid":10,"tid":10,"ts":1795592350554113,"dur":6,"ph":1,"args":{"hhash":"918fc7cc7c61e20e","flags":524288,"fhash":"da4dc3e0220e986e"}}
{"id":11,"name":"read","cat":"POSIX","type":3,"pid":10,"tid":10,"ts":1795592350554135,"dur":3,"ph":1,"args":{"hhash":"918fc7cc7c61e20e","ret":4096,"count":4096,"fhash":"da4dc3e0220e986e"}}
{"id":15,"name":"close","cat":"POSIX","type":3,"pid":10,"tid":10,"ts":1795592350560769,"dur":2,"ph":1,"args":{"hhash":"918fc7cc7c61e20e","ret":0,"fhash":"da4dc3e0220e986e"}}
"""
# The main process: it lists the data directory (not a dataset file) and forks the workers.
MAIN = """\
{"name":"FH","cat":"dftracer","type":1,"pid":1,"tid":1,"ph":4,"args":{"hhash":"918fc7cc7c61e20e","name":"/data","value":"4c79911de63702f3"}}
{"id":2,"name":"opendir","cat":"POSIX","type":3,"pid":1,"tid":1,"ts":1795592349502781,"dur":7,"ph":1,"args":{"hhash":"918fc7cc7c61e20e","fhash":"4c79911de63702f3"}}
{"id":3,"name":"fork","cat":"POSIX","type":3,"pid":1,"tid":1,"ts":1795592350543151,"dur":15,"ph":1,"args":{"hhash":"918fc7cc7c61e20e","ret":10}}
{"id":13,"name":"end","cat":"dftracer","type":1,"pid":1,"tid":1,"ts":1795592351619084,"dur":0,"ph":1,"args":{"hhash":"918fc7cc7c61e20e","app":{},"used":{"LIBC_IO":1},"cfg":{"enable":1,"metadata":1},"num_events":12}}
"""
# DFTRACER_ENABLE_AGGREGATION=1 on the storm job (20000 + 1 preads): rows without file hashes.
AGGREGATED = """\
{"name":"FH","cat":"dftracer","type":1,"pid":1,"tid":1,"ph":4,"args":{"hhash":"ddf71cb3212fc448","name":"/tmp/storm.bin","value":"a2745ebab0c92cfe"}}
{"name":"open64","cat":"POSIX","type":3,"ts":1795592323000000,"ph":3,"pid":1,"tid":1,"args":{"hhash":"ddf71cb3212fc448","dur":155,"flags":524865,"mode":438,"dft_cnt":1}}
{"name":"open64","cat":"POSIX","type":3,"ts":1795592324000000,"ph":3,"pid":1,"tid":1,"args":{"hhash":"ddf71cb3212fc448","dur":18,"flags":524288,"dft_cnt":1}}
{"name":"write","cat":"POSIX","type":3,"ts":1795592324000000,"ph":3,"pid":1,"tid":1,"args":{"hhash":"ddf71cb3212fc448","dur":44976,"ret":67108864,"count":67108864,"dft_cnt":1}}
{"name":"pread64","cat":"POSIX","type":3,"ts":1795592324000000,"ph":3,"pid":1,"tid":1,"args":{"hhash":"ddf71cb3212fc448","dur_sum":295472,"ret_max":4096,"ret_min":4096,"ret_sum":81924096,"count_sum":81924096,"dft_cnt":20001}}
"""


def write(path: Path, text: str) -> None:
    path.write_bytes(gzip.compress(text.encode()))


def test_dftracer_counts_per_file_and_role(tmp_path: Path) -> None:
    write(tmp_path / "dftracer-238f76795c9dc3bb-fork.pfw.gz", WORKER)
    write(tmp_path / "dftracer-fc064ec0ffc73675-preload.pfw.gz", MAIN)
    # The container's start-up shell exec'd before writing: an empty file, skipped.
    (tmp_path / "dftracer-3253c463b688870a-preload.pfw.gz").write_bytes(b"")
    found, notes = dftracer_found(tmp_path, {X, Y})
    assert found == {
        ("workers", X): Counts(opens=1, reads=1, bytes=4096),
        ("workers", Y): Counts(opens=1, reads=1, bytes=4096),
    }
    assert notes == []


def test_dftracer_fread_bytes_are_items_times_size(tmp_path: Path) -> None:
    fread = (
        '{"name":"FH","pid":1,"args":{"name":"/data/f","value":"aa"}}\n'
        '{"name":"fopen","pid":1,"args":{"fhash":"aa"}}\n'
        '{"name":"fread","pid":1,"args":{"size":4,"count":100,"ret":100,"fhash":"aa"}}\n'
    )
    write(tmp_path / "dftracer-1-preload.pfw.gz", fread)
    found, _ = dftracer_found(tmp_path, {"/data/f"})
    assert found == {("main", "/data/f"): Counts(opens=1, reads=1, bytes=400)}


def test_dftracer_aggregated_rows_have_no_file(tmp_path: Path) -> None:
    write(tmp_path / "dftracer-3087590c5ac0842b-preload.pfw.gz", AGGREGATED)
    found, _ = dftracer_found(tmp_path, {"/tmp/storm.bin"})
    assert found == {("main", None): Counts(opens=2, reads=20001, bytes=20001 * 4096)}
    truth = {("main", "/tmp/storm.bin"): Counts(opens=2, bytes=20001 * 4096)}
    main, _ = completeness(found, truth)
    assert main.complete and not main.per_file
    assert "no file names" in main.describe()


def test_a_truncated_dftracer_file_is_a_note(tmp_path: Path) -> None:
    data = gzip.compress(WORKER.encode())
    (tmp_path / "dftracer-1-fork.pfw.gz").write_bytes(data[: len(data) // 2])
    found, notes = dftracer_found(tmp_path, {X, Y})
    assert found == {}
    assert notes == ["DFTracer file dftracer-1-fork.pfw.gz unreadable"]


def test_twintrace_weights_rows_by_count(tmp_path: Path) -> None:
    rows = [
        # kind, comm, path, count, bytes, ret
        ("openat", "pt_data_worker", X, 1, 0, 12),
        ("openat", "pt_data_worker", X, 1, 0, -2),  # failed: not an open
        ("read", "pt_data_worker", X, 1, 4096, 4096),
        ("read", "pt_data_worker", X, 25, 3_276_800, 131_072),  # an aggregated row
        ("lseek", "pt_data_worker", X, 3, 0, 0),
        ("openat", "python", "/data", 1, 0, 5),  # the directory: not a dataset file
        ("pread64", "python", X, 2, 8192, 4096),
    ]
    events = pd.DataFrame(rows, columns=["kind", "comm", "path", "count", "bytes", "ret"])
    events["kind"] = events["kind"].astype("category")
    events.to_parquet(tmp_path / "events.parquet")
    (tmp_path / "summary.json").write_text(json.dumps({"lost_events": 0, "skipped_lines": 3}))
    found, notes = twintrace_found(tmp_path, {X})
    assert found == {
        ("workers", X): Counts(opens=1, reads=26, bytes=3_280_896),
        ("main", X): Counts(opens=0, reads=2, bytes=8192),
    }
    assert notes == ["twintrace skipped lines: 3"]


def test_completeness_caps_each_file_at_its_truth() -> None:
    truth = {("workers", X): Counts(opens=1, bytes=1000), ("workers", Y): Counts(opens=1, bytes=10)}
    found = {("workers", X): Counts(opens=1, bytes=1128), ("workers", Y): Counts(opens=1, bytes=4)}
    main, workers = completeness(found, truth)
    assert (main.opens, main.opens_true, main.bytes_true, main.complete) == (0, 0, 0, True)
    assert (workers.opens, workers.bytes, workers.covered, workers.bytes_true) == (
        2,
        1132,
        1004,
        1010,
    )
    assert not workers.complete  # Y is short, whatever X's surplus
    found[("workers", Y)] = Counts(opens=1, bytes=10)
    assert completeness(found, truth)[1].complete
    # Opens in the wrong role (a worker's read put on the main process) are not complete.
    moved = {("main", X): Counts(opens=1, bytes=1000), ("workers", Y): Counts(opens=1, bytes=10)}
    main, workers = completeness(moved, truth)
    assert not main.complete and not workers.complete


def test_setup_and_install_message(tmp_path: Path) -> None:
    environment, mount = dftracer_setup(tmp_path, "/data", aggregate=True)
    assert environment["LD_PRELOAD"] == f"{DFTRACER_MOUNT}/{PRELOAD}"
    assert environment["DFTRACER_DATA_DIR"] == "/data"
    assert environment["DFTRACER_ENABLE_AGGREGATION"] == "1"
    assert (mount.source, mount.target, mount.read_only) == (tmp_path, DFTRACER_MOUNT, True)
    with pytest.raises(SystemExit, match=r"pip install --no-deps --target .* dftracer==2\.2\.0"):
        check_dftracer(tmp_path)
