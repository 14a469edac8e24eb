"""Container entry point (standard library argparse only; click is not in the images).

    python -m workloads run --config /twintrace/ctl/config.json --data /data --out /twintrace/out
    python -m workloads check-data --workload unet3d --data DIR

``run`` appends MLLOG events to ``--mllog`` (default ``<out>/mllog.log``). Exit status: 0 on
success, 2 after printing ``error: <message>`` for an expected failure (UserError); any other
exception is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.errors import UserError
from core.units import format_size
from workloads.config import WorkloadConfig
from workloads.events import INSTRUMENTED_VARIANTS, Emitter
from workloads.registry import get_workload


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workloads", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the workload a config file describes")
    run.add_argument("--config", type=Path, required=True, help="workload config JSON")
    run.add_argument("--data", type=Path, required=True, help="dataset directory")
    run.add_argument("--out", type=Path, required=True, help="writable output directory")
    run.add_argument("--mllog", type=Path, help="MLLOG event file (default: OUT/mllog.log)")
    check = commands.add_parser("check-data", help="validate a dataset directory quickly")
    check.add_argument("--workload", required=True)
    check.add_argument("--data", type=Path, required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the command; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "check-data":
            summary = get_workload(args.workload).check_data(args.data)
            print(
                f"{args.workload} data in {args.data}: {summary.items} items, "
                f"{summary.files} files, {format_size(summary.bytes)}"
            )
            return 0
        config = WorkloadConfig.load(args.config)
        spec = get_workload(config.workload)
        args.out.mkdir(parents=True, exist_ok=True)
        instrumenting = config.variant in INSTRUMENTED_VARIANTS
        with Emitter(args.mllog or args.out / "mllog.log", instrumenting=instrumenting) as emitter:
            spec.run(config, args.data, args.out, emitter)
        return 0
    except UserError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
