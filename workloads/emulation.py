"""The sleep variant's emulated accelerator: a step's compute replaced by the times of a
:class:`~workloads.profile.SleepProfile`, its host-side I/O kept real.

:class:`SleepCompute` stands where :class:`workloads.training.ModelCompute` runs the real model,
with the same methods, so the training loop (``workloads/training.py``) drives both alike. Around
it: the reproducible draws of a rank's emulated times (:func:`emulation_rng`,
:func:`draw_step`); the page-locked staging a GPU job's pin-memory thread does
(:class:`PinnedStaging`, :class:`StagedBatches`); and the lock of an emulated accelerator that
the jobs of several containers share (:class:`SharedAccelerator`: with
``TWINTRACE_SHARED_ACCELERATOR`` (:data:`SHARED_ACCELERATOR_ENV`) naming a lock file that they
all see, a step's emulated compute holds the file's lock, so the jobs' computations run one at
a time as B processes time-slice one GPU; the wait for it is ``accelerator_wait``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import mmap
import os
import queue
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from core.errors import UserError
from workloads.loaders import batches_of
from workloads.profile import SleepProfile, Stratified

if TYPE_CHECKING:
    from workloads.training import Marks, Task

#: The lock file of an emulated accelerator shared by the jobs of several containers (module
#: doc): a path every one of them sees.
SHARED_ACCELERATOR_ENV = "TWINTRACE_SHARED_ACCELERATOR"


class SleepCompute:
    """Emulated computation driven by a :class:`SleepProfile`; the model never runs.

    Per training step, in the order and under the names of a real (instrumented) step:

    - the batches reach the step through :meth:`feed`: a thread copies each into page-locked
      host memory (:class:`StagedBatches`) as it arrives from the loader, as a GPU job's
      DataLoader pins them in its pin-memory thread, off the step's path;
    - ``load_batch_gpu``: the step waits the profile's host-to-device time;
    - before the first step, ``framework_warmup``: one step of the real model on the meta
      device (no memory, no compute), so that the emulated run loads the framework code, and
      reads the library files, that a real job loads in its first step; ``model_transfer``:
      the profile's model copy time; and the card's memory is checked: a peak above its
      capacity fails like a real out-of-memory;
    - ``model_forward_pass``, ``model_backward_pass``, ``model_optim_step``: the compute time,
      split as the profile says (one ``accelerator_busy`` interval spans them all);
    - with several ranks, ``sync_wait``: a real all-reduce through torch.distributed (gloo), so
      every rank waits for the slowest, as DDP's gradient all-reduce makes it; then
      ``all_reduce``: the modelled time of the gradient all-reduce itself
      (:class:`workloads.profile.Collective`);
    - on an accelerator shared with other containers' jobs (:data:`SHARED_ACCELERATOR_ENV`),
      ``accelerator_wait`` before the compute: until the others' computations let go of it.

    ``model`` is only kept to write realistic checkpoints (``torch.save`` of its untrained
    state_dict) when the profile does not set ``checkpoint_bytes``.
    """

    def __init__(
        self,
        task: Task,
        profile: SleepProfile,
        accelerators: int,
        seed: int,
        rank: int,
        model: nn.Module | None,
        distributed: bool = False,
    ) -> None:
        self.task = task
        self.profile = profile
        self.accelerators = accelerators
        self.rng = emulation_rng(seed, rank)
        self.model = model
        self.distributed = distributed
        self.staging = PinnedStaging()  # resized by feed() to the loader's batches in flight
        self._shared = shared_accelerator()
        self._meta = self._meta_model()
        self._eval_batches = 0
        self._first = True
        self.gradient_bytes = 0
        if distributed:
            given = profile.collective.gradient_bytes
            if given is None:  # 4 bytes per parameter, counted on the meta model made above
                given = 4 * (
                    sum(p.numel() for p in self._meta[0].parameters())
                    if self._meta is not None
                    else parameter_count(task)
                )
            self.gradient_bytes = given

    def _batch(self, batch: Any) -> int:
        return self.profile.profile_batch(self.task.batch_samples(batch), self.accelerators)

    def _meta_model(self) -> tuple[nn.Module, torch.optim.Optimizer] | None:
        """The real model and optimizer on the meta device (shapes only: no memory), made
        where a real run makes its own (at start-up), so that the emulated run imports what
        the real one imports then (the optimizer's modules, for instance)."""
        try:
            with torch.device("meta"):
                model = self.task.build_model(0)
            return model, self.task.make_optimizer(model.parameters())
        except Exception as exc:  # any model: the emulation goes on without it
            self._meta_failed(exc)
            return None

    @staticmethod
    def _meta_failed(exc: BaseException) -> None:
        print(
            f"twintrace: the emulated model cannot run on the meta device ({exc!r}); the "
            "emulated run will not load the framework code a real step loads",
            file=sys.stderr,
            flush=True,
        )

    def _framework_step(self, batch: Any, marks: Marks) -> None:
        """One training step of the real model on the meta device (no compute), before the
        first step: the framework code a real first step runs, and the library files it
        reads, are loaded by the emulated run too (``framework_warmup``)."""
        if self._meta is None:
            return
        t0 = time.monotonic_ns()
        model, optimizer = self._meta
        try:
            on_meta = self.task.to_device(batch, torch.device("meta"))
            self.task.loss(self.task.forward(model, on_meta), on_meta).backward()
            optimizer.step()
        except Exception as exc:  # any model: the emulation goes on without this step
            self._meta_failed(exc)
        self._meta = None
        marks.append(("framework_warmup", t0, time.monotonic_ns()))

    def _first_step(self, b: int, marks: Marks) -> None:
        """Model transfer and the memory check, once, before the first step."""
        memory = self.profile.memory
        if memory is not None:
            need = memory.peak(self.accelerators, b)
            if need > memory.capacity_bytes:
                raise UserError(
                    f"out of memory on the emulated {self.profile.accelerator}: a training step "
                    f"of batch {b} needs {need / 2**30:.2f} GiB, the card has "
                    f"{memory.capacity_bytes / 2**30:.2f} GiB "
                    f"({memory.persistent_bytes / 2**30:.2f} GiB kept between steps): use a "
                    "smaller batch size or a card with more memory"
                )
        if self.profile.model_transfer_s > 0:
            t0 = time.monotonic_ns()
            time.sleep(self.profile.model_transfer_s)
            marks.append(("model_transfer", t0, time.monotonic_ns()))

    def feed(self, loader: DataLoader[Any]) -> Iterator[Any]:
        """``loader``'s batches, each staged in page-locked memory before the step takes it,
        where a GPU job's DataLoader pins it: with workers, by a thread that runs as far ahead
        as the loader's batches in flight (``prefetch_factor`` x workers;
        :class:`StagedBatches`); without, in the step's own thread as it takes the batch."""
        workers = loader.num_workers
        ahead = (loader.prefetch_factor or 2) * workers if workers else 0
        if self.staging.slots != ahead + 1:
            self.staging.close()
            self.staging = PinnedStaging(slots=ahead + 1)  # the step's batch, those ahead
        if not ahead:
            return _staged_inline(batches_of(loader), self.staging)
        return StagedBatches(batches_of(loader), self.staging, depth=ahead)

    def stage_once(self, batch: Any) -> None:
        """Stage the one batch of a synthetic run (pinned once, as the real loader pins it)."""
        self.staging.stage(batch)

    def train_step(self, batch: Any, marks: Marks) -> None:
        """Wait the host-to-device time, then the compute time (the batch is staged)."""
        b = self._batch(batch)
        first, self._first = self._first, False
        if first:
            self._framework_step(batch, marks)
            self._first_step(b, marks)
        t0 = time.monotonic_ns()
        h2d, compute = draw_step(self.profile, self.rng, self.accelerators, b, first)
        _sleep_until(t0 + int(h2d * 1e9))
        t1 = time.monotonic_ns()
        marks.append(("load_batch_gpu", t0, t1))
        with self._shared.hold(marks):
            t2 = self._compute(compute, marks)
        if self.distributed:
            # A real collective: the ranks meet here, and the fastest waits for the slowest;
            # then the modelled time of the gradient all-reduce itself.
            dist.all_reduce(torch.zeros(1))
            t3 = time.monotonic_ns()
            marks.append(("sync_wait", t2, t3))
            seconds = self.profile.collective.seconds(self.accelerators, self.gradient_bytes)
            _sleep_until(t3 + int(seconds * 1e9))
            marks.append(("all_reduce", t3, time.monotonic_ns()))

    def _compute(self, compute: float, marks: Marks) -> int:
        """Sleep the emulated compute of one step from now, split as the profile says; returns
        when it ended (ns)."""
        t1 = time.monotonic_ns()
        split = self.profile.split
        parts: list[tuple[str, float]] = []
        if split is not None:
            parts = [("model_forward_pass", split.forward), ("model_backward_pass", split.backward)]
            if split.optimizer > 0:
                parts.append(("model_optim_step", split.optimizer))
        end = t1 + int(compute * 1e9)
        start = t1
        for key, share in parts:
            stop = min(end, start + int(compute * share * 1e9))
            _sleep_until(stop)
            marks.append((key, start, stop))
            start = stop
        _sleep_until(end)
        t2 = time.monotonic_ns()
        marks.append(("accelerator_busy", t1, t2))
        return t2

    def eval_batch(self, batch: Any) -> None:
        """Sleep for the profile's evaluation time of one batch (0 unless it has one)."""
        seconds = self.profile.sample_eval(self.rng.eval, self.accelerators, self._batch(batch))
        if seconds > 0:
            with self._shared.hold([]):
                time.sleep(seconds)
        self._eval_batches += 1

    def eval_result(self) -> dict[str, Any] | None:
        done, self._eval_batches = self._eval_batches, 0
        return {"batches": done} if done else None

    def save_checkpoint(self, path: Path) -> int:
        """Write the model's state_dict, or ``checkpoint_bytes`` random bytes; returns bytes."""
        size = self.profile.checkpoint_bytes
        if size is None:
            assert self.model is not None, "SleepCompute needs a model to save its state_dict"
            torch.save(self.model.state_dict(), path)
            return path.stat().st_size
        # Fresh random chunks: constant data could be compressed or deduplicated by the
        # filesystem and would not cost the I/O a real checkpoint does.
        rng = np.random.default_rng()
        chunk = 8 << 20
        with path.open("wb") as f:
            for offset in range(0, size, chunk):
                f.write(rng.bytes(min(chunk, size - offset)))
        return size


@dataclasses.dataclass
class EmulationDraws:
    """A rank's emulated times (:class:`SleepCompute`): one stratified stream each for the
    host-to-device copies, the training steps' compute and the evaluation batches, so each
    kind of time covers its distribution evenly over a run (:class:`Stratified`)."""

    h2d: Stratified
    compute: Stratified
    eval: Stratified


def emulation_rng(seed: int, rank: int) -> EmulationDraws:
    """The draws of a rank's emulated times, reproducible from (seed, rank)."""
    h2d, compute, evaluation = np.random.default_rng([seed, rank]).spawn(3)
    return EmulationDraws(Stratified(h2d), Stratified(compute), Stratified(evaluation))


def draw_step(
    profile: SleepProfile, rng: EmulationDraws, accelerators: int, b: int, first: bool
) -> tuple[float, float]:
    """(host-to-device, compute) seconds of one emulated training step, in the order the
    emulator draws them; the run's ``first`` step adds the profile's one-off warm-up
    (``first_step_s``) to its compute. Replaying the draws with :func:`emulation_rng` and each
    step's ``b`` gives the times a run requested (``experiments/fidelity.py`` measures the
    emulator's precision against them)."""
    h2d = profile.sample_h2d(rng.h2d, accelerators, b)
    compute = profile.sample(rng.compute, accelerators, b)
    return h2d, compute + (profile.first_step_s if first else 0.0)


def parameter_count(task: Task) -> int:
    """Parameters of the task's model, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = task.build_model(0)
    return sum(p.numel() for p in model.parameters())


def _sleep_until(deadline_ns: int) -> None:
    """Sleep until CLOCK_MONOTONIC reaches ``deadline_ns`` (no-op when it has passed): the
    emulated phases end when the profile says, whatever the work done before took."""
    remaining = deadline_ns - time.monotonic_ns()
    if remaining > 0:
        time.sleep(remaining / 1e9)


class SharedAccelerator:
    """The emulated accelerator's lock when jobs of several containers share it
    (:data:`SHARED_ACCELERATOR_ENV` names a lock file all of them see; ``flock`` on it), or
    nothing to wait for when the variable is unset."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fd: int | None = None
        if path:
            try:
                self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as exc:
                raise UserError(
                    f"the shared accelerator's lock file {path} ({SHARED_ACCELERATOR_ENV}) "
                    f"cannot be opened: {exc.strerror}; mount a writable directory there"
                ) from None

    @contextlib.contextmanager
    def hold(self, marks: Marks) -> Iterator[None]:
        """Hold the accelerator for the block; the wait for it is marked ``accelerator_wait``."""
        if self._fd is None:
            yield
            return
        t0 = time.monotonic_ns()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        marks.append(("accelerator_wait", t0, time.monotonic_ns()))
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)


