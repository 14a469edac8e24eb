"""Profiles that know where they were measured (workloads/hostrecord.py), this host's CPU
measured once and cached (store/hostprofiles.py, experiments/hostprofile.py), and the
warning when a CPU profile is used on another host."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest

from core.errors import UserError
from datagen.registry import generate
from experiments.hostprofile import ensure_host_profile, prepare_emulation
from store import hostprofiles
from store.hostprofiles import (
    ForeignProfileWarning,
    current_host,
    find_host_profile,
    host_cpu_profile,
    save_host_profile,
    warn_if_foreign,
)
from store.profiledb import default_database, lookup, sleep_profile_for
from workloads.hostrecord import REFERENCE_TOLERANCE, HostRecord, foreign_warning, this_host
from workloads.profile import Linear, Normal, SleepProfile, TablePoint, load_profile

EPYC = HostRecord("AMD EPYC", 2, 2, "2.13.0+cpu", reference_s=0.030)


@pytest.fixture
def host_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "host-profiles"
    monkeypatch.setenv(hostprofiles.ENV, str(folder))
    return folder


def profile_on(host: HostRecord | None, workload: str = "dlrm", batch: int = 64) -> SleepProfile:
    return SleepProfile(
        workload=workload,
        accelerator="CPU: test",
        source="made in the test",
        compute=Normal(mean=Linear(b=0.001)),
        table=(TablePoint(g=1, b=batch, mean=0.064, std=0.001, n=8),),
        measured={"device": "CPU: test"},
        host=host.to_dict() if host is not None else None,
    )


def test_a_host_record_says_what_differs() -> None:
    assert EPYC.differences(EPYC) == []
    xeon = dataclasses.replace(EPYC, cpu_model="Intel(R) Xeon(R) Processor @ 2.50GHz")
    assert EPYC.differences(xeon) == [
        "CPU Intel(R) Xeon(R) Processor @ 2.50GHz here, AMD EPYC there"
    ]
    more = dataclasses.replace(EPYC, cpus=8, threads=8, torch="2.14.0")
    assert len(EPYC.differences(more)) == 3
    # The same name but another speed: the reference measurement tells them apart.
    slower = dataclasses.replace(EPYC, reference_s=0.030 * 1.9)
    assert EPYC.differences(slower) == ["the reference runs 1.90x as long here"]
    close = dataclasses.replace(EPYC, reference_s=0.030 * (1 + REFERENCE_TOLERANCE / 2))
    assert EPYC.differences(close) == []
    # A record without its reference cannot be told from another host of the same name.
    unmeasured = dataclasses.replace(EPYC, reference_s=None)
    assert "no reference measurement" in unmeasured.differences(EPYC)[0]
    # A GPU's compute is the card's: its host's CPU does not matter.
    gpu = dataclasses.replace(EPYC, accelerator="NVIDIA H100 80GB HBM3")
    assert gpu.differences(xeon) == []


def test_a_host_record_round_trips_and_bad_ones_are_named() -> None:
    assert HostRecord.from_dict(json.loads(json.dumps(EPYC.to_dict()))) == EPYC
    assert EPYC.key() == HostRecord.from_dict(EPYC.to_dict()).key()
    assert EPYC.key() != dataclasses.replace(EPYC, threads=1).key()
    with pytest.raises(UserError, match="host: missing torch"):
        HostRecord.from_dict({"cpu_model": "x", "cpus": 1, "threads": 1}, "host")
    with pytest.raises(UserError, match="unknown key 'gpu'"):
        HostRecord.from_dict({**EPYC.to_dict(), "gpu": 1})
    data = profile_on(EPYC).to_dict()
    assert SleepProfile.from_dict(json.loads(json.dumps(data))).host == EPYC.to_dict()
    data["host"] = {"cpu_model": "x"}
    with pytest.raises(UserError, match="p.json: host: missing cpus, threads, torch"):
        SleepProfile.from_dict(data, "p.json")


def test_this_host_is_measured() -> None:
    here = this_host()
    assert here.on_cpu and here.cpus >= 1 and here.threads == here.cpus
    assert here.reference_s is not None and 0 < here.reference_s < 5
    assert this_host(reference=False).reference_s is None


def test_a_foreign_profile_warns_in_one_line_with_the_fix() -> None:
    here = current_host(2, reference=True)
    other = dataclasses.replace(here, cpu_model="Another CPU")
    line = foreign_warning(other.to_dict(), "the profile P", here, "measure this host")
    assert line is not None and "\n" not in line
    assert line.startswith("the profile P was measured on another host (Another CPU, 2 CPUs")
    assert line.endswith(": measure this host")
    assert foreign_warning(here.to_dict(), "P", here, "fix") is None
    assert foreign_warning(None, "P", here, "fix") is None  # nothing recorded: a GPU's source
    with pytest.warns(ForeignProfileWarning, match="on another host .*--accelerator cpu"):
        assert warn_if_foreign(profile_on(other), 2, hostprofiles.foreign_fix("dlrm", 64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_foreign(profile_on(here), 2, "fix") is None
        assert warn_if_foreign(profile_on(None), 2, "fix") is None


def test_the_shipped_cpu_profiles_are_foreign_to_a_host_that_cannot_be_compared() -> None:
    """The shipped EPYC entries carry no reference: on any host they warn."""
    profile = lookup("epyc-2t", "unet3d", 2).to_sleep_profile("unet3d")
    with pytest.warns(ForeignProfileWarning, match="AMD EPYC"):
        warn_if_foreign(profile, 2, "fix")
    # GPU profiles (GPEmu, MLPerf Storage) do not depend on the host
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_foreign(lookup("a100", "resnet50", 64).to_sleep_profile("resnet50"), 2, "fix")


def test_this_hosts_cpu_comes_from_the_host_cache(host_cache: Path) -> None:
    with pytest.raises(
        UserError, match="cpu is this host's CPU, measured here.*--batch-sizes 32,64"
    ):
        sleep_profile_for("dlrm", "cpu", 64)
    here = current_host(hostprofiles.rank_threads(1))
    saved = save_host_profile(profile_on(here), None)
    assert saved.parent == host_cache / here.key() and saved.name == "dlrm-default-b64.json"
    assert find_host_profile("dlrm", 64, None, here) == saved
    assert find_host_profile("dlrm", 32, None, here) is None  # no row at that batch
    assert find_host_profile("dlrm", 64, {"embedding_dim": 8}, here) is None  # other options
    assert sleep_profile_for("dlrm", "cpu", 64).host == here.to_dict()
    assert sleep_profile_for("dlrm", "CPU", 64).table[0].mean == 0.064
    # two ranks: each computes with its share of the cores, as measured for that share
    two = host_cpu_profile("dlrm", 64, accelerators=2, threads=here.threads)
    assert [p.g for p in two.table] == [2]
    # `./cli.py profiles` lists this host's measurements as accelerator cpu, source host
    (row,) = default_database().describe_coverage("cpu", "dlrm")["coverage"]
    assert (row["accelerator"], row["source_id"], row["batch_min"]) == ("cpu", "host", 64)
    assert row["accelerator_name"].startswith("this host: ")
    # a file of another host in this host's folder is not taken
    other = dataclasses.replace(here, cpu_model="Another CPU")
    stray = profile_on(other, batch=128)
    (host_cache / here.key() / "dlrm-default-b128.json").write_text(json.dumps(stray.to_dict()))
    assert find_host_profile("dlrm", 128, None, here) is None
    with pytest.raises(UserError, match="own model"):
        host_cpu_profile("resnet18", 8, model="vgg16")


@pytest.mark.integration
def test_this_host_is_measured_once_and_then_found(host_cache: Path, tmp_path: Path) -> None:
    """The first run that emulates this host's CPU measures it on its dataset; the next one
    finds it."""
    data = tmp_path / "dlrm"
    generate("dlrm", data, 2_000_000, seed=0, workers=1, force=True)
    lines: list[str] = []
    settings = {"batch_size": 64, "workers": 0, "max_steps": 3}
    prepare_emulation("dlrm", "cpu", data, settings, None, lines.append)
    assert lines[0].startswith("measuring this host's CPU for dlrm at batch 32, 64")
    assert "once: later runs on this host use it" in lines[0]
    (path,) = (host_cache).rglob("*.json")
    profile = load_profile(path)
    assert sorted(p.b for p in profile.table) == [32, 64]
    assert profile.host is not None and profile.host["reference_s"] > 0
    assert f"--data {data}" in profile.measured["command"]
    again: list[str] = []
    assert ensure_host_profile("dlrm", data, 64, log=again.append) == path
    assert again == []
    prepare_emulation("dlrm", "v100", data, settings, None, again.append)  # a GPU: nothing
    assert again == []
