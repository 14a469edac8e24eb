"""The training node's side: a torch dataset whose samples come from the storage node over gRPC.

``RemoteImageDataset`` is the remote twin of :class:`workloads.images.dataset.ImageFolderDataset`:
item ``i`` is the same (float32 tensor (3, S, S), int64 label), pixel for pixel, for the same
seed and epoch, whatever part of the pipeline the storage node ran (:mod:`.stages`). The
DataLoader's workers fetch a whole batch per call (``__getitems__``: one ``Fetch`` stream, which
the storage node preprocesses in parallel) and finish each sample's transforms as it arrives.

gRPC and ``fork`` do not mix once a channel exists, and DataLoader workers are forked: each
worker opens its own channel on first use, and the calls the training process itself makes
before training (``Describe``, ``Profile``, ``Probe``: :func:`remote_setup`) run in a forked
helper process, so that the training process never starts gRPC.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from core.errors import UserError
from core.rpc import RECONNECT_OPTIONS
from workloads.events import Emitter
from workloads.loaders import EpochDraws
from workloads.sophon import rpc
from workloads.sophon.policy import SampleProfile
from workloads.sophon.stages import FLIPPED, RAW, TENSOR, advance, from_wire, skip_draws

#: The remote dataset modes (``--set dataset=...``) and the request kind each sends.
MODES: dict[str, str] = {
    "remote-nooff": "NO_OFFLOAD",
    "remote-alloff": "ALL_OFFLOAD",
    "remote-partial": "PARTIAL_OFFLOAD",
    "remote-sophon": "SELECTIVE",
}
#: The stage each fixed mode's samples arrive at.
FIXED_STAGE = {"remote-nooff": RAW, "remote-alloff": TENSOR, "remote-partial": FLIPPED}
#: Seconds the first call waits for the storage node to answer (it may still be starting).
CONNECT_TIMEOUT_S = 180.0
#: Seconds one batch's stream may take, in all.
FETCH_TIMEOUT_S = 900.0
#: The largest message a client accepts (a decoded sample of a very large image).
MAX_MESSAGE_BYTES = 512 << 20


def channel(address: str) -> Any:
    """A gRPC channel to the storage node at ``address`` (``HOST:PORT``)."""
    import grpc

    return grpc.insecure_channel(
        address,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            *RECONNECT_OPTIONS,  # the storage node may still be starting
        ],
    )


def rpc_error(address: str, exc: Any) -> UserError:
    """A gRPC failure as a UserError naming the server, the status and its message."""
    code = exc.code().name if hasattr(exc, "code") and exc.code() else "UNKNOWN"
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return UserError(f"storage server {address}: {code}: {details}")


@dataclasses.dataclass(frozen=True)
class RemoteListing:
    """What ``Describe`` says: classes, per split the labels and file sizes, and the storage
    node's preprocessing workers and usable CPUs."""

    classes: tuple[str, ...]
    labels: dict[str, tuple[int, ...]]
    raw_bytes: dict[str, tuple[int, ...]]
    prep_workers: int
    cpus: float


@dataclasses.dataclass(frozen=True)
class RemoteSetup:
    """What the training process learns before training: the listing, and for the selective
    mode the profile of the training split and the link's measured bandwidth."""

    listing: RemoteListing
    profiles: tuple[SampleProfile, ...] = ()
    bandwidth_bytes_s: float = 0.0
    profile_s: float = 0.0


