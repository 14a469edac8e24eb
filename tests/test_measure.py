"""``profile measure`` (experiments/measure.py) on real training: each step is timed phase by
phase, and the profile it makes is filed in a database and looked up again."""

from __future__ import annotations

from pathlib import Path

import pytest

from datagen.registry import generate
from experiments.measure import MeasureSettings, database_name, measure
from store.profiledb import add_measured, load_database
from tests.test_profiledb import MEASURED_DB
from workloads.hostrecord import available_cpus, cpu_model


@pytest.fixture(scope="module")
def dlrm_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dlrm")
    generate("dlrm", path, 2_000_000, seed=0, workers=1, force=True)
    return path


def test_measure_times_each_phase_of_real_steps(dlrm_data: Path, tmp_path: Path) -> None:
    settings = MeasureSettings(batch_sizes=(64, 128), warmup=1, min_steps=3, max_seconds=5)
    lines: list[str] = []
    profile, _ = measure("dlrm", dlrm_data, settings, progress=lines.append, command="test")
    assert [p.b for p in profile.table] == [64, 128]
    batches = [line for line in lines if line.startswith("batch ")]
    assert len(batches) == 2 and all("forward" in line and "h2d" in line for line in batches)
    assert lines[-1].startswith("host: ") and "reference" in lines[-1]
    for point in profile.table:
        assert point.n >= 3 and point.mean > 0
        assert None not in (point.h2d, point.forward, point.backward, point.optimizer)
        parts = point.forward + point.backward + point.optimizer
        # the compute is the three parts and the loss read-back; the copy is not in it
        assert 0 < parts <= point.mean
        assert (point.peak_bytes, point.persistent_bytes) == (None, None)  # CPU: no card
    split = profile.split
    assert split is not None
    assert split.forward + split.backward + split.optimizer == pytest.approx(1.0)
    assert split.optimizer > 0
    assert profile.memory is None and profile.model_transfer_s == 0.0
    assert profile.measured["device"].startswith("CPU")
    assert database_name(profile) == "cpu"
    # where it was measured: this host, the job's threads, a reference of the host's speed
    host = profile.host
    assert host["accelerator"] == "cpu" and host["threads"] == available_cpus()
    assert host["cpu_model"] == cpu_model() and host["reference_s"] > 0

    db = tmp_path / "db.toml"
    db.write_text(MEASURED_DB)
    add_measured(profile, "cpu-test", path=db)
    entry = load_database(db).lookup("cpu-test", "dlrm", 128)
    assert entry.compute_s == profile.table[1].mean
    assert entry.forward_s == profile.table[1].forward
    emulated = entry.to_sleep_profile("dlrm").split
    assert emulated is not None and emulated.forward == pytest.approx(
        point.forward / parts, rel=1e-9
    )


def test_measure_with_the_loader_beside_the_steps(dlrm_data: Path) -> None:
    """workers: the loader's workers read beside the timed steps, as in the job, and are gone
    after the measurement."""
    import multiprocessing

    settings = MeasureSettings(batch_sizes=(64,), warmup=1, min_steps=3, max_seconds=3, workers=2)
    profile, _ = measure("dlrm", dlrm_data, settings, command="test")
    assert profile.table[0].n >= 3 and profile.measured["settings"]["workers"] == 2
    assert multiprocessing.active_children() == []
