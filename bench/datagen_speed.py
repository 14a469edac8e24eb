"""Is dataset generation limited by the disk? Each generator vs dd, same size, same disk.

Usage: python bench/datagen_speed.py --size 2GB --dir DIR [--generator NAME ...] [--rounds 3]
       [--workers N]        (default: every generator: unet3d, bert, dlrm, images)

Method. Each round times two writers of the same size into DIR, in alternating order (round 1:
dd then generator, round 2: generator then dd, ...) so that drift in the disk's speed (thermal,
SLC cache, a noisy neighbour on a VM) does not favour either:

- dd:        ``dd if=/dev/zero of=DIR/dd.bin bs=4M count=N conv=fdatasync`` then ``sync``,
             N = ceil(size / 4 MiB);
- generator: ``datagen.registry.generate(NAME, DIR/NAME, size, force=True)`` (default
             parameters, one worker per CPU unless --workers) then ``sync``.

Each time runs until ``sync`` returns, so data still in the page cache is counted for both: dd
flushes its own file (fdatasync), while the generator leaves write-back to the kernel (it does not
fsync, see datagen.common.atomic_file) and pays for it in the ``sync``. Between measurements
the disk is ``sync``ed, clean caches are dropped (as root) and the disk is left idle for a second
(untimed), so one writer's write-back or discards do not slow the next. A small untimed warm-up
generation starts the worker server first (its start-up, reported on its own, is paid once per
process).

Each round's dataset goes to a new directory and all of them are deleted only after the
generator's last round (so the disk needs room for rounds + 1 datasets). Why: on ext4 without a
journal (this machine's root file system), the inode allocator skips inodes freed in the last
60 s (longer while their inode table block is dirty), looking each one up; creating thousands of
files just after deleting thousands costs up to ~1 ms of kernel CPU per file instead of ~25 us
(seen as ``recently_deleted`` under ``__ext4_new_inode`` with ``perf``). A benchmark that deleted
each round's dataset before the next would measure that, not the generator. (A user who
regenerates a many-file dataset with ``--force`` right away pays it too.) The check only looks at
inode table blocks still in the cache, so, when run as root, the benchmark also drops clean caches
(``/proc/sys/vm/drop_caches``) after each ``sync``: deletions made before it started do not count
either.

Output: per generator and round, MB/s (10^6 bytes per second) of each writer and the ratio
generator/dd; then the medians per generator. A ratio near 1 means the generator runs at disk
speed; for unet3d the line "array creation" gives its CPU-only rate in one process (written to
/dev/null), i.e. how far the CPU is from being the limit.

``--vs-dlio``: each generator of a format DLIO writes too (unet3d: DLIO's npz, dlrm: its
indexed binary, images: its JPEGs) against DLIO 2.0.0's own generator, instead of dd, in the
same alternating rounds: DLIO writes the dataset that stands for ours of the same size and shape
(``workloads.dlio.dataset_spec`` of the round's dataset: file count, sample sizes; what
``./cli.py trace --variant dlio`` makes), in twintrace/dlio, as many MPI ranks as our generator
has processes, then ``sync``. Printed per round: our MB/s, DLIO's MB/s over the container's wall
time (what a user waits for: MPI, Hydra and torch start-up included) and over the span DLIO
logs itself ("Starting data generation" to "Generation done", then the sync), and the ratios
twintrace/DLIO (goal: >= 2). Needs the images (``./cli.py build``) and root (docker).

    python bench/datagen_speed.py --vs-dlio --size 1GB --dir /var/tmp/gen --rounds 3
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script from anywhere: make the repository's packages importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.errors import UserError  # noqa: E402
from core.units import format_size, parse_size  # noqa: E402
from datagen.common import FileSink, set_worker_preload  # noqa: E402
from datagen.registry import GENERATORS, generate  # noqa: E402
from datagen.unet3d import write_case_x, write_case_y  # noqa: E402

DD_BLOCK = 4 << 20


def time_dd(directory: Path, size: int) -> tuple[float, int]:
    """Seconds and bytes for dd + sync writing ``size`` bytes (rounded up to 4 MiB blocks)."""
    count = math.ceil(size / DD_BLOCK)
    target = directory / "dd.bin"
    started = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=4M", f"count={count}", "conv=fdatasync"],
        check=True,
        capture_output=True,
    )
    os.sync()
    elapsed = time.perf_counter() - started
    target.unlink()
    return elapsed, count * DD_BLOCK


def time_generator(
    name: str, out: Path, size: int, workers: int | None, seed: int
) -> tuple[float, int, float]:
    """Seconds (generation + sync), bytes, and seconds of the sync alone, for one dataset in the
    new directory ``out`` (left in place: see the module docstring)."""
    started = time.perf_counter()
    manifest = generate(name, out, size, seed=seed, workers=workers)
    generated = time.perf_counter()
    os.sync()
    finished = time.perf_counter()
    return finished - started, manifest["total_bytes"], finished - generated


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def can_drop_caches() -> bool:
    return os.geteuid() == 0 and DROP_CACHES.exists()


def settle() -> None:
    # Flush the deletions (and let the device process their discards) before the next writer,
    # then evict clean caches: ext4's recently-deleted check only looks at inode table blocks
    # still cached, so this also ends the effect of deletions made before the benchmark.
    os.sync()
    if can_drop_caches():
        DROP_CACHES.write_text("3\n")
    time.sleep(1.0)


def array_creation_rate() -> float:
    """MB/s of one process producing a default-size case (x and y) into /dev/null."""
    s1, s2 = 300, 315  # a mid-range KiTS19 shape: x is 119 MB, y 30 MB
    with open(os.devnull, "wb") as devnull:
        sink = FileSink(devnull)
        write_case_x(sink, 0, 0, 64, 64)  # warm up numpy
        sink = FileSink(devnull)
        started = time.perf_counter()
        write_case_x(sink, 0, 1, s1, s2)
        write_case_y(sink, 0, 1, s1, s2)
        return sink.bytes_written / (time.perf_counter() - started) / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", required=True, help="bytes per writer, e.g. 1GB, 2GiB")
    parser.add_argument("--dir", required=True, type=Path, help="directory on the disk to test")
    parser.add_argument("--rounds", type=int, default=3, help="A/B rounds (default 3)")
    parser.add_argument("--workers", type=int, default=None, help="generator processes")
    parser.add_argument(
        "--generator", action="append", choices=sorted(GENERATORS), help="repeatable; default: all"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--vs-dlio",
        action="store_true",
        help="against DLIO's generator of the same format (unet3d, dlrm, images) instead of dd",
    )
    args = parser.parse_args()
    try:
        size = parse_size(args.size)
        if shutil.which("dd") is None:
            raise UserError("dd is not installed: install coreutils")
        if args.rounds < 1:
            raise UserError("--rounds must be at least 1")
        args.dir.mkdir(parents=True, exist_ok=True)
        args.generators = args.generator or list(GENERATORS)
        if args.vs_dlio:
            args.generators = args.generator or list(DLIO_FORMATS)
            other = [g for g in args.generators if g not in DLIO_FORMATS]
            if other:
                raise UserError(
                    f"--vs-dlio compares {', '.join(DLIO_FORMATS)}; DLIO writes no "
                    f"{other[0]} format of its own that stands for ours"
                )
            from experiments.dlio import check_image

            check_image()
        for name in ("dd.bin", *args.generators):
            if (args.dir / name).exists():
                raise UserError(f"{args.dir / name} exists: remove it or choose another --dir")
        # every round's datasets stay until the end (see above): ours, and DLIO's beside them
        needed = (2 * args.rounds + 2 if args.vs_dlio else args.rounds + 1) * size
        free = shutil.disk_usage(args.dir).free
        if free < needed:
            raise UserError(
                f"{args.dir} has {format_size(free)} free; {args.rounds} rounds need "
                f"{format_size(needed)} (rounds + 1 datasets): use fewer --rounds or a smaller "
                "--size"
            )
        return run(args, size)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace, size: int) -> int:
    directory: Path = args.dir
    print(f"size {format_size(size)} per writer, dir {directory}, {args.rounds} rounds")
    # One fork server for every generator measured, with all their modules, as each would have
    # when run alone from the CLI.
    set_worker_preload(GENERATORS[name][0] for name in args.generators)
    if not can_drop_caches():
        print(
            "note: not root, so caches are not dropped between measurements: files deleted "
            "in the last minutes may slow file creation (see the module docstring)"
        )
    medians = {}
    for name in args.generators:
        medians[name] = bench_generator(name, args, size)
    if args.vs_dlio:
        print("summary (median twintrace/DLIO; goal >= 2):")
        for name, (wall, span) in medians.items():
            print(
                f"  {name:>7} -> DLIO {DLIO_FORMATS[name]}: {wall:.2f} over DLIO's wall time, "
                f"{span:.2f} over its own generation span"
            )
        return 0
    print("summary (median generator/dd):")
    for name, ratio in medians.items():
        print(f"  {name:>7}: {ratio:.2f}")
    return 0


DLIO_FORMATS = {"unet3d": "npz", "dlrm": "indexed_binary", "images": "jpeg"}


def time_dlio(spec: Any, out: Path, ranks: int) -> tuple[float, float, int]:
    """DLIO's generator writing dataset ``spec`` into the new directory ``out``: (wall seconds
    + sync, DLIO's own span + sync, bytes)."""
    from experiments.dlio import run_generator

    data = out / "data"
    data.mkdir(parents=True)
    done = run_generator(spec, data, ranks, out)
    before = time.perf_counter()
    os.sync()
    sync_s = time.perf_counter() - before
    span = done.generation_s if done.generation_s is not None else float("nan")
    return done.wall_s + sync_s, span + sync_s, done.bytes


