#!/usr/bin/env python3
"""Do the BERT generator's CRCs belong in compiled code? The crc32c package vs the kernel's.

The generator's encoder (datagen.bert_encode) writes a block of 1024 records with a numba
kernel, then takes each record's two TFRecord CRCs (of its length, of its data) with the
``crc32c`` package: two Python calls per record (``package``, what the generator does). The
alternative (``kernel``, what it did before) takes them in compiled code with the CRC32
instruction of SSE 4.2, no Python call; it is defined here, not in the library, and swapped in
for ``datagen.bert_encode._put_crcs``. Both write the same bytes (checked before timing).

Method: rounds of A/B pairs, the order alternating (package first in odd rounds), so that drift
(CPU frequency, a noisy neighbour on a VM) favours neither.

- ``writer`` (always): one process runs the generator's writer, ``datagen.bert.write_shard``,
  for --shards default shards (16,384 records, ~42 MB each) into /dev/null: draw, encode, CRCs,
  write. CPU only: the most the CRC path can change.
- ``generator`` (with --dir): ``datagen.bert.generate_bert`` of --size into a new directory of
  DIR, all CPUs, then ``sync``: what a user sees. Each run is a child process (this script with
  --child), so that its fork server, which preloads this file, takes the variant from the
  environment; the child starts its workers and loads the kernel untimed first, and checks that
  its workers use the variant. Datasets are deleted after each measurement; before the next,
  ``sync``, clean caches dropped (as root) and a second idle (untimed).

Output: per round, MB/s (10^6 bytes per second) of each variant and the ratio package/kernel
(below 1: the package is slower); then per measurement the median ratio and its spread (the
lowest and highest round).

Decision rule: the CRCs stay with the package (one CRC implementation, shared with the reader)
while BERT generation still outruns the disk (bench/datagen_speed.py: generator/dd above 1)
with them; a machine whose disk outruns its CPUs should rerun this first. Measured on a 2-vCPU
AMD EPYC VM shared with other work (--rounds 8 --dir /tmp --size 1GB): writer 0.815 (0.79 to
0.90), generator 0.91 (0.61 to 1.27); datagen_speed's bert generator/dd with the package: 1.63.

Usage: python bench/bert_crc.py [--rounds 5] [--shards 4] [--dir DIR --size 1GB] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import llvmlite.binding  # noqa: E402
import numba  # noqa: E402
import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba.core import cgutils, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from core.errors import UserError  # noqa: E402
from core.units import parse_size  # noqa: E402
from datagen import bert, bert_encode  # noqa: E402
from datagen.common import FileSink, FileTask, run_file_tasks, set_worker_preload  # noqa: E402
from workloads.bert.records import FOOTER_BYTES, HEADER_BYTES, LENGTH_BYTES, MASK_DELTA  # noqa: E402

VARIANT_ENV = "TWINTRACE_BENCH_BERT_CRC"
VARIANTS = ("package", "kernel")
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
LIBRARY_PUT_CRCS = bert_encode._put_crcs


def has_crc32_instruction() -> bool:
    return bool(llvmlite.binding.get_host_cpu_features().get("crc32"))


# --------------------------------------------------------------------------------------------
# The kernel variant: CRC-32C with the CRC32 instruction, eight bytes a step


@intrinsic
def _load_u64(typingctx: Any, data: Any, at: Any) -> Any:
    """The 8 bytes ``data[at : at + 8]`` (uint8 array, in bounds) as a little-endian uint64."""

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        array = context.make_array(sig.args[0])(context, builder, args[0])
        pointer = builder.bitcast(builder.gep(array.data, [args[1]]), ir.IntType(64).as_pointer())
        return builder.load(pointer, align=1)

    return types.uint64(data, at), codegen


def _call_llvm(name: str, result_bits: int, *arg_bits: int) -> Any:
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        fnty = ir.FunctionType(ir.IntType(result_bits), [ir.IntType(b) for b in arg_bits])
        return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)

    return codegen


@intrinsic
def _crc32_u64(typingctx: Any, crc: Any, data: Any) -> Any:
    codegen = _call_llvm("llvm.x86.sse42.crc32.64.64", 64, 64, 64)
    return types.uint64(types.uint64, types.uint64), codegen


@intrinsic
def _crc32_u8(typingctx: Any, crc: Any, data: Any) -> Any:
    codegen = _call_llvm("llvm.x86.sse42.crc32.32.8", 32, 32, 8)
    return types.uint32(types.uint32, types.uint8), codegen


@numba.njit(nogil=True)
def _masked_crc32c(data: np.ndarray, begin: int, end: int) -> int:
    crc = np.uint64(0xFFFFFFFF)
    at = begin
    while at + 8 <= end:
        crc = _crc32_u64(crc, _load_u64(data, at))
        at += 8
    tail = np.uint32(crc)
    for j in range(at, end):
        tail = _crc32_u8(tail, data[j])
    value = np.int64(tail ^ np.uint32(0xFFFFFFFF))
    return (((value >> 15) | (value << 17)) + MASK_DELTA) & 0xFFFFFFFF


@numba.njit(nogil=True)
def _put_crc(out: np.ndarray, at: int, masked: int) -> None:
    for j in range(4):
        out[at + j] = (masked >> (8 * j)) & 0xFF


@numba.njit(nogil=True)
def _kernel_crcs(out: np.ndarray, ends: np.ndarray) -> None:
    start = 0
    for i in range(ends.size):
        end = ends[i]
        _put_crc(out, start + LENGTH_BYTES, _masked_crc32c(out, start, start + LENGTH_BYTES))
        data_crc = _masked_crc32c(out, start + HEADER_BYTES, end - FOOTER_BYTES)
        _put_crc(out, end - FOOTER_BYTES, data_crc)
        start = end


def kernel_put_crcs(out: np.ndarray, ends: np.ndarray) -> None:
    """datagen.bert_encode._put_crcs, in compiled code."""
    _kernel_crcs(out, ends)


def use(variant: str) -> None:
    """Have this process's encoder (and the processes it forks after this) use ``variant``."""
    if variant == "kernel":
        # Compiled now, not in each worker at its first block: they fork from this process.
        kernel_put_crcs(np.zeros(16, dtype=np.uint8), np.array([16]))
    bert_encode._put_crcs = kernel_put_crcs if variant == "kernel" else LIBRARY_PUT_CRCS  # type: ignore[assignment]


