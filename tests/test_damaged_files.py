"""Every file a command reads, cut short or edited into nonsense: the command says which file
and what to do in one line, exits 1 and prints no traceback; nothing it reads is taken for
whole. (Datasets cut short: tests/test_datagen_unet3d.py; tracer output: test_ingest_fuzz.py.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from core.errors import UserError
from tests.conftest import REPO, error_line, refused_unet3d_trace, run_cli
from tests.synthetic import make_run
from workloads.data import MANIFEST_NAME, MARKER_NAME, check_manifest
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
    assert error_line(done).startswith(f"Error: experiment file {spec} ")


def _edit_manifest(data: Path, change: Callable[[dict], None]) -> None:
    path = data / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


#: (what is done to a whole dataset after its generation, what the one line says)
LIES: list[tuple[str, Callable[[Path], None], str]] = [
    ("a file cut short", lambda d: _cut(d / "part-0.bin"), "{d}/part-0.bin has 100 bytes, manifest.json says 200: the dataset was changed after it was generated"),
    ("a file removed", lambda d: (d / "part-1.bin").unlink(), "{d}/part-1.bin is missing, though manifest.json lists it"),
    ("the total edited", lambda d: _edit_manifest(d, lambda m: m.update(total_bytes=1)), "{d}/manifest.json says its dataset holds 1 bytes, its files sum to 400: it was edited"),
    ("an entry's size edited", lambda d: _edit_manifest(d, lambda m: m["files"][0].update(bytes=300)), "{d}/part-0.bin has 200 bytes, manifest.json says 300"),
    ("an entry without its size", lambda d: _edit_manifest(d, lambda m: m["files"][0].pop("bytes")), "{d}/manifest.json has a file entry without its name and bytes"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "lie", "says"), LIES, ids=[c[0] for c in LIES])
def test_a_dataset_changed_after_its_generation_is_refused_before_a_run(
    tmp_path: Path, what: str, lie: Callable[[Path], None], says: str
) -> None:
    """A dataset whose manifest stays valid JSON but no longer tells the truth about its files:
    the host's check before a run (tracing/request.py) names what differs and says to generate
    it again; the same dataset untouched passes."""
    data = tmp_path / "data"
    data.mkdir()
    (data / MARKER_NAME).write_text("")
    files = []
    for i in range(2):
        (data / f"part-{i}.bin").write_bytes(bytes(200))
        files.append({"name": f"part-{i}.bin", "bytes": 200})
    (data / MANIFEST_NAME).write_text(json.dumps({"files": files, "total_bytes": 400}))
    check_manifest(data, "dlrm")
    lie(data)
    with pytest.raises(UserError) as caught:
        check_manifest(data, "dlrm")
    message = str(caught.value)
    assert message.startswith(says.format(d=data)), message
    assert message.endswith(f"generate it again with ./cli.py datagen dlrm --out {data} --force")


@pytest.mark.docker
@pytest.mark.integration
def test_trace_refuses_a_dataset_whose_manifest_was_edited(
    images: object, tiny_unet3d: Path, tmp_path: Path
) -> None:
    """The same check at work in `trace`: one line, exit 1, no run directory."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(tiny_unet3d, data)
    _edit_manifest(data, lambda m: m.update(total_bytes=m["total_bytes"] + 1))
    last = refused_unet3d_trace(data, tmp_path / "runs")
    assert last.startswith(f"Error: {data / MANIFEST_NAME} says its dataset holds "), last
    assert last.endswith(f"generate it again with ./cli.py datagen unet3d --out {data} --force")
