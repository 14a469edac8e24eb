"""This host's own CPU profiles: ``--accelerator cpu`` means the CPU the run is on.

A profile measured on a CPU describes that CPU only (:mod:`workloads.hostrecord`), so the
profile database's ``cpu`` is not a table shipped with the code: it is this host's measurement,
made once by ``./cli.py profile measure --db`` (or by ``trace``, an experiment or a study the
first time they need it: ``experiments/hostprofile.py``) and cached by the host's record.

The cache is a folder per host identity (:meth:`HostRecord.key`) under
:func:`host_profiles_dir`, a file per measurement, ``<model>-<options digest>-b<batch
sizes>.json``: a profile of ``profile measure`` (``trace`` measures the run's batch and half of
it: the line between them gives a last, shorter batch of an epoch). A lookup takes a file of
the model and options with a row at the batch. Host side only, like the profile database.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from core.atomic import atomic_write_text
from core.errors import UserError
from workloads.hostrecord import HostRecord, available_cpus, this_host
from workloads.profile import SleepProfile, load_profile

#: The accelerator key of this host's CPU in the profile database.
HOST_CPU = "cpu"

#: Where the host profiles go, unless TWINTRACE_HOST_PROFILES names a folder.
ENV = "TWINTRACE_HOST_PROFILES"


def host_profiles_dir() -> Path:
    """``$TWINTRACE_HOST_PROFILES``, else ``$XDG_CACHE_HOME/twintrace/host-profiles``, else
    ``~/.cache/twintrace/host-profiles``."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "twintrace" / "host-profiles"


