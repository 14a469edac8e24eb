"""Every file a command reads, cut short or edited into nonsense: the command says which file
and what to do in one line, exits 1 and prints no traceback; nothing it reads is taken for
whole. (Datasets cut short: tests/test_datagen_unet3d.py; tracer output: test_ingest_fuzz.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import UserError
from tests.conftest import REPO, run_cli
from tests.synthetic import make_run
from workloads.profile import default_profile, load_profile


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


#: (the run's file damaged, the commands run on it, what the one line names)
CASES = [
    ("manifest.json", [["show"], ["report"], ["export"], ["ingest"]], "manifest.json is damaged"),
    ("events.parquet", [["report"], ["export"]], "cannot read {run}/events.parquet"),
    ("samples.parquet", [["plot", "timeline"], ["compare", "{good}"]], "cannot read {run}/samples.parquet"),
    ("phases.parquet", [["plot", "breakdown"], ["report"]], "cannot read {run}/phases.parquet"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "commands", "says"), CASES, ids=[c[0] for c in CASES])
def test_a_run_file_cut_short_is_one_line_naming_it(
    tmp_path: Path, name: str, commands: list[list[str]], says: str
) -> None:
    good = make_run(tmp_path / "runs", "20261121-163005-unet3d-sleep-0001")
    run = make_run(tmp_path / "runs", "20261121-163006-unet3d-sleep-0002")
    _cut(run / name)
    for command in commands:
        args = [a.format(good=good) for a in command]
        out = ["--out", str(tmp_path / "out.html")] if command[0] in ("plot", "export") else []
        done = run_cli(*args, str(run), *out)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("Error: ") and says.format(run=run) in last, (command, last)
    # The index lists the damaged run beside the good one and exits 1.
    done = run_cli("runs", "--out", str(tmp_path / "runs"))
    if name == "manifest.json":
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert "completed" in done.stdout and "damaged" in done.stdout + done.stderr


def test_a_profile_or_experiment_file_cut_short_is_one_line(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    default_profile("bert").save(profile)
    load_profile(profile)
    _cut(profile)
    with pytest.raises(UserError, match=f"sleep profile {profile} is not valid JSON"):
        load_profile(profile)
    spec = tmp_path / "grid.toml"
    spec.write_text(Path(REPO / "experiments" / "timelines.toml").read_text())
    _cut(spec)
    done = run_cli("experiment", "run", str(spec), "--dry-run")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"Error: experiment file {spec} ")
