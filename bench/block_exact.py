"""Is the block lane exact? A traced container reads many small files from a cold cache, and
every file must show in the trace as a read request of the disk that covers its first block
(where FIEMAP places it), over several rounds after one to warm up.

    python bench/block_exact.py [--files 2000] [--rounds 3]

Prints per round: the files whose first block no traced request read, the block program's
skipped hits (``missed_probes['block']``, the kernel's ``recursion_misses``), and beside them
the read requests the device itself completed during the run (``/sys/block/DEV/stat``, read
before the run starts and after it ends: the container's start and every other reader of the
disk count there too) and those of the trace; then the medians with their spread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.extents import file_extents  # noqa: E402
from bench.spread import median_spread, warm_rounds  # noqa: E402
from tracing.request import image_request  # noqa: E402
from tracing.runner import trace  # noqa: E402
from workloads.config import BASE_TAG  # noqa: E402

READER = (
    "import os\n"
    "n = 0\n"
    "for name in sorted(os.listdir('/data')):\n"
    "    with open('/data/' + name, 'rb') as f:\n"
    "        n += len(f.read())\n"
    "print('read', n, 'bytes')\n"
)


def device_of(path: Path) -> tuple[str, str, int]:
    """(the whole disk's ``major:minor``, its /sys/block name, the byte where the file system
    begins on it) for a file system on a disk or a partition."""
    st = os.stat(path)
    sys_dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if not sys_dev.exists() or (sys_dev / "dm").exists():
        raise SystemExit(f"{path} is not on a disk or a partition: give --where a folder that is")
    if (sys_dev / "partition").exists():
        disk = sys_dev.resolve().parent
        return (
            (disk / "dev").read_text().strip(),
            disk.name,
            int((sys_dev / "start").read_text()) * 512,
        )
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", sys_dev.resolve().name, 0


def completed_reads(disk: str) -> int:
    """Read requests the device completed since boot (the first field of its stat)."""
    return int(Path(f"/sys/block/{disk}/stat").read_text().split()[0])


def make_files(folder: Path, count: int, size: int) -> None:
    """``count`` files of ``size`` random bytes, written, synced and dropped from the cache."""
    folder.mkdir(parents=True)
    for i in range(count):
        (folder / f"f{i:05d}").write_bytes(os.urandom(size))
    os.sync()


def drop(folder: Path) -> None:
    """Drop the files of ``folder`` from the page cache (they are clean: written and synced)."""
    for path in folder.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def first_bytes(folder: Path, base: int) -> np.ndarray:
    """Where on the disk each file of ``folder`` begins (its file system at byte ``base``)."""
    firsts = [file_extents(path)[0][0] for path in sorted(folder.iterdir())]
    return np.array(firsts, dtype=np.int64) + base


def one(folder: Path, runs: Path, disk: str, dev: str, starts: np.ndarray) -> tuple[int, ...]:
    """(files not seen, skipped block probe hits, device reads, traced reads of the device)."""
    drop(folder)
    before = completed_reads(disk)
    outcome = trace(image_request(BASE_TAG, ["python3", "-c", READER], runs, data_dir=folder))
    after = completed_reads(disk)
    if outcome.status not in ("completed", "lossy"):
        raise SystemExit(f"the traced run did not complete: {outcome.error}")
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    events = pd.read_parquet(
        outcome.run_dir / "events.parquet", columns=["kind", "dev", "offset", "bytes"]
    )
    reads = events[
        (events["kind"].astype(str) == "block_read") & (events["dev"].astype(str) == dev)
    ]
    order = np.argsort(reads["offset"].to_numpy())
    lo = reads["offset"].to_numpy(dtype=np.int64)[order]
    hi = lo + reads["bytes"].to_numpy(dtype=np.int64)[order]
    # a file is seen when the request starting at or before its first byte reaches past it
    i = np.searchsorted(lo, starts, side="right") - 1
    seen = (i >= 0) & (hi[np.maximum(i, 0)] > starts)
    missed = int((manifest.get("missed_probes") or {}).get("block", 0))
    shutil.rmtree(outcome.run_dir)
    return int((~seen).sum()), missed, after - before, len(reads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size", type=int, default=16384, help="bytes per file")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--where", type=Path, default=Path("/var/tmp"), help="a folder on a disk")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(
        prefix="twintrace-block-", dir=args.where, ignore_cleanup_errors=True
    ) as tmp:
        work = Path(tmp)
        folder = work / "data"
        make_files(folder, args.files, args.size)
        dev, disk, base = device_of(folder)
        starts = first_bytes(folder, base)
        print(f"{args.files} files of {args.size} B on {disk} ({dev})", flush=True)
        rows = warm_rounds(  # warm: the image's files, the tracer's
            args.rounds,
            lambda: one(folder, work / "runs", disk, dev, starts),
            lambda row: (
                f"files not seen {row[0]}, skipped block probe hits {row[1]}; "
                f"read requests: the device's {row[2]}, the trace's {row[3]}"
            ),
        )
        print(
            f"median of {args.rounds}: files not seen {median_spread([r[0] for r in rows], '.0f')}"
            f"; skipped hits {median_spread([r[1] for r in rows], '.0f')}"
        )


if __name__ == "__main__":
    main()
