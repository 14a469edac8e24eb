"""The storage node: an image dataset's samples over gRPC, preprocessed as far as asked.

    python -m workloads.sophon.server --data DIR [--port 50051] [--prep-workers N]
    ./cli.py storage-server --data DIR --port 50051 --prep-workers N      # the same, on a host

Serves the folder layout of ``./cli.py datagen images`` (``workloads.images.files``) through the
``SampleStore`` service of ``protos/data_transfer.proto``:

- ``Describe``: classes, and per split the labels and file sizes; the preprocessing workers and
  the CPUs they may use (:func:`usable_cpus`: the container's CPU quota when lower);
- ``Fetch``: samples of one split at the stage each request kind asks for (raw file bytes, the
  normalised tensor, the decoded + cropped + flipped RGB image, or a stage per sample),
  streamed in the order asked, with the random draws of the training node's own pipeline
  (:mod:`workloads.sophon.stages`);
- ``Profile``: every sample's size after each transform and each transform's CPU time, measured
  here (the selective policy's input);
- ``Probe``: a stream of as many bytes as asked (the client times it: the link's bandwidth).

Preprocessing runs in a pool of ``--prep-workers`` processes (the storage node's CPUs), forked
before the gRPC server starts (gRPC's threads must not be forked); the gRPC handler threads
only hand work to the pool and stream results, a few samples ahead per request
(:data:`AHEAD_PER_WORKER`), so a client that goes away leaves little work behind.

Bad requests never stop the server: an unknown split, stage or size is ``INVALID_ARGUMENT``, a
sample index out of range ``OUT_OF_RANGE``, a file that cannot be read or decoded
``DATA_LOSS`` (naming the file), a client gone mid-stream ends its stream only. SIGTERM or
SIGINT stops it cleanly: no new calls, running ones get :data:`GRACE_S` to finish, the pool is
closed, exit status 0.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import UserError
from workloads.images.dataset import read_whole
from workloads.images.files import ImageData, ImageSample, load_image_data
from workloads.sophon import rpc
from workloads.sophon.stages import (
    FLIPPED,
    RAW,
    TENSOR,
    Piece,
    advance,
    stage_bytes,
    step,
    to_wire,
)

DEFAULT_PORT = 50051
#: Samples each request may have in the pool per preprocessing worker.
AHEAD_PER_WORKER = 2
#: Samples one Fetch or Profile request may ask for.
MAX_INDICES = 65536
#: Bytes one Probe may ask for.
MAX_PROBE_BYTES = 256 << 20
PROBE_CHUNK = 256 << 10
#: Seconds running calls get to finish after SIGTERM.
GRACE_S = 3.0
#: Seconds one sample may take in the pool before its request fails.
SAMPLE_TIMEOUT_S = 120.0
#: Seconds between looks at a waited-for sample's client and the server's state.
POLL_S = 0.2
SPLITS = ("train", "val")


def cpu_quota() -> float | None:
    """The CPUs this process's cgroup may use (cgroup v2 ``cpu.max`` or v1 CFS quota), or None
    when it has no quota."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    for base in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct")):
        try:
            quota_us = int((base / "cpu.cfs_quota_us").read_text())
            period_us = int((base / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota_us / period_us if quota_us > 0 else None
    return None


def usable_cpus(workers: int) -> float:
    """CPUs ``workers`` preprocessing processes can use here: the fewest of the workers, the
    CPUs of this process's affinity mask and its cgroup's quota."""
    cpus = float(min(workers, len(os.sched_getaffinity(0))))
    quota = cpu_quota()
    return min(cpus, quota) if quota is not None else cpus


# ---------------------------------------------------------------------------------------------
# The pool's side: a worker process preprocesses one sample per call.

#: The dataset, set in the parent before the pool is forked (its workers inherit it).
_DATA: ImageData | None = None


def _sample(split: str, index: int) -> ImageSample:
    assert _DATA is not None
    return (_DATA.train if split == "train" else _DATA.val)[index]  # type: ignore[return-value]


def prepare(
    split: str, index: int, stage: int, seed: int, epoch: int, size: int, train: bool
) -> tuple[int, bytes, int, int, int, int, int]:
    """Sample ``index`` of ``split`` taken to ``stage``: (label, data, height, width, source
    height, source width, CPU ns). UserError when its file cannot be read or decoded."""
    t0 = time.thread_time_ns()
    sample = _sample(split, index)
    raw = read_whole(sample.path)
    rng = np.random.default_rng([seed, epoch, index])
    piece, _ = advance(Piece(RAW, raw), stage, size, train, rng, str(sample.path))
    data, height, width = to_wire(piece)
    source = piece.source or (0, 0)
    return sample.label, data, height, width, source[1], source[0], time.thread_time_ns() - t0


def profile(
    split: str, index: int, seed: int, size: int, train: bool
) -> tuple[list[int], list[int]]:
    """Sample ``index``'s size at every stage and the CPU ns of every transform (epoch 0's
    draws), with the file's read counted in the decode."""
    t0 = time.thread_time_ns()
    sample = _sample(split, index)
    raw = read_whole(sample.path)
    read_ns = time.thread_time_ns() - t0
    rng = np.random.default_rng([seed, 0, index])
    piece = Piece(RAW, raw)
    sizes = [len(raw)]
    times = []
    for _ in range(TENSOR):
        t = time.thread_time_ns()
        piece = step(piece, size, train, rng, str(sample.path))
        times.append(time.thread_time_ns() - t)
        sizes.append(stage_bytes(piece))
    times[0] += read_ns
    return sizes, times


def _ignore_interrupts() -> None:
    """In a pool worker: Ctrl-C reaches the whole process group, and the server (the parent)
    stops the pool itself; the workers must not die of it first, each with a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# ---------------------------------------------------------------------------------------------
# The server


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """How to serve: the dataset directory, the address, the preprocessing processes and the
    gRPC handler threads (concurrent calls)."""

    data: Path
    port: int = DEFAULT_PORT
    prep_workers: int = 1
    grpc_workers: int = 16
    host: str = "[::]"

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise UserError(f"--port must be 0..65535, got {self.port}")
        if self.prep_workers < 1:
            raise UserError(f"--prep-workers must be at least 1, got {self.prep_workers}")
        if self.grpc_workers < 1:
            raise UserError(f"--grpc-workers must be at least 1, got {self.grpc_workers}")


def load_served_data(data_dir: Path) -> ImageData:
    """The dataset to serve (folder layout only); UserError naming the problem."""
    data = load_image_data(data_dir)
    if data.layout != "folder":
        raise UserError(
            f"{data_dir} is a grouped image dataset: the storage server serves the folder "
            "layout (generate one without --group-size)"
        )
    if not data.train:
        raise UserError(f"{data_dir} has no training images: ./cli.py datagen images")
    return data


def _servicer_type() -> type:
    pb2, pb2_grpc = rpc.modules()
    import grpc

    class Servicer(pb2_grpc.SampleStoreServicer):  # type: ignore[misc,name-defined]
        def __init__(
            self, data: ImageData, pool: Any, workers: int, cpus: float, closing: threading.Event
        ) -> None:
            self.data = data
            self.pool = pool
            self.closing = closing  # set when the server stops
            self.workers = workers
            self.cpus = cpus
            self.ahead = max(2, AHEAD_PER_WORKER * workers)
            self.info = pb2.DatasetInfo(
                classes=list(data.classes),
                train=_split_info(pb2, data.train),
                val=_split_info(pb2, data.val),
                prep_workers=workers,
                cpus=cpus,
            )

        def Describe(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC's names)
            return self.info

        def _check(self, context: Any, split: str, indices: list[int], size: int) -> None:
            if split not in SPLITS:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown split {split!r}")
            n = len(self.data.train if split == "train" else self.data.val)
            if len(indices) > MAX_INDICES:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{len(indices)} samples in one request; ask for at most {MAX_INDICES}",
                )
            bad = [i for i in indices if i >= n]
            if bad:
                context.abort(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"no sample {bad[0]} in split {split} ({n} samples)",
                )
            if not 8 <= size <= 4096:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"image_size must be 8..4096, got {size}"
                )

        def _stream(
            self, context: Any, calls: Iterator[tuple[Callable[..., Any], tuple[Any, ...]]]
        ) -> Iterator[Any]:
            """Results of ``calls`` run in the pool, in order, a few ahead; DATA_LOSS when a
            sample's file is bad; stops when the client has gone."""
            pending: collections.deque[Any] = collections.deque()
            calls = iter(calls)
            exhausted = False
            while True:
                while not exhausted and len(pending) < self.ahead:
                    call = next(calls, None)
                    if call is None:
                        exhausted = True
                        break
                    pending.append(self.pool.apply_async(call[0], call[1]))
                if not pending:
                    return
                result = pending.popleft()
                # Waited for in slices: a client gone or the server stopping (its pool
                # terminated: the result never comes) ends the stream at once, and no handler
                # thread is left waiting for the whole timeout to let the process exit.
                deadline = time.monotonic() + SAMPLE_TIMEOUT_S
                while not result.ready():
                    if not context.is_active() or self.closing.is_set():
                        return
                    if time.monotonic() > deadline:
                        context.abort(
                            grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"a sample took more than {SAMPLE_TIMEOUT_S:.0f} s to preprocess",
                        )
                    result.wait(POLL_S)
                try:
                    yield result.get(0)
                except UserError as exc:
                    context.abort(grpc.StatusCode.DATA_LOSS, str(exc))

        def Fetch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
            indices = list(request.indices)
            self._check(context, request.split, indices, request.image_size)
            mode = request.mode
            if mode == pb2.SELECTIVE:
                stages = list(request.stages)
                if len(stages) != len(indices):
                    context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"a selective request needs one stage per sample: {len(indices)} "
                        f"samples, {len(stages)} stages",
                    )
                if any(not RAW <= s <= TENSOR for s in stages):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unknown stage")
            elif mode in (pb2.NO_OFFLOAD, pb2.ALL_OFFLOAD, pb2.PARTIAL_OFFLOAD):
                fixed = {pb2.NO_OFFLOAD: RAW, pb2.ALL_OFFLOAD: TENSOR}.get(mode, FLIPPED)
                stages = [fixed] * len(indices)
            else:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown mode {mode}")
            args = (request.seed, request.epoch, request.image_size, request.train)
            calls = (
                (prepare, (request.split, i, s, *args))
                for i, s in zip(indices, stages, strict=True)
            )
            for (i, s), result in zip(
                zip(indices, stages, strict=True), self._stream(context, calls), strict=False
            ):
                label, data, height, width, src_h, src_w, cpu_ns = result
                yield pb2.Sample(
                    index=i,
                    label=label,
                    stage=s,
                    data=data,
                    height=height,
                    width=width,
                    source_height=src_h,
                    source_width=src_w,
                    cpu_ns=cpu_ns,
                )

        def Profile(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
            n = len(self.data.train if request.split == "train" else self.data.val)
            indices = list(request.indices) or list(range(n))
            self._check(context, request.split, indices, request.image_size)
            args = (request.seed, request.image_size, request.train)
            calls = ((profile, (request.split, i, *args)) for i in indices)
            for i, (sizes, times) in zip(indices, self._stream(context, calls), strict=False):
                yield pb2.SampleProfile(index=i, bytes_after=sizes, cpu_ns=times)

        def Probe(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
            if request.bytes > MAX_PROBE_BYTES:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"a probe may ask for at most {MAX_PROBE_BYTES} bytes, got {request.bytes}",
                )
            left = request.bytes
            while left > 0 and context.is_active():
                n = min(left, PROBE_CHUNK)
                yield pb2.ProbeChunk(data=_PROBE_BYTES[:n])
                left -= n

    return Servicer


# Incompressible bytes for probes (random, drawn once).
_PROBE_BYTES = os.urandom(PROBE_CHUNK)


def _split_info(pb2: Any, samples: Any) -> Any:
    sizes = []
    for s in samples:
        try:
            sizes.append(s.path.stat().st_size)
        except OSError:
            sizes.append(0)  # reported when fetched (DATA_LOSS)
    return pb2.SplitInfo(samples=len(samples), labels=[s.label for s in samples], raw_bytes=sizes)


class StorageServer:
    """A running server (:meth:`start`), stopped by :meth:`stop`; ``port`` is the bound port."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.data = load_served_data(config.data)
        self.cpus = usable_cpus(config.prep_workers)
        self.port = 0
        self._pool: Any = None
        self._server: Any = None
        self._closing = threading.Event()

    def start(self) -> int:
        """Fork the pool, then start gRPC; return the bound port."""
        import grpc

        global _DATA
        _DATA = self.data
        # Fork before gRPC's threads exist; the workers inherit the dataset listing.
        self._pool = multiprocessing.get_context("fork").Pool(
            self.config.prep_workers, initializer=_ignore_interrupts
        )
        servicer = _servicer_type()(
            self.data, self._pool, self.config.prep_workers, self.cpus, self._closing
        )
        _, pb2_grpc = rpc.modules()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.config.grpc_workers),
            options=[("grpc.so_reuseport", 0)],
        )
        pb2_grpc.add_SampleStoreServicer_to_server(servicer, self._server)
        address = f"{self.config.host}:{self.config.port}"
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError:
            self.port = 0
        if not self.port:
            self._pool.terminate()
            raise UserError(f"cannot listen on {address}: is the port in use?")
        self._server.start()
        return self.port

    def stop(self, grace_s: float = GRACE_S) -> None:
        """Refuse new calls, give running ones ``grace_s``, then close the pool (the calls still
        waiting for it end)."""
        if self._server is not None:
            self._server.stop(grace_s).wait()
        self._closing.set()
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()


def serve(config: ServerConfig, announce: Callable[[str], None] = print) -> None:
    """Serve until SIGTERM or SIGINT, then stop cleanly (see the module doc)."""
    server = StorageServer(config)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        port = server.start()
        announce(
            f"serving {len(server.data.train)} train and {len(server.data.val)} val images of "
            f"{config.data} on port {port} with {config.prep_workers} preprocessing worker(s) "
            f"({server.cpus:g} CPUs)"
        )
        while not stop.wait(0.5):
            pass
        announce("stopping")
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workloads.sophon.server", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--data", type=Path, required=True, help="image dataset (folder layout)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--prep-workers", type=int, default=1, help="preprocessing processes")
    parser.add_argument("--grpc-workers", type=int, default=16, help="concurrent calls")
    args = parser.parse_args(argv)
    try:
        config = ServerConfig(args.data, args.port, args.prep_workers, args.grpc_workers)
        serve(config, announce=lambda line: print(line, flush=True))
    except UserError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