def describe(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> RemoteListing:
    """The storage node's listing; waits up to ``timeout_s`` for it to answer."""
    import grpc

    pb2, pb2_grpc = rpc.modules()
    with channel(address) as ch:
        try:
            info = pb2_grpc.SampleStoreStub(ch).Describe(
                pb2.DescribeRequest(), timeout=timeout_s, wait_for_ready=True
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise UserError(
                    f"the storage server at {address} did not answer within {timeout_s:.0f} s: "
                    "start it with `./cli.py storage-server --data DIR --port PORT`"
                ) from None
            raise rpc_error(address, exc) from None
    return RemoteListing(
        classes=tuple(info.classes),
        labels={"train": tuple(info.train.labels), "val": tuple(info.val.labels)},
        raw_bytes={"train": tuple(info.train.raw_bytes), "val": tuple(info.val.raw_bytes)},
        prep_workers=info.prep_workers,
        cpus=info.cpus,
    )


def profile_samples(
    address: str, split: str, seed: int, image_size: int, train: bool
) -> list[SampleProfile]:
    """Every sample's profile, measured by the storage node (``Profile``)."""
    import grpc

    pb2, pb2_grpc = rpc.modules()
    request = pb2.ProfileRequest(split=split, seed=seed, image_size=image_size, train=train)
    with channel(address) as ch:
        try:
            return [
                SampleProfile(p.index, tuple(p.bytes_after), tuple(p.cpu_ns))
                for p in pb2_grpc.SampleStoreStub(ch).Profile(request, wait_for_ready=True)
            ]
        except grpc.RpcError as exc:
            raise rpc_error(address, exc) from None


def probe_bandwidth(
    address: str, min_s: float = 0.5, first_bytes: int = 1 << 20, max_bytes: int = 128 << 20
) -> float:
    """The link's bandwidth from the storage node, bytes per second of payload: probes of
    growing size until one takes ``min_s`` (or is ``max_bytes``); the last one's rate."""
    import grpc

    pb2, pb2_grpc = rpc.modules()
    size = first_bytes
    with channel(address) as ch:
        stub = pb2_grpc.SampleStoreStub(ch)
        try:
            stub.Describe(pb2.DescribeRequest(), wait_for_ready=True, timeout=CONNECT_TIMEOUT_S)
            while True:
                t0 = time.monotonic()
                got = sum(len(c.data) for c in stub.Probe(pb2.ProbeRequest(bytes=size)))
                elapsed = max(time.monotonic() - t0, 1e-6)
                if elapsed >= min_s or size >= max_bytes:
                    return got / elapsed
                size = min(max_bytes, size * max(2, math.ceil(min_s / elapsed)))
        except grpc.RpcError as exc:
            raise rpc_error(address, exc) from None


def setup_remote(
    address: str, selective: bool, seed: int, image_size: int, profiles: Sequence[SampleProfile]
) -> RemoteSetup:
    """The listing and, for the selective mode, the training split's profile (``profiles``
    when given, else measured) and the link's bandwidth."""
    listing = describe(address)
    if not selective:
        return RemoteSetup(listing)
    t0 = time.monotonic()
    measured = list(profiles) or profile_samples(address, "train", seed, image_size, True)
    profile_s = 0.0 if profiles else time.monotonic() - t0
    return RemoteSetup(listing, tuple(measured), probe_bandwidth(address), profile_s)


def in_subprocess(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a forked process (its exception re-raised here): gRPC is started there,
    never in the caller, which forks DataLoader workers afterwards."""
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


class RemoteImageDataset(EpochDraws, Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Samples of one split served by the storage node at ``address``.

    ``mode`` is one of :data:`MODES`; for ``remote-sophon``, ``stages[i]`` is the stage sample
    ``i`` is asked at (the policy's plan). ``train``: the training transforms with draws from
    ``default_rng([seed, epoch, i])``, as the local dataset. With an instrumenting ``emitter``,
    each item logs ``sample_load`` (waiting for it on the stream) and ``sample_preproc`` (the
    transforms done here), with metadata ``index=i`` and ``stage``.
    """

    def __init__(
        self,
        address: str,
        split: str,
        labels: Sequence[int],
        mode: str,
        *,
        stages: Sequence[int] | None = None,
        image_size: int = 224,
        train: bool = True,
        seed: int = 0,
        emitter: Emitter | None = None,
    ) -> None:
        if mode not in MODES:
            raise UserError(
                f"unknown remote dataset mode {mode!r}: choose one of {', '.join(MODES)}"
            )
        if mode == "remote-sophon" and (stages is None or len(stages) != len(labels)):
            raise UserError("the selective mode needs one planned stage per sample")
        self.address = address
        self.split = split
        self.labels = tuple(labels)
        self.mode = mode
        self.stages = tuple(stages) if stages is not None else None
        self.image_size = image_size
        self.train = train
        self.seed = seed
        self.emitter = emitter
        self._client: tuple[int, Any, Any, Any] | None = None  # (pid, channel, stub, pb2)

    def __len__(self) -> int:
        return len(self.labels)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # channels are per process
        return state

    def _stub(self) -> tuple[Any, Any]:
        if self._client is None or self._client[0] != os.getpid():
            pb2, pb2_grpc = rpc.modules()
            ch = channel(self.address)
            self._client = (os.getpid(), ch, pb2_grpc.SampleStoreStub(ch), pb2)
        return self._client[2], self._client[3]

    def close(self) -> None:
        """Close this process's channel."""
        if self._client is not None and self._client[0] == os.getpid():
            self._client[1].close()
        self._client = None

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Samples ``indices`` in one ``Fetch`` stream, each finished here as it arrives."""
        import grpc

        stub, pb2 = self._stub()
        indices = [int(i) for i in indices]
        for i in indices:
            if not 0 <= i < len(self.labels):
                raise IndexError(f"sample {i} of a split of {len(self.labels)}")
        epoch = max(self.epoch, 0)
        request = pb2.FetchRequest(
            mode=getattr(pb2, MODES[self.mode]),
            split=self.split,
            seed=self.seed,
            epoch=epoch,
            image_size=self.image_size,
            train=self.train,
            indices=indices,
        )
        if self.stages is not None:
            request.stages.extend(self.stages[i] for i in indices)
        out = []
        try:
            stream = stub.Fetch(request, wait_for_ready=True, timeout=FETCH_TIMEOUT_S)
            t0 = time.monotonic_ns()
            for want, sample in zip(indices, stream, strict=False):
                t1 = time.monotonic_ns()
                if sample.index != want:
                    raise UserError(
                        f"storage server {self.address} sent sample {sample.index} for {want}"
                    )
                out.append((self._finish(sample), torch.tensor(sample.label, dtype=torch.int64)))
                t2 = time.monotonic_ns()
                if self.emitter is not None:
                    meta = {"epoch": self.epoch, "index": want, "stage": int(sample.stage)}
                    self.emitter.duration("sample_load", t0, t1, **meta)
                    self.emitter.duration("sample_preproc", t1, t2, **meta)
                t0 = time.monotonic_ns()
        except grpc.RpcError as exc:
            raise rpc_error(self.address, exc) from None
        if len(out) != len(indices):
            raise UserError(
                f"storage server {self.address} ended a stream after {len(out)} of "
                f"{len(indices)} samples"
            )
        return out

    def _finish(self, sample: Any) -> torch.Tensor:
        stage = int(sample.stage)
        source = (sample.source_width, sample.source_height) if sample.source_width else None
        try:
            piece = from_wire(stage, sample.data, sample.height, sample.width, source)
        except ValueError as exc:
            raise UserError(
                f"storage server {self.address}, sample {sample.index}: {exc}"
            ) from None
        rng = self.rng(int(sample.index))
        skip_draws(stage, source, self.train, rng)
        where = f"sample {sample.index} from {self.address}"
        piece, _ = advance(piece, TENSOR, self.image_size, self.train, rng, where)
        return piece.value  # type: ignore[return-value]
