"""The epoch barrier (``trace --cold-epochs``, ``sustain --cache epochs``): the
ranks of a run wait after each epoch but the last until the coordinator has dropped the page
cache. Here both halves without containers: ranks as threads running the workload's own wait
(:meth:`workloads.training._Loop._barrier`), the coordinator's
:class:`tracing.progress.EpochBarrier`; the traced run is in test_trace_integration.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.errors import UserError
from tracing.progress import EpochBarrier
from workloads.config import EPOCH_BARRIER_DIR, epoch_go_name


def _rank(out: Path, rank: int, epochs: int, seen: list[tuple[int, int, float]]) -> None:
    """A rank of ``epochs`` epochs in the container whose output directory is ``out``."""
    from workloads.training import _Loop

    loop = _Loop.__new__(_Loop)  # only what _barrier reads
    loop.plan = SimpleNamespace(out_dir=out)
    loop.rank = rank
    for epoch in range(1, epochs + 1):
        seen.append((rank, epoch, time.monotonic()))
        if epoch < epochs:
            loop._barrier(epoch)


def test_no_rank_starts_an_epoch_before_every_rank_ended_the_last_and_the_cache_dropped(
    tmp_path: Path,
) -> None:
    # Four ranks in two containers; rank 3 is slow to end each epoch.
    outs = [tmp_path / "out" / "rank0", tmp_path / "out" / "rank1"]
    seen: list[tuple[int, int, float]] = []
    dropped: list[tuple[int, float]] = []

    def between(epoch: int) -> None:
        time.sleep(0.05)
        dropped.append((epoch, time.monotonic()))

    def rank(n: int) -> None:
        if n == 3:
            time.sleep(0.2)
        _rank(outs[n % 2], n, 3, seen)

    folders = [out / EPOCH_BARRIER_DIR for out in outs]
    with EpochBarrier(folders, ranks=4, epochs=3, between=between) as barrier:
        threads = [threading.Thread(target=rank, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert [e for e, _ in dropped] == [1, 2] and barrier.error is None
    assert [d["epoch"] for d in barrier.drops] == [1, 2]
    for epoch, at in dropped:  # every start of the next epoch after the drop
        starts = [t for _, e, t in seen if e == epoch + 1]
        assert len(starts) == 4 and min(starts) >= at
    for folder in folders:
        assert sorted(p.name for p in folder.glob("go-*")) == ["go-1", "go-2"]


def test_a_failed_drop_lets_the_ranks_go_and_is_said(tmp_path: Path) -> None:
    out = tmp_path / "out" / "main"
    seen: list[tuple[int, int, float]] = []

    def between(epoch: int) -> None:
        raise PermissionError("[Errno 13] Permission denied: '/proc/sys/vm/drop_caches'")

    with EpochBarrier([out / EPOCH_BARRIER_DIR], 1, 2, between) as barrier:
        _rank(out, 0, 2, seen)
    assert [e for _, e, _ in seen] == [1, 2]
    assert (
        barrier.error == "after epoch 1: [Errno 13] Permission denied: '/proc/sys/vm/drop_caches'"
    )


def test_a_rank_left_waiting_fails_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import workloads.training as training

    monkeypatch.setattr(training, "EPOCH_BARRIER_WAIT_S", 0.1)
    with pytest.raises(UserError, match="^rank 0 waited 0 s after epoch 1 for the coordinator"):
        _rank(tmp_path, 0, 2, [])
    assert not (tmp_path / EPOCH_BARRIER_DIR / epoch_go_name(1)).exists()