def measure_vs_dlio(
    name: str, args: argparse.Namespace, size: int, outputs: Path
) -> tuple[float, float]:
    """Rounds of our generator against DLIO's (module doc); the median ratios. DLIO's dataset
    is the one standing for ours of this size and seed (an untimed first generation of ours
    gives its shape: every round's is the same)."""
    from experiments.dlio import dataset_spec_of

    ranks = args.workers or max(1, len(os.sched_getaffinity(0)))
    generate(name, outputs / "reference", size, seed=args.seed, workers=args.workers)
    batch = 2048 if name == "dlrm" else 1  # DLRM's DLIO samples are batches of records
    spec, _ = dataset_spec_of(outputs / "reference", batch)
    print(
        f"DLIO's generator: {spec.num_files} {spec.format} files of {spec.samples} samples, "
        f"{ranks} MPI ranks"
    )
    settle()
    walls, spans = [], []
    print(
        f"{'round':>5} {'order':>11} {'ours MB/s':>10} {'DLIO MB/s':>10} {'(own span)':>11} "
        f"{'ours/DLIO':>10} {'(span)':>7}"
    )
    for r in range(args.rounds):
        ours_first = r % 2 == 0
        results: dict[str, tuple[float, ...]] = {}
        for which in ("ours", "dlio") if ours_first else ("dlio", "ours"):
            if which == "ours":
                seconds, nbytes, _ = time_generator(
                    name, outputs / f"ours{r + 1}", size, args.workers, args.seed
                )
                results["ours"] = (nbytes / seconds / 1e6,)
            else:
                wall, span, nbytes = time_dlio(spec, outputs / f"dlio{r + 1}", ranks)
                results["dlio"] = (nbytes / wall / 1e6, nbytes / span / 1e6)
            settle()
        ours = results["ours"][0]
        dlio_wall, dlio_span = results["dlio"]
        walls.append(ours / dlio_wall)
        spans.append(ours / dlio_span)
        order = "ours,dlio" if ours_first else "dlio,ours"
        print(
            f"{r + 1:>5} {order:>11} {ours:>10.0f} {dlio_wall:>10.0f} {dlio_span:>11.0f} "
            f"{walls[-1]:>10.2f} {spans[-1]:>7.2f}"
        )
    wall, span = statistics.median(walls), statistics.median(spans)
    print(
        f"median: twintrace/DLIO {wall:.2f} (spread {min(walls):.2f}..{max(walls):.2f}) over "
        f"DLIO's wall time, {span:.2f} ({min(spans):.2f}..{max(spans):.2f}) over its own span"
    )
    return wall, span