def rank_threads(accelerators: int, threads: int | None = None) -> int:
    """The torch threads a rank computes with on this host (the workloads' rule: the config's
    ``threads``, else the CPUs it may use shared among the ranks)."""
    return int(threads or max(1, available_cpus() // max(1, accelerators)))


@functools.cache
def current_host(threads: int, reference: bool = False) -> HostRecord:
    """This host's record for jobs of ``threads`` torch threads (with the reference
    measurement when asked; once per process)."""
    return this_host(threads=threads, reference=reference)


def options_digest(options: Mapping[str, Any] | None) -> str:
    """A short digest of the workload options ("" for none): the compute depends on them."""
    if not options:
        return ""
    text = json.dumps({str(k): str(v) for k, v in options.items()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def host_profile_path(
    model: str, batches: tuple[int, ...], options: Mapping[str, Any] | None, host: HostRecord
) -> Path:
    """Where a profile of ``model`` measured at ``batches`` with ``options`` on ``host`` is
    cached: ``<host key>/<model>-<options digest or "default">-b<batches>.json``."""
    sizes = "_".join(str(int(b)) for b in sorted(set(batches)))
    name = f"{model}-{options_digest(options) or 'default'}-b{sizes}.json"
    return host_profiles_dir() / host.key() / name


def measure_batches(batch: int) -> tuple[int, ...]:
    """The batch sizes a host profile for ``batch`` is measured at: it and half of it."""
    return tuple(sorted({max(1, int(batch) // 2), int(batch)}))


def _cached(host: HostRecord, pattern: str = "*.json") -> Iterator[tuple[Path, SleepProfile]]:
    """The cached profiles of ``host``'s identity (files named by ``pattern``), with their
    files; a file of another identity in the folder is not one of them."""
    for path in sorted((host_profiles_dir() / host.key()).glob(pattern)):
        profile = load_profile(path)
        if profile.host is not None and (
            HostRecord.from_dict(profile.host).identity() == host.identity()
        ):
            yield path, profile


def _find(
    model: str, batch: int, options: Mapping[str, Any] | None, host: HostRecord
) -> tuple[Path, SleepProfile] | None:
    pattern = f"{model}-{options_digest(options) or 'default'}-b*.json"
    for path, profile in _cached(host, pattern):
        if any(p.g == 1 and p.b == int(batch) for p in profile.table):
            return path, profile
    return None


def find_host_profile(
    model: str, batch: int, options: Mapping[str, Any] | None, host: HostRecord
) -> Path | None:
    """The cached profile file of ``model`` with ``options`` on this host with a measured row
    at ``batch``, None when there is none (files of another host identity are not taken)."""
    found = _find(model, batch, options, host)
    return None if found is None else found[0]


def save_host_profile(profile: SleepProfile, options: Mapping[str, Any] | None) -> Path:
    """File a profile measured on this host (its ``host`` record says so) in the cache;
    return the file."""
    if profile.host is None:
        raise UserError("only a profile measured with its host record can be cached")
    host = HostRecord.from_dict(profile.host)
    if not host.on_cpu:
        raise UserError("the host cache holds CPU profiles; file a GPU's in the database")
    batches = tuple(p.b for p in profile.table)
    path = host_profile_path(profile.workload, batches, options, host)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(profile.to_dict(), indent=2) + "\n")
    return path


def measure_command(workload: str, batch: int, data: str = "DIR") -> str:
    sizes = ",".join(map(str, measure_batches(batch)))
    return (
        f"./cli.py profile measure --workload {workload} --data {data} --batch-sizes {sizes} --db"
    )


def check_host_model(workload: str, model: str | None) -> None:
    """This host's CPU is measured on the workload's own model: another is a UserError."""
    if model is not None and model.strip().lower() != workload:
        raise UserError(
            f"the host's CPU is measured on the workload's own model: --profile-model {model} "
            f"cannot be emulated on {HOST_CPU} (measure it by training {model} for real)"
        )


def host_cpu_profile(
    workload: str,
    batch: int,
    accelerators: int = 1,
    model: str | None = None,
    options: Mapping[str, Any] | None = None,
    threads: int | None = None,
) -> SleepProfile:
    """The sleep profile of ``workload`` emulating this host's CPU at per-rank ``batch`` with
    ``accelerators`` ranks: the cached measurement, its table's points moved to the run's
    rank count (each rank computes with its share of the cores, as measured). A UserError
    with the command that measures it when there is none yet."""
    check_host_model(workload, model)
    host = current_host(rank_threads(accelerators, threads))
    found = _find(workload, batch, options, host)
    if found is None:
        raise UserError(
            f"{HOST_CPU} is this host's CPU, measured here, and {workload} at batch {batch} "
            f"has not been measured on it ({host.describe()}): run "
            f"`{measure_command(workload, batch)}`, or trace with --data (it measures once)"
        )
    _, profile = found
    if accelerators > 1:
        table = tuple(dataclasses.replace(p, g=int(accelerators)) for p in profile.table)
        profile = dataclasses.replace(profile, table=table)
    return profile


class ForeignProfileWarning(UserWarning):
    """A CPU profile used on a host other than the one it was measured on."""


def warn_if_foreign(profile: SleepProfile, threads: int, fix: str) -> str | None:
    """Warn (:class:`ForeignProfileWarning`, one line ending with ``fix``) when ``profile`` was
    measured on a CPU other than this host's for jobs of ``threads`` torch threads, or this
    host now runs the reference measurably slower or faster; return the line (None: not
    foreign). GPU profiles and profiles without a host record are not checked."""
    import warnings

    from workloads.hostrecord import foreign_warning

    if profile.host is None or profile.host.get("accelerator", "cpu") != "cpu":
        return None
    here = current_host(threads, reference=True)
    what = f"the sleep profile of {profile.workload} ({profile.accelerator})"
    line = foreign_warning(profile.host, what, here, fix)
    if line is not None:
        warnings.warn(line, ForeignProfileWarning, stacklevel=2)
    return line


def foreign_fix(workload: str, batch: int) -> str:
    """What to do about a foreign CPU profile."""
    return (
        f"emulate this host's CPU with --accelerator {HOST_CPU} (measured here once), or "
        f"`{measure_command(workload, batch)}`"
    )


def host_coverage(model: str | None = None) -> list[dict[str, Any]]:
    """This host's cached measurements (jobs of one rank) as rows of the profile database's
    coverage (:meth:`store.profiledb.ProfileDatabase.coverage`), source ``host``."""
    host = current_host(rank_threads(1))
    rows = []
    for path, profile in _cached(host, f"{model or '*'}-*.json"):
        if model not in (None, profile.workload):
            continue
        sizes = sorted({p.b for p in profile.table if p.g == 1})
        if not sizes:
            continue
        options = (profile.measured or {}).get("options") or {}
        rows.append(
            {
                "accelerator": HOST_CPU,
                "accelerator_name": f"this host: {host.describe()}",
                "capacity_bytes": None,
                "memory": False,
                "model": profile.workload,
                "source_id": "host",
                "kind": "table",
                "batch_min": sizes[0],
                "batch_max": sizes[-1],
                "batch_sizes": len(sizes),
                "measured_max": None,
                "default": True,
                "cite": f"profile measure on this host ({path})",
                "options": dict(options),
            }
        )
    return rows