def shared_accelerator() -> SharedAccelerator:
    """The shared accelerator this process's environment names (module doc), if any."""
    return SharedAccelerator(os.environ.get(SHARED_ACCELERATOR_ENV) or None)


class PinnedStaging:
    """Page-locked host memory holding a batch, as pinned-memory staging buffers hold it
    before a real host-to-device copy (torch cannot pin without an accelerator backend).

    The buffer holds ``slots`` batches, grows to ``slots`` times the largest batch seen and
    stays locked (``mlock``), so the host's memory pressure is real; each :meth:`stage` copies
    the batch's tensors into the next slot (a loader's pinned batches are several: the one
    the step copies to the device and the next one). Where
    RLIMIT_MEMLOCK is lower than a batch (docker's default is 8 MiB, and a daemon without
    CAP_SYS_RESOURCE cannot grant more), as much as the limit allows is locked and the rest is
    resident but unlocked: one warning on stderr says so, and how to raise the limit, and
    :attr:`locked` / :attr:`size` record it.
    """

    def __init__(self, warn: Callable[[str], None] | None = None, slots: int = 1) -> None:
        self.buffer: mmap.mmap | None = None
        self.size = 0  # bytes of the buffer
        self.locked = 0  # bytes of it locked in memory
        self.slots = slots
        self._next = 0  # the slot the next batch goes to
        self.warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._warned = False

    @staticmethod
    def tensors(batch: Any) -> list[torch.Tensor]:
        """The tensors of a batch (nested tuples, lists and dicts)."""
        if isinstance(batch, torch.Tensor):
            return [batch]
        if isinstance(batch, dict):
            batch = list(batch.values())
        if isinstance(batch, list | tuple):
            return [t for item in batch for t in PinnedStaging.tensors(item)]
        return []

    def stage(self, batch: Any) -> int:
        """Copy the batch into the staging buffer; returns its bytes."""
        tensors = [t.detach().contiguous() for t in self.tensors(batch)]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if nbytes == 0:
            return 0
        if nbytes * self.slots > self.size:
            self._grow(nbytes * self.slots)
        assert self.buffer is not None
        slot = self.size // self.slots
        # torch's copy, as a real pin_memory's (parallel for large tensors), where numpy's
        # copies on one thread at a fraction of the speed.
        view = torch.frombuffer(self.buffer, dtype=torch.uint8)
        offset, self._next = self._next * slot, (self._next + 1) % self.slots
        for t in tensors:
            data = t.reshape(-1).view(torch.uint8)
            view[offset : offset + data.numel()].copy_(data)
            offset += data.numel()
        del view  # the mmap cannot be closed while a view of it exists
        return nbytes

    def _grow(self, nbytes: int) -> None:
        self.close()
        buffer = mmap.mmap(-1, nbytes)
        anchor = ctypes.c_char.from_buffer(buffer)
        address = ctypes.addressof(anchor)
        del anchor  # an exported pointer would keep the mmap from being closed
        libc = ctypes.CDLL(None, use_errno=True)
        locked = nbytes
        if libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(nbytes)) != 0:
            err = ctypes.get_errno()
            soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
            if soft != hard:
                resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
            page = mmap.PAGESIZE
            locked = max(0, min(nbytes, hard - locked_bytes()) // page * page)
            if locked and libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(locked)) != 0:
                locked = 0
            if not self._warned:
                self._warned = True
                self.warn(
                    f"twintrace: locked {locked} of the {nbytes} bytes of the emulated "
                    f"host-to-device staging buffer ({os.strerror(err)}; RLIMIT_MEMLOCK is "
                    f"{hard} bytes); the rest is resident but not locked. To lock it all, "
                    "raise the limit: `docker run --ulimit memlock=-1` (./cli.py trace asks for "
                    "it; the Docker daemon must itself run with `ulimit -l unlimited`)"
                )
        self.buffer, self.size, self.locked = buffer, nbytes, locked

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.close()  # unmapping unlocks the pages
            self.buffer, self.size, self.locked = None, 0, 0