# A generator child's fork server imports this file as bench.bert_crc (see child): the variant
# comes with the environment, and its workers fork with it. (Python 3.11's fork server never
# imports the main script: each worker imports it again, as __mp_main__, which must not compile.)
if __name__ == "bench.bert_crc" and os.environ.get(VARIANT_ENV) in VARIANTS:
    use(os.environ[VARIANT_ENV])


# --------------------------------------------------------------------------------------------
# Measurements


def check_same_bytes() -> None:
    params = bert.BertGenParams()
    pool_rng = np.random.default_rng(1)
    pool = bert.make_pool(pool_rng, bert.pool_tokens(params), params, bert_encode.encode_varints)
    draws = bert.draw_arrays(np.random.default_rng(2), 1024, params, pool)
    results = []
    for variant in VARIANTS:
        use(variant)
        results.append(bert_encode.encode_block(draws, pool, params)[0].tobytes())
    use("package")
    if results[0] != results[1]:
        raise RuntimeError("the kernel's CRCs differ from the crc32c package's: a bug here")


def time_writer(variant: str, shards: int) -> float:
    """MB/s of one process writing ``shards`` default shards into /dev/null."""
    use(variant)
    params = bert.BertGenParams()
    with open(os.devnull, "wb") as devnull:
        sink = FileSink(devnull)
        started = time.perf_counter()
        for shard in range(shards):
            bert.write_shard(sink, 0, shard, params.records_per_file, None, params)
        elapsed = time.perf_counter() - started
    use("package")
    return sink.bytes_written / elapsed / 1e6


def probe(sink: FileSink) -> dict[str, Any]:
    """A task that reports which CRC path its worker process has."""
    sink.write(b"\0")
    return {"crc": "kernel" if bert_encode._put_crcs.__name__ == "kernel_put_crcs" else "package"}


