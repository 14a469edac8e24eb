"""The run format's one owner (store/rundir.py) and the one atomic writer (core/atomic.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from core import __version__
from core.atomic import atomic_path, atomic_write_bytes, atomic_write_json
from core.errors import UserError
from store import rundir


def test_a_failed_atomic_write_leaves_neither_target_nor_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")

    class Boom(Exception):
        pass

    with pytest.raises(Boom), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise Boom
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    # bytes that cannot be written (a str): nothing left behind either
    with pytest.raises(TypeError):
        atomic_write_bytes(target, "not bytes")  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_atomic_json_replaces_whole_and_fsync_works(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "x.json"
    atomic_write_json(target, {"a": 1}, fsync=True)
    atomic_write_json(target, {"b": 2})
    assert json.loads(target.read_text()) == {"b": 2}
    assert [p.name for p in target.parent.iterdir()] == ["x.json"]


def test_versioned_json_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "comparison-x.json"
    rundir.write_json(path, {"overall": 0.9})
    data = rundir.load_comparison(path)
    assert data["overall"] == 0.9 and data["schema_version"] == rundir.SCHEMA_VERSION
    assert data["twintrace_version"] == __version__ and data["created_at"].endswith("+00:00")
    path.write_text(path.read_text()[:10])  # truncated
    with pytest.raises(UserError, match=r"comparison-x\.json is damaged") as info:
        rundir.load_comparison(path)
    assert "\n" not in str(info.value)
    path.write_text(json.dumps({"schema_version": 1, "twintrace_version": "0.0.9"}))
    with pytest.raises(UserError, match=r"schema_version 1.*use twintrace 0\.0\.9"):
        rundir.load_comparison(path)
    path.write_text("[1, 2]")
    with pytest.raises(UserError, match="not a JSON object"):
        rundir.load_json(path, "summary")


def test_new_run_dir_manifest_and_loader(tmp_path: Path) -> None:
    run_dir = rundir.new_run_dir(tmp_path, "my image:tag", "sleep")
    assert {p.name for p in run_dir.iterdir()} == set(rundir.RUN_SUBDIRS)
    assert run_dir.name.endswith("-sleep-" + run_dir.name.split("-")[-1])
    manifest = rundir.initial_manifest(run_dir, containers=[{"role": "rank0"}, {"role": "rank1"}])
    assert manifest["twintrace_version"] == __version__ and manifest["status"] == "running"
    rundir.write_manifest(run_dir, manifest)
    run = rundir.load_run(run_dir)
    assert run.containers == ["rank0", "rank1"]
    assert run.missing == {"events", "samples", "phases"}
    assert list(run.events.columns) == list(rundir.EVENTS_COLUMNS)
    assert "container" in rundir.EVENTS_COLUMNS and "container" in rundir.SAMPLES_COLUMNS
    with pytest.raises(ValueError):
        rundir.write_manifest(run_dir, {**manifest, "status": "done"})


def test_write_table_conforms_and_reads_back(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {
            "ts_ns": [2, 1],
            "metric": ["container_cpu", "host_cpu_user"],
            "value": [50.0, 10.0],
            "unit": ["percent", "percent"],
            "container": ["rank0", None],
            "host": ["node-1", "node-1"],
            "extra": [1, 2],
        }
    )
    path = tmp_path / "samples.parquet"
    rundir.write_table(path, frame, rundir.SAMPLES_COLUMNS)
    back = rundir.read_table(path, rundir.SAMPLES_COLUMNS)
    assert list(back.columns) == list(rundir.SAMPLES_COLUMNS)
    assert back["container"].tolist()[0] == "rank0" and pd.isna(back["container"].iloc[1])
    with pytest.raises(UserError, match="lacks column 'container'"):
        rundir.write_table(path, frame.drop(columns="container"), rundir.SAMPLES_COLUMNS)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_a_version_3_run_loads_with_its_one_host(tmp_path: Path) -> None:
    """Schema 4 added the ``host`` column: a version-3 run's tables read with the manifest's
    host name in it; its JSON files load as they are; a version it never had is refused."""
    run_dir = rundir.new_run_dir(tmp_path, "x", None)
    manifest = rundir.initial_manifest(run_dir, host={"hostname": "box"})
    manifest["schema_version"] = 3  # as a version-3 twintrace wrote it
    (run_dir / rundir.MANIFEST).write_text(json.dumps(manifest))
    frame = pd.DataFrame({"ts_ns": [1], "metric": ["m"], "value": [1.0], "unit": ["u"]})
    frame["container"] = pd.Series([None], dtype="string")
    columns_v3 = {k: v for k, v in rundir.SAMPLES_COLUMNS.items() if k != "host"}
    rundir.write_table(run_dir / "samples.parquet", frame, columns_v3)
    run = rundir.load_run(run_dir)
    assert list(run.samples.columns) == list(rundir.SAMPLES_COLUMNS)
    assert run.samples["host"].tolist() == ["box"]
    assert run.events.empty and "host" in run.events.columns  # absent table: empty, documented
    # brought up to date, the manifest is version 4's and remembers its tables' version, also
    # once written again (with the time it was first written)
    loaded = rundir.load_manifest(run_dir)
    assert (loaded["schema_version"], loaded["tables_version"]) == (4, 3)
    rundir.write_manifest(run_dir, loaded)
    first = rundir.load_manifest(run_dir)
    rundir.write_manifest(run_dir, first)
    assert rundir.load_manifest(run_dir)["created_at"] == first["created_at"]
    assert rundir.load_run(run_dir).samples["host"].tolist() == ["box"]
    assert rundir.migrate_table(rundir.initial_manifest(run_dir)) == {}
    manifest["schema_version"] = 2
    (run_dir / rundir.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="reads schema_version 3 or 4"):
        rundir.load_run(run_dir)


@pytest.mark.parametrize("name", [rundir.MANIFEST, rundir.SUMMARY])
def test_a_damaged_file_is_one_line_naming_it(tmp_path: Path, name: str) -> None:
    run_dir = rundir.new_run_dir(tmp_path, "x", None)
    rundir.write_manifest(run_dir, rundir.initial_manifest(run_dir))
    rundir.write_json(run_dir / rundir.SUMMARY, {"run_id": run_dir.name})
    (run_dir / name).write_text('{"schema_version": 2, "run')
    loader = rundir.load_manifest if name == rundir.MANIFEST else rundir.load_summary
    with pytest.raises(UserError) as info:
        loader(run_dir)
    assert str(run_dir / name) in str(info.value) and "\n" not in str(info.value)
