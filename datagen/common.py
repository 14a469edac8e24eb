"""Machinery shared by every dataset generator: output directory, atomic files, parallel writing,
and the dataset manifest.

A generator describes its dataset as a list of independent :class:`FileTask` (one per file, or
one per byte range of a large file that several processes write at once) and runs them through
:class:`datagen.driver.Job`, which checks the request, prepares the directory, hands the tasks
to :func:`run_file_tasks`, then calls :func:`write_manifest`. The contract for a dataset
directory is:

- it holds a ``.twintrace-dataset`` marker (written by :func:`prepare_output_dir`), which is what
  allows ``force`` to clear it later without risking a directory we did not create;
- every data file appears under its final name only once it is complete (written to a hidden
  temporary name in the same directory, :func:`core.atomic.temp_path`, then renamed), so a
  reader never sees half a file;
- ``manifest.json`` is written last. **A dataset directory without ``manifest.json`` is
  incomplete** (interrupted or failed) and must be regenerated with ``force``.

The library never prints: progress goes to a callback, ``progress(done_bytes, total_bytes)``,
which the CLI turns into a progress bar.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import forkserver
from pathlib import Path
from typing import Any, BinaryIO

from core import versioned
from core.atomic import atomic_path, atomic_write_text, temp_path
from core.errors import UserError
from core.units import format_size
from workloads.data import MANIFEST_NAME, MARKER_NAME

SCHEMA_VERSION = 1
#: The dataset manifest (manifest.json, written last: see :func:`write_manifest`).
DATASET = versioned.Layout(
    "dataset manifest",
    SCHEMA_VERSION,
    remedy="regenerate the dataset (with --force to reuse the directory)",
)

ProgressCallback = Callable[[int, int], None]
"""``progress(done_bytes, total_bytes)``: cumulative, called from the calling process only."""

# Workers add to the shared byte counter at most this often (in bytes) so that the lock on it
# is taken a few hundred times per GB, not once per write.
_REPORT_EVERY = 4 << 20
# A large file asks the kernel to start writing back what it holds every this many bytes.
_WRITEBACK_EVERY = 32 << 20
# How often the parent wakes up to call the progress callback.
_POLL_S = 0.2


# --------------------------------------------------------------------------------------------
# Requests


def check_seed(seed: int) -> None:
    """Refuse a seed that is not a whole number >= 0 (every generator)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserError(f"seed must be a whole number >= 0, got {seed!r}")


def check_size_bytes(size_bytes: int) -> None:
    """Refuse a dataset size that is not a positive whole number of bytes (every generator)."""
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int):
        raise UserError(
            f"dataset size must be a whole number of bytes, got {size_bytes!r}: convert text "
            "such as '2GiB' with core.units.parse_size"
        )
    if size_bytes <= 0:
        raise UserError(f"dataset size must be greater than zero, got {size_bytes}")


# --------------------------------------------------------------------------------------------
# Output directory


def check_free_space(out: Path, size_bytes: int, force: bool) -> None:
    """Refuse, in one line and before ``out`` is touched, a dataset of ``size_bytes`` that its
    file system cannot hold: its free space, plus what ``force`` would delete of an earlier
    dataset there. (A file system that fills while the files are written, through another
    writer, is :func:`commands.common.user_errors`' one line; no manifest is written.)"""
    out = Path(out)
    place = out
    while not place.exists() and place != place.parent:
        place = place.parent
    free = shutil.disk_usage(place).free
    if force and out.is_dir() and (out / MARKER_NAME).is_file():
        free += sum(
            entry.stat(follow_symlinks=False).st_size
            for entry in out.rglob("*")
            if entry.is_file() and not entry.is_symlink()
        )
    if free < size_bytes:
        raise UserError(
            f"{out}: its file system has {format_size(free)} free and the dataset needs "
            f"{format_size(size_bytes)}: free some space, write it elsewhere (--out), or give a "
            "smaller --size"
        )