def locked_bytes() -> int:
    """Bytes this process has locked in memory now (VmLck)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmLck:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _staged_inline(batches: Iterator[Any], staging: PinnedStaging) -> Iterator[Any]:
    """``batches``, each staged as it is taken: a loader without workers pins in the thread
    that iterates it, on the step's path."""
    try:
        for batch in batches:
            staging.stage(batch)
            yield batch
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


class StagedBatches:
    """A GPU job's pin-memory thread, emulated: a thread takes the loader's batches as they
    come, copies each into page-locked memory (``staging``) and hands it on through a queue
    of ``depth``; the step takes staged batches only, so the copy is off its path, as a real
    DataLoader with ``pin_memory`` pins the next batch while the accelerator computes.

    A loader's error reaches the consumer at the batch where it happened. :meth:`close` stops
    the thread (after the batch it is waiting for, if any) and closes the source.
    """

    def __init__(self, source: Iterator[Any], staging: PinnedStaging, depth: int = 1) -> None:
        self._source = source
        self._staging = staging
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name="twintrace-pin", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for batch in self._source:
                self._staging.stage(batch)
                if not self._put(("batch", batch)):
                    return
            self._put(("end", None))
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(("error", exc))

    def _put(self, item: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> StagedBatches:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == "batch":
            return value
        self._done = True
        self._thread.join()
        if kind == "error":
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the thread and close the source (its workers are shut down now)."""
        self._done = True
        self._stop.set()
        self._thread.join()
        close = getattr(self._source, "close", None)
        if close is not None:
            close()
