"""DLIO's own outputs as a run's phases (tracing/dlio.py), against real outputs saved in
tests/data/dlio-unet3d: a DLIO 2.0.0 run of 2 epochs of 7 steps (batch 2, one reader thread,
a checkpoint after each epoch) in twintrace/dlio, written by ``./cli.py trace --workload unet3d
--variant dlio``. Expected numbers are read from the same files independently."""

from __future__ import annotations

import json
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from analysis.breakdown import accelerator_utilisation, step_table
from store.rundir import load_run
from tests.synthetic import make_run
from tracing import dlio, ingest

OUT = Path(__file__).parent / "data" / "dlio-unet3d"
OFFSET = 1_795_695_131_381_465_900  # CLOCK_REALTIME - CLOCK_MONOTONIC of that run


def _log_steps() -> list[tuple[int, int, int, int]]:
    """(rank, step, wall ns, samples) of every 'processed' line of dlio.log."""
    found = []
    for line in (OUT / "dlio.log").read_text().splitlines():
        m = re.search(r"(\S+) Rank (\d+) step (\d+) processed (\d+) samples", line)
        if m:
            when = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=UTC)
            ns = int(when.timestamp()) * 10**9 + when.microsecond * 1000
            found.append((int(m.group(2)), int(m.group(3)), ns, int(m.group(4))))
    return found


def _output() -> dict:
    return json.loads((OUT / "0_output.json").read_text())


def test_every_step_becomes_our_three_rows() -> None:
    phases = dlio.parse_dlio(OUT, OFFSET)
    logged = _log_steps()
    assert len(logged) == 14
    ends = phases[phases["key"] == "step_end"].reset_index(drop=True)
    assert len(ends) == 14 and (ends["kind"] == "point").all()
    # our steps count from 0 in each epoch, DLIO's from 1; times are the log's, monotonic
    assert ends["step"].tolist() == list(range(7)) * 2
    assert ends["epoch"].tolist() == [1] * 7 + [2] * 7
    assert sorted(ends["ts_ns"].tolist()) == sorted(ns - OFFSET for _, _, ns, _ in logged)
    assert ends["value"].map(json.loads).tolist() == [s for *_, s in logged]
    output = _output()
    for key, name in (("load_batch_mem", "load"), ("all_compute", "compute")):
        rows = phases[phases["key"] == key].sort_values(["epoch", "step"])
        want = [x for e in ("1", "2") for x in output[e][name]["block1"]]
        assert rows["duration_ns"].tolist() == pytest.approx([w * 1e9 for w in want], abs=2)
    # a step's computation ends it; its wait for data starts ``proc`` before its end
    compute = phases[phases["key"] == "all_compute"].set_index(["epoch", "step"])["end_ns"]
    assert (compute.sort_index().to_numpy() == ends.set_index(["epoch", "step"])["ts_ns"]
            .sort_index().to_numpy()).all()  # fmt: skip
    load = phases[phases["key"] == "load_batch_mem"].sort_values(["epoch", "step"])
    proc = [x for e in ("1", "2") for x in output[e]["proc"]["block1"]]
    starts = ends.sort_values(["epoch", "step"])["ts_ns"].to_numpy() - [p * 1e9 for p in proc]
    assert load["ts_ns"].to_numpy() == pytest.approx(starts, abs=2)


def test_epochs_and_checkpoints_from_rank0s_stats() -> None:
    phases = dlio.parse_dlio(OUT, OFFSET)
    stats = json.loads((OUT / "per_epoch_stats.json").read_text())
    epochs = phases[phases["key"] == "epoch"]
    assert epochs["epoch"].tolist() == [int(k) for k in stats]
    checkpoints = phases[phases["key"] == "checkpoint"]
    assert len(checkpoints) == sum(1 for e in stats.values() for k in e if k.startswith("ckpt"))
    assert (checkpoints["duration_ns"] > 0).all()
    assert phases[phases["key"] == "accelerator"]["value"].tolist() == ['"emulated: DLIO"']


def test_our_au_agrees_with_dlios(tmp_path: Path) -> None:
    """The AU of the analyses (compute / step time, each epoch's first step left out) over
    DLIO's steps is DLIO's own within 1 percentage point."""
    phases = dlio.parse_dlio(OUT, OFFSET)
    phases = phases.assign(
        container=pd.Series("main", index=phases.index, dtype="string"),
        host=pd.Series("test", index=phases.index, dtype="string"),
    )
    run = load_run(make_run(tmp_path, "20261126-130427-unet3d-dlio-f2f7", phases=phases))
    steps = step_table(run)
    assert len(steps) == 14 and steps["first_in_epoch"].sum() == 2
    ours = 100 * accelerator_utilisation(run, steps)
    theirs = dlio.dlio_summary(OUT)
    assert theirs is not None
    assert abs(ours - theirs["au_percent"]) < 1.0
    assert theirs["epochs"] == 2 and theirs["accelerators"] == 1


def test_build_phases_reads_dlios_outputs_of_a_container(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    shutil.copytree(OUT, raw / "main" / "dlio")
    phases = ingest.build_phases(raw, ["main"], OFFSET, {"samples_per_dlio_sample": 3})
    ends = phases[phases["key"] == "step_end"]
    assert len(ends) == 14 and (phases["container"] == "main").all()
    assert set(ends["value"].map(json.loads)) == {6}  # DLIO's 2 samples, 3 of ours each
    # without the clock offset the wall-clock times cannot be placed: no DLIO phases
    assert len(ingest.build_phases(raw, ["main"])) == 0


def test_no_outputs_no_phases(tmp_path: Path) -> None:
    assert dlio.parse_dlio(tmp_path, OFFSET).empty
    assert dlio.dlio_summary(tmp_path) is None
