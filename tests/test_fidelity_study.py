"""The fidelity measurement as a study (``[study] kind = "fidelity"``): its file validated, its
runs resumed through the study state, its results written with the header, figure and table
every study has. The measurement itself runs for real in tests/test_fidelity.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.errors import UserError
from experiments import fidelity
from experiments.studies import load_study, run_study
from store.rundir import load_run
from tests.synthetic import make_run


def _study(tmp_path: Path, body: str, name: str = "f.toml") -> Path:
    path = tmp_path / name
    path.write_text('[experiment]\nname = "fid"\n\n[study]\nkind = "fidelity"\n' + body)
    return path


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('workloads = ["gpt"]\n', "workloads must be a non-empty list of distinct ones of unet3d"),
        ("rounds = 0\n", "rounds must be a whole number from 1 to 50, got 0"),
        ("colour = 1\n", "unknown key 'colour'"),
        (
            'workloads = ["bert"]\n\n[[datasets]]\nname = "d"\ngenerator = "bert"\nsize = "1MB"\n',
            "makes each workload's small dataset",
        ),
    ],
)
def test_a_bad_fidelity_study_file_is_one_line(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        load_study(_study(tmp_path, body))
    assert "\n" not in str(caught.value)


def _pair() -> dict[str, Any]:
    return {
        "step_error": 0.01,
        "epoch_error": -0.02,
        "overall": 0.96,
        "cost": 0.1,
        "own_step_error": 0.005,
        "fit_step_error": 0.01,
        "requested_s": 0.2,
        "busy_s": 0.2001,
        "late_ms": 0.1,
        "lowest": [["files", 0.9], ["cpu", 0.92]],
    }


def test_the_study_resumes_its_runs_and_writes_its_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []

    def measure(name: str, rounds: int, data_root: Path, work: Path, log: Any, **kw: Any) -> Any:
        def make(key: str) -> Any:
            def run() -> Any:
                made.append(key)
                return load_run(make_run(work, f"20261121-16300{len(made)}-{name}-sleep-abcd"))

            return run

        for key in (f"{name}-instrumented0", f"{name}-round0-original", f"{name}-round0-sleep"):
            kw["keep"](key, make(key))
        return {
            "workload": name,
            "pairs": [_pair() for _ in range(rounds)],
            "step_noise": 0.03,
            "epoch_noise": 0.02,
            "overall_noise": 0.97,
        }

    monkeypatch.setattr(fidelity, "measure_workload", measure)
    study = load_study(_study(tmp_path, 'workloads = ["bert", "dlrm"]\nrounds = 2\n'))
    lines: list[str] = []
    path = run_study(study, tmp_path / "out", log=lines.append)
    assert len(made) == 6  # three runs per workload, each traced once
    result = fidelity.load_results(path)
    assert result["kind"] == "fidelity" and result["schema_version"] == fidelity.SCHEMA_VERSION
    assert result["host"]["hostname"] == "test" and result["git_revision"]
    assert result["settings"] == {
        "workloads": ["bert", "dlrm"],
        "rounds": 2,
        "instrumented_runs": 2,
    }
    assert [w["workload"] for w in result["workloads"]] == ["bert", "dlrm"]
    assert (path.parent / "fidelity.html").stat().st_size > 0
    assert lines[-4].startswith("goals: step_error 0.02") and lines[-3].startswith("bert ")
    # Run again: every run is kept, none traced again.
    again: list[str] = []
    run_study(study, tmp_path / "out", log=again.append)
    assert len(made) == 6
    assert sum("done before, kept" in line for line in again) == 6