def bench_generator(name: str, args: argparse.Namespace, size: int) -> Any:
    directory: Path = args.dir
    print(f"== {name}")
    if name == "unet3d":
        print(f"array creation (CPU only, 1 process): {array_creation_rate():.0f} MB/s")
    settle()
    outputs = directory / name
    outputs.mkdir()
    try:
        if args.vs_dlio:
            return measure_vs_dlio(name, args, size, outputs)
        return measure_rounds(name, args, size, outputs)
    finally:
        shutil.rmtree(outputs)
        settle()


def measure_rounds(name: str, args: argparse.Namespace, size: int, outputs: Path) -> float:
    directory: Path = args.dir
    started = time.perf_counter()
    generate(
        name,
        outputs / "warmup",
        24 << 20,
        workers=args.workers,
        scale=0.25 if name == "unet3d" else None,
    )
    print(f"worker start-up + warm-up dataset: {time.perf_counter() - started:.2f} s")
    settle()

    gen_rates, dd_rates, ratios = [], [], []
    print(f"{'round':>5} {'order':>9} {'gen MB/s':>9} {'(sync s)':>9} {'dd MB/s':>8} {'gen/dd':>7}")
    for r in range(args.rounds):
        gen_first = r % 2 == 1
        results = {}
        for which in ("gen", "dd") if gen_first else ("dd", "gen"):
            if which == "dd":
                seconds, nbytes = time_dd(directory, size)
                results["dd"] = (nbytes / seconds / 1e6, 0.0)
            else:
                seconds, nbytes, sync_s = time_generator(
                    name, outputs / f"round{r + 1}", size, args.workers, args.seed
                )
                results["gen"] = (nbytes / seconds / 1e6, sync_s)
            settle()
        gen, sync_s = results["gen"]
        dd = results["dd"][0]
        gen_rates.append(gen)
        dd_rates.append(dd)
        ratios.append(gen / dd)
        order = "gen,dd" if gen_first else "dd,gen"
        print(f"{r + 1:>5} {order:>9} {gen:>9.0f} {sync_s:>9.2f} {dd:>8.0f} {gen / dd:>7.2f}")
    ratio = statistics.median(ratios)
    print(
        f"median: {name} {statistics.median(gen_rates):.0f} MB/s, "
        f"dd {statistics.median(dd_rates):.0f} MB/s, ratio generator/dd {ratio:.2f}"
    )
    return ratio


if __name__ == "__main__":
    sys.exit(main())