def prepare_output_dir(out: Path, force: bool) -> Path:
    """Create ``out`` for a new dataset and return it.

    An empty or missing directory is used as is. A non-empty one is refused unless ``force``; with
    ``force`` its contents are removed, but only when it holds the ``.twintrace-dataset`` marker of
    an earlier generator run (complete or not), so that a mistyped ``--dir ~ --force`` cannot wipe
    a directory twintrace never wrote. Removal stays inside ``out``: symbolic links are unlinked,
    never followed.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a directory: choose a directory path")
    out.mkdir(parents=True, exist_ok=True)
    entries = [e for e in os.scandir(out) if e.name != MARKER_NAME]
    if entries:
        if not force:
            raise UserError(
                f"{out} is not empty: choose an empty directory or pass --force to replace "
                "its contents"
            )
        if not (out / MARKER_NAME).is_file():
            raise UserError(
                f"{out} is not empty and was not written by twintrace (no {MARKER_NAME} file), "
                "so --force will not delete its contents: choose an empty directory or empty "
                "it yourself"
            )
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
    marker = out / MARKER_NAME
    if not marker.exists():
        marker.write_text(
            "Written by twintrace datagen. `--force` may delete everything in this directory.\n"
        )
    return out


# --------------------------------------------------------------------------------------------
# Atomic files


@contextlib.contextmanager
def atomic_file(
    path: str | os.PathLike[str], fsync: bool = False, writeback: bool = True
) -> Iterator[BinaryIO]:
    """Open a binary file that appears as ``path`` only if the ``with`` block completes.

    :func:`core.atomic.atomic_path` made for a dataset's many files: written under
    :func:`core.atomic.temp_path` in the same directory (which must exist: the writers make
    every directory once, not a mkdir per file), renamed on success, removed on any exception
    (KeyboardInterrupt included), with early write-back. ``fsync`` is off by default: every file of a synthetic dataset
    can be regenerated from its seed, and an fsync per file makes each writer wait for the disk
    between files instead of letting the kernel write back in the background, which costs
    throughput. Without it a *power failure* (not a crash or Ctrl-C) can leave renamed files
    whose data never reached the disk; ``fsync=True`` (core's writer, file and directory
    synced) when that matters. ``writeback``: start writing the completed file to disk at once
    (:func:`start_writeback`); off for a scratch file, which is read back soon and then deleted.
    """
    if fsync:
        with atomic_path(path, fsync=True) as tmp, open(tmp, "wb") as f:
            yield f
        return
    tmp = temp_path(path)
    f = open(tmp, "wb")  # noqa: SIM115 - closed on both paths below
    try:
        yield f
        f.flush()
        if writeback:
            start_writeback(f.fileno())
        f.close()
        os.replace(tmp, path)
    except BaseException:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def start_writeback(fd: int) -> None:
    """Have the kernel start writing the file's dirty pages to disk now, without waiting.

    By default write-back starts only once dirty data passes a share of memory (gigabytes) or
    is 30 s old, so a generator would fill the page cache at CPU speed and leave the disk idle,
    then wait for all of it at the end (``sync``). Started early, the disk works while the CPU
    makes the next files. ``POSIX_FADV_DONTNEED`` starts the write-back of dirty pages (and
    drops the pages already clean: a generated dataset is not read back by the generator).
    """
    with contextlib.suppress(OSError, AttributeError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


# --------------------------------------------------------------------------------------------
# Parallel file writing


class TaskCancelled(Exception):
    """Raised inside a writing task when the run is being stopped (another task failed, Ctrl-C)."""


class FileSink:
    """What a task writes its file through.

    It counts the bytes (the manifest's size of the file), reports progress in batches, and
    raises :class:`TaskCancelled` at the next write once the run is being stopped, so a large
    file is abandoned within one chunk rather than finished. With ``limit`` (the length of a
    part of a shared file) a write that would go past it raises ValueError instead of
    overwriting the next part.
    """

    def __init__(
        self,
        file: BinaryIO,
        on_bytes: Callable[[int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        limit: int | None = None,
    ) -> None:
        self._file = file
        self._on_bytes = on_bytes
        self._should_stop = should_stop
        self._limit = limit
        self._unreported = 0
        self._since_writeback = 0
        self.bytes_written = 0

    def write(self, data: Any) -> None:
        """Write a bytes-like object (bytes, memoryview, C-contiguous numpy array) in full."""
        if self._should_stop is not None and self._should_stop():
            raise TaskCancelled("stopped because the run is being cancelled")
        n = memoryview(data).nbytes
        if self._limit is not None and self.bytes_written + n > self._limit:
            # A bug in the task's write function, not a user mistake.
            raise ValueError(
                f"write of {n} bytes after {self.bytes_written} goes past the part's "
                f"{self._limit} bytes"
            )
        # BufferedWriter.write loops until everything is written; large writes bypass its buffer,
        # so a numpy array goes to the kernel without an extra copy.
        self._file.write(data)
        self.bytes_written += n
        self._unreported += n
        self._since_writeback += n
        if self._unreported >= _REPORT_EVERY:
            self.report()
        if self._since_writeback >= _WRITEBACK_EVERY:
            self._file.flush()
            start_writeback(self._file.fileno())
            self._since_writeback = 0

    def report(self) -> None:
        """Pass the bytes written since the last report to ``on_bytes``."""
        if self._on_bytes is not None and self._unreported:
            self._on_bytes(self._unreported)
        self._unreported = 0


WriteFn = Callable[..., dict[str, Any]]
"""``write(sink, *args) -> metadata``: writes one file through ``sink``; the returned dict (for
example ``{"shape": [...], "dtype": "float32"}``) is merged into the file's manifest entry.
Must be a module-level function so that it can be sent to a worker process."""


@dataclass(frozen=True)
class FileTask:
    """One file of a dataset: its relative name, the function that writes it and its arguments.

    ``size_hint`` is the expected size in bytes, used only for the progress total.

    ``part=(offset, length)`` makes the task write only bytes ``[offset, offset + length)`` of
    ``name``, a file that several tasks (the same name, each with a part) write in parallel;
    their parts must cover the file exactly, with no gap or overlap, and each task must write
    exactly ``length`` bytes. ``after`` names scratch files (see :func:`run_file_tasks`) the
    task reads: it starts once they are complete. See :func:`run_file_tasks`.
    """

    name: str
    write: WriteFn
    args: tuple[Any, ...] = ()
    size_hint: int = 0
    part: tuple[int, int] | None = None
    after: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.part is not None:
            offset, length = self.part
            if offset < 0 or length < 1:
                raise ValueError(f"invalid part {self.part!r} of {self.name!r}")
        # Plain string checks (a plan may hold tens of thousands of tasks): a relative POSIX
        # name whose components are neither empty nor hidden, so not "", "/x", "a//b", "../x".
        if self.name == MANIFEST_NAME or any(
            p in ("", ".", "..") or p.startswith(".") for p in self.name.split("/")
        ):
            # A bug in a generator, not a user mistake: names are built by code.
            raise ValueError(f"invalid dataset file name {self.name!r}")


def default_workers() -> int:
    """The default number of writer processes: the CPUs this process may run on."""
    count = getattr(os, "process_cpu_count", os.cpu_count)()
    return max(1, count or 1)


def run_file_tasks(
    out: Path,
    tasks: Sequence[FileTask],
    workers: int | None = None,
    progress: ProgressCallback | None = None,
    fsync: bool = False,
    scratch: Sequence[FileTask] = (),
    scratch_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """Write every task's file into ``out`` using ``workers`` processes; return their records.

    Each record is ``{"name", "bytes", **metadata}``, one per file in the order in which
    ``tasks`` first name it. Files are written atomically (:func:`atomic_file`). On the first
    failure, or on KeyboardInterrupt, the tasks not yet started are cancelled, running ones stop
    at their next write, every temporary file is removed, and the exception is re-raised: files
    already completed stay (whole), and since no manifest is written the directory is an
    incomplete dataset.

    A file written in parts (tasks sharing its name, each with ``part=(offset, length)``) is
    created here first under its temporary name and sized to its total length, so every part can
    be written in place by any worker without waiting for the others; it is renamed to its final
    name by this process once its last part is done, and its record is ``{"name", "bytes",
    "parts": count, **metadata}``, the parts' metadata merged in task order. One large file is
    thus written at the speed of several processes, with the same guarantees as any other.

    ``scratch`` tasks write intermediate files into ``scratch_dir`` (the caller's to remove):
    they are not part of the dataset, have no record and no share of the progress. A task whose
    ``after`` names scratch files starts once those are complete. Scratch tasks start in order,
    and dataset tasks whose scratch files are ready go first, so the disk is already writing the
    dataset while later scratch files are being made (at most two pieces of work per worker are
    queued at a time).

    Workers are started with forkserver (spawn where unavailable), so, as with any
    multiprocessing code, the program's main script must guard its entry point with
    ``if __name__ == "__main__":``; task functions must be importable module-level functions.
    """
    out = Path(out)
    if workers is None:
        workers = default_workers()
    if workers < 1:
        raise UserError(f"workers must be at least 1, got {workers}")
    shared = _shared_file_sizes(tasks)
    names = list(dict.fromkeys(t.name for t in tasks))
    total = sum(t.size_hint for t in tasks)
    order = _scratch_order(tasks, scratch, scratch_dir)
    if not tasks:
        return []

    # forkserver (spawn where unavailable), not fork: the CLI may run a progress-bar thread, and
    # forking a multi-threaded process can deadlock a child on a lock held by another thread.
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        set_worker_preload({t.write.__module__ for t in (*tasks, *scratch)})
    stop = ctx.Event()
    counter = ctx.Value(ctypes.c_int64, 0)
    # Dataset tasks in the order their scratch files become ready (stable: the order of
    # ``tasks`` otherwise), batched; each batch waits for the scratch files of all its tasks.
    batches = task_batches(sorted(tasks, key=lambda t: max(map(order.get, t.after), default=-1)))
    needs = [frozenset(n for t in batch for n in t.after) for batch in batches]
    workers = min(workers, len(batches) + len(scratch))
    executor = ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(stop, counter)
    )
    # Temporary names of the shared files: this process's pid, since it creates and renames them.
    shared_temp = {name: temp_path(out / name) for name in shared}
    parts_left = {name: sum(1 for t in tasks if t.name == name) for name in shared}
    results: dict[int, list[dict[str, Any]]] = {}
    # What is queued or running: the index of a dataset batch, or the name of a scratch file.
    running: dict[Future[list[dict[str, Any]]], int | str] = {}
    waiting = list(range(len(batches)))
    scratch_left = list(scratch)
    scratch_done: set[str] = set()
    interrupted = False

    def submit_ready() -> None:
        # Ready dataset batches first, then the next scratch file, up to two per worker.
        while len(running) < 2 * workers:
            ready = next((i for i in waiting if needs[i] <= scratch_done), None)
            if ready is not None:
                waiting.remove(ready)
                batch = batches[ready]
                temp = shared_temp[batch[0].name] if batch[0].part is not None else None
                fut = executor.submit(_run_tasks, str(out), batch, fsync, temp)
                running[fut] = ready
            elif scratch_left:
                task = scratch_left.pop(0)
                fut = executor.submit(_run_tasks, str(scratch_dir), [task], fsync, None, True)
                running[fut] = task.name
            else:
                return

    succeeded = False
    try:
        # Starting the fork server (once per process) and submitting start the workers.
        with _sigint_deferred():
            if method == "forkserver":
                _start_fork_server()
            # Every directory once, here, rather than a mkdir call per file in the workers.
            for directory in {os.path.dirname(name) for name in names}:
                (out / directory).mkdir(parents=True, exist_ok=True)
            for name, size in shared.items():
                _create_sized(shared_temp[name], size)
            submit_ready()
        while running:
            done, _ = wait(running, timeout=_POLL_S, return_when=FIRST_COMPLETED)
            errors = [exc for fut in done if (exc := fut.exception()) is not None]
            # Rename the shared files whose last part is done before raising a failure seen in
            # the same round, as a worker renames its completed file: it is whole and stays.
            for fut in done:
                key = running.pop(fut)
                if fut.exception() is not None:
                    continue
                if isinstance(key, str):
                    scratch_done.add(key)
                    continue
                results[key] = fut.result()
                name = batches[key][0].name
                if name in parts_left:
                    parts_left[name] -= 1
                    if parts_left[name] == 0:
                        _finish_shared(shared_temp[name], out / name, fsync)
            if errors:
                raise errors[0]
            with _sigint_deferred():
                submit_ready()
            if progress is not None:
                progress(min(counter.value, total), total)
        succeeded = True
    finally:
        if not succeeded:
            stop.set()
        while True:
            try:
                executor.shutdown(wait=True, cancel_futures=True)
                break
            except KeyboardInterrupt:
                # A Ctrl-C now must not skip the clean-up; it is short, since every worker stops
                # at its next write. After the last file it is raised once the pool is down.
                interrupted = True
        if not succeeded:
            # Workers remove their own temporary file when they stop; this catches the file of a
            # worker that died without cleaning up (killed, out of memory), and the shared files,
            # which belong to this process.
            remove_temp_files(out, names)
            if scratch_dir is not None:
                remove_temp_files(scratch_dir, [t.name for t in scratch])
    if interrupted:  # Ctrl-C as the last files were done: they stay, no manifest is written
        raise KeyboardInterrupt
    # In batch order, so that the parts of a shared file merge in task order.
    records = _file_records(names, [r for i in sorted(results) for r in results[i]])
    if progress is not None:
        written = sum(r["bytes"] for r in records)
        progress(written, max(total, written))
    return records


# Every module asked for so far: the fork server preloads their union (see set_worker_preload).
_preload: set[str] = {__name__}
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def set_worker_preload(modules: Iterable[str]) -> list[str]:
    """Have the fork server import ``modules`` (and what they list in ``WORKER_PRELOAD``).

    Workers fork from the server with numpy, the writers and their compiled kernels already
    loaded, instead of each paying the imports (~0.4 s, ~1 s more for numba). Calls add up, and
    only take effect while the server is not running yet (it starts with the first worker): a
    program that will run several generators calls this first with all their modules. Returns
    the preload list.
    """
    for name in modules:
        _preload.add(name)
        module = sys.modules.get(name) or importlib.import_module(name)
        _preload.update(getattr(module, "WORKER_PRELOAD", ()))
    preload = ["__main__", *sorted(_preload)]
    mp.get_context("forkserver").set_forkserver_preload(preload)
    return preload


def _start_fork_server() -> None:
    """Start the fork server now (if it is not running) with the repository importable.

    The server imports its preload with the default sys.path (Python 3.11 drops the one it is
    given) and skips a module it cannot import, so started from another working directory it
    would silently preload nothing. It inherits the environment: the repository is put on
    PYTHONPATH for its start only.
    """
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO, saved) if p)
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def _scratch_order(
    tasks: Sequence[FileTask], scratch: Sequence[FileTask], scratch_dir: Path | None
) -> dict[str, int]:
    """Position of each scratch file; checks that the scratch tasks fit the dataset tasks."""
    order = {t.name: i for i, t in enumerate(scratch)}
    # Bugs in a generator, not user mistakes: tasks are built by code.
    if scratch and scratch_dir is None:
        raise ValueError("scratch tasks need a scratch_dir")
    if len(order) != len(scratch) or any(t.part is not None or t.after for t in scratch):
        raise ValueError("scratch files must have distinct names, no parts and no prerequisites")
    for task in tasks:
        unknown = [n for n in task.after if n not in order]
        if unknown:
            raise ValueError(f"{task.name!r} waits for {unknown}, which no scratch task writes")
    return order


def _shared_file_sizes(tasks: Sequence[FileTask]) -> dict[str, int]:
    """Size of each file written in parts; checks that names and parts fit together."""
    by_name: dict[str, list[FileTask]] = {}
    for task in tasks:
        by_name.setdefault(task.name, []).append(task)
    sizes = {}
    for name, group in by_name.items():
        parted = [t.part for t in group if t.part is not None]
        if not parted:
            if len(group) > 1:
                raise ValueError(f"two tasks write the same file {name!r}")
            continue
        if len(parted) != len(group):
            raise ValueError(f"{name!r} is written both whole and in parts")
        end = 0
        for offset, length in sorted(parted):
            if offset != end:
                raise ValueError(f"the parts of {name!r} leave a gap or overlap at byte {end}")
            end += length
        sizes[name] = end
    return sizes


def _create_sized(path: str | os.PathLike[str], size: int) -> None:
    # ftruncate gives a sparse file, not allocated blocks: posix_fallocate would write zeros
    # itself on file systems without fallocate support, costing a full extra pass over the disk.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _finish_shared(tmp: str | os.PathLike[str], path: Path, fsync: bool) -> None:
    # Only here, with every part written by its worker: the file appears whole or not at all.
    if not fsync:
        os.replace(tmp, path)
        return
    # core's writer syncs the file and its directory: hand it the file under its own temporary
    # name (one more rename, once per shared file).
    with atomic_path(path, fsync=True) as durable:
        os.replace(tmp, durable)


def _file_records(names: list[str], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for result in results:
        part = result.pop("_part", None)
        record = merged.get(result["name"])
        if record is None:
            merged[result["name"]] = {**result, **({"parts": 1} if part is not None else {})}
        else:
            record.update({k: v for k, v in result.items() if k != "bytes"})
            record["bytes"] += result["bytes"]
            record["parts"] += 1
    return [merged[name] for name in names]


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C while worker processes start, and deliver it once they have.

    A KeyboardInterrupt raised in the middle of starting a process (the parent waiting for the
    fork server's reply) can leave a half-started worker behind that keeps the pool from shutting
    down. SIGINT is also blocked meanwhile: the signal mask is inherited across fork and exec, so
    a fork server started now, and every worker it forks, never receives Ctrl-C, even in the
    instant before the worker's initializer ignores it. The parent alone stops them (see
    ``run_file_tasks``).
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be changed from the main thread
        return
    held = False

    def hold(signum: int, frame: object) -> None:
        nonlocal held
        held = True

    previous = signal.signal(signal.SIGINT, hold)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        # Unblocking delivers a pending SIGINT: to `hold`, or to `previous` once restored.
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        signal.signal(signal.SIGINT, previous)
    if held and previous is not signal.SIG_IGN:
        if callable(previous):
            previous(signal.SIGINT, None)
        else:  # SIG_DFL would end the process; end the run the usual Python way instead
            raise KeyboardInterrupt


def remove_temp_files(out: Path, names: Sequence[str]) -> None:
    """Remove the temporary files that writing ``names`` (relative to ``out``) may have left.

    Those are named by :func:`core.atomic.temp_path`: ``.NAME.PID.TOKEN.tmp`` next to ``NAME``.
    """
    by_dir: dict[Path, set[str]] = {}
    for name in names:
        path = out / name
        by_dir.setdefault(path.parent, set()).add(path.name)
    for directory, files in by_dir.items():
        if not directory.is_dir():
            continue
        for entry in os.scandir(directory):
            if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
                continue
            parts = entry.name[1:-4].rsplit(".", 2)  # NAME, PID, TOKEN
            if len(parts) == 3 and parts[1].isdigit() and parts[0] in files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


# State of one worker process, set once by its initializer: the pool gives no other way to hand
# a process-shared Event/Value to the tasks (they cannot be pickled with each task).
_worker_stop: Any = None
_worker_counter: Any = None


def _init_worker(stop: Any, counter: Any) -> None:
    global _worker_stop, _worker_counter
    # Ctrl-C reaches the whole process group; the parent alone decides to stop, and tells the
    # workers through `stop`, so a worker is never interrupted between two arbitrary bytecodes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_stop, _worker_counter = stop, counter


def _add_bytes(n: int) -> None:
    with _worker_counter.get_lock():
        _worker_counter.value += n


# Small whole files go to the workers in batches: a future per file costs an inter-process round
# trip (pickling the task, the result, a wake-up) that dominates when files are ~100 KB images.
_BATCH_FILES = 64
_BATCH_BYTES = 16 << 20


def task_batches(tasks: Sequence[FileTask]) -> list[list[FileTask]]:
    """Consecutive whole-file tasks grouped up to 64 files or 16 MiB; parts stay alone."""
    batches: list[list[FileTask]] = []
    current: list[FileTask] = []
    size = 0
    for task in tasks:
        if task.part is not None:
            if current:
                batches.append(current)
                current, size = [], 0
            batches.append([task])
            continue
        current.append(task)
        size += task.size_hint
        if len(current) >= _BATCH_FILES or size >= _BATCH_BYTES:
            batches.append(current)
            current, size = [], 0
    if current:
        batches.append(current)
    return batches


def _run_tasks(
    out: str, batch: list[FileTask], fsync: bool, shared_temp: Path | None, scratch: bool = False
) -> list[dict[str, Any]]:
    return [_run_task(out, task, fsync, shared_temp, scratch) for task in batch]


def _run_task(
    out: str, task: FileTask, fsync: bool, shared_temp: Path | None, scratch: bool = False
) -> dict[str, Any]:
    if task.part is not None and shared_temp is not None:
        return _run_part(task, task.part, shared_temp)
    # Its directory exists (run_file_tasks made it). A scratch file is not part of the
    # dataset: no progress, no early write-back.
    path = os.path.join(out, task.name)
    with atomic_file(path, fsync=fsync and not scratch, writeback=not scratch) as f:
        on_bytes = None if scratch else _add_bytes
        sink = FileSink(f, on_bytes=on_bytes, should_stop=_worker_stop.is_set)
        meta = task.write(sink, *task.args)
        sink.report()
    return {"name": task.name, "bytes": sink.bytes_written, **meta}


def _run_part(task: FileTask, part: tuple[int, int], shared_temp: Path) -> dict[str, Any]:
    offset, length = part
    # No O_CREAT: the parent created and sized the file; if it is gone, the run was stopped.
    fd = os.open(shared_temp, os.O_WRONLY | os.O_CLOEXEC)
    # Opening a descriptor does not truncate, whatever the mode; the parent removes the file on
    # failure and renames it (and fsyncs it when asked) once every part is done.
    with open(fd, "wb") as f:
        f.seek(offset)
        sink = FileSink(f, on_bytes=_add_bytes, should_stop=_worker_stop.is_set, limit=length)
        meta = task.write(sink, *task.args)
        sink.report()
        f.flush()
        start_writeback(f.fileno())
    if sink.bytes_written != length:
        raise ValueError(
            f"the task for bytes {offset}-{offset + length} of {task.name!r} wrote "
            f"{sink.bytes_written} bytes instead of {length}"
        )
    return {"name": task.name, "bytes": sink.bytes_written, "_part": offset, **meta}


# --------------------------------------------------------------------------------------------
# Manifest


def write_manifest(
    out: Path,
    generator: str,
    seed: int,
    requested_bytes: int,
    files: list[dict[str, Any]],
    params: dict[str, Any],
    duration_s: float,
    fsync: bool = False,
) -> dict[str, Any]:
    """Write ``manifest.json`` into ``out`` atomically and return it.

    Call it last, after every data file is in place: its presence is what marks the dataset
    complete. ``created_at`` is the UTC time the dataset was completed (now).
    """
    manifest = versioned.stamp(
        DATASET,
        {
            "generator": generator,
            "seed": seed,
            "requested_bytes": requested_bytes,
            "total_bytes": sum(f["bytes"] for f in files),
            "files": files,
            "params": params,
            "duration_s": round(duration_s, 3),
        },
    )
    # Indented, but one line per file: json's C encoder only runs without indentation, and the
    # Python one costs ~50 us per file entry (a second per 20,000 images).
    text = json.dumps({**manifest, "files": []}, indent=2)
    entries = ",\n".join("    " + json.dumps(f) for f in files)
    if entries:
        text = text.replace('"files": []', '"files": [\n' + entries + "\n  ]", 1)
    atomic_write_text(Path(out) / MANIFEST_NAME, text + "\n", fsync=fsync)
    return manifest


def load_manifest(directory: Path) -> dict[str, Any]:
    """Read and check the manifest of the dataset in ``directory``.

    Raises UserError when the manifest is missing (the dataset is incomplete: its generation was
    interrupted or failed), unreadable, or of a schema version this twintrace does not know.
    """
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        raise UserError(
            f"{directory} has no {MANIFEST_NAME}: it is not a twintrace dataset, or its "
            "generation did not finish; regenerate it (with --force to reuse the directory)"
        )
    manifest = versioned.load_json(path, DATASET)
    for key in ("generator", "files", "total_bytes"):
        if key not in manifest:
            raise UserError(f"{path} lacks {key!r}: the file is damaged; regenerate the dataset")
    return manifest