def child(variant: str, directory: Path, size: int, workers: int | None) -> None:
    """One timed generation (see the module docstring); prints {"mb_s": ..., "crc": ...}."""
    import bench.bert_crc as this  # the module the fork server preloads, with the variant

    set_worker_preload(["datagen.bert", "bench.bert_crc"])
    scratch = directory / "probe"
    (record,) = run_file_tasks(scratch, [FileTask("probe.bin", this.probe)], workers=1)
    shutil.rmtree(scratch)
    warmup = directory / "warmup"
    bert.generate_bert(warmup, 24 << 20, workers=workers)  # loads the kernel in the workers
    shutil.rmtree(warmup)
    os.sync()
    out = directory / "bert"
    started = time.perf_counter()
    manifest = bert.generate_bert(out, size, workers=workers)
    os.sync()
    elapsed = time.perf_counter() - started
    shutil.rmtree(out)
    os.sync()
    print(json.dumps({"mb_s": manifest["total_bytes"] / elapsed / 1e6, "crc": record["crc"]}))


def settle() -> None:
    """Let the last run's write-back and deletions end before the next run (untimed)."""
    os.sync()
    if os.geteuid() == 0 and DROP_CACHES.exists():
        DROP_CACHES.write_text("3\n")  # clean caches: the next run starts from the same state
    time.sleep(1.0)


def time_generator(variant: str, directory: Path, size: int, workers: int | None) -> float:
    settle()
    command = [sys.executable, __file__, "--child", variant, "--dir", str(directory)]
    command += ["--size", str(size)] + (["--workers", str(workers)] if workers else [])
    env = {**os.environ, VARIANT_ENV: variant}
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"the {variant} generation failed:\n{result.stderr[-3000:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if report["crc"] != variant:
        raise RuntimeError(f"the workers used the {report['crc']} CRCs, not the {variant} ones")
    return float(report["mb_s"])


def measure(name: str, rounds: int, timed: Any) -> float:
    print(f"== {name}")
    print(f"{'round':>5} {'order':>16} {'package MB/s':>13} {'kernel MB/s':>12} {'ratio':>6}")
    ratios = []
    for r in range(rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        rates = {variant: timed(variant) for variant in order}
        ratio = rates["package"] / rates["kernel"]
        ratios.append(ratio)
        print(
            f"{r + 1:>5} {','.join(order):>16} {rates['package']:>13.0f} "
            f"{rates['kernel']:>12.0f} {ratio:>6.3f}"
        )
    median = statistics.median(ratios)
    print(
        f"{name}: package/kernel median {median:.3f} (rounds {min(ratios):.3f} to "
        f"{max(ratios):.3f}, {rounds} rounds)"
    )
    return median


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="A/B rounds (default 5)")
    parser.add_argument("--shards", type=int, default=4, help="writer: shards a run (default 4)")
    parser.add_argument("--dir", type=Path, help="generator: a directory on the disk to use")
    parser.add_argument("--size", default="1GB", help="generator: dataset size (default 1GB)")
    parser.add_argument("--workers", type=int, default=None, help="generator processes")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        if not has_crc32_instruction():
            raise UserError("this CPU has no CRC32 instruction (SSE 4.2): run on x86-64")
        if args.rounds < 1 or args.shards < 1:
            raise UserError("--rounds and --shards must be at least 1")
        size = parse_size(args.size)
        if args.child:
            child(args.child, args.dir, size, args.workers)
            return 0
        check_same_bytes()
        print(f"CPU: {os.cpu_count()} logical, numba {numba.__version__}, numpy {np.__version__}")
        ratios = {"writer": measure("writer", args.rounds, lambda v: time_writer(v, args.shards))}
        if args.dir is not None:
            args.dir.mkdir(parents=True, exist_ok=True)
            directory = Path(tempfile.mkdtemp(prefix="bert-crc-", dir=args.dir))
            try:
                ratios["generator"] = measure(
                    f"generator ({args.size}, workers {args.workers or 'all CPUs'})",
                    args.rounds,
                    lambda v: time_generator(v, directory, size, args.workers),
                )
            finally:
                shutil.rmtree(directory, ignore_errors=True)
        return 0
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
