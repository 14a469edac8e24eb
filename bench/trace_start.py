"""How long a traced run takes to reach its release: from `trace()` being called to the
moment every probe is attached and the containers are let go (the manifest's ``start_ns``),
for a container that does nothing (``true``), over several rounds.

    python bench/trace_start.py [--rounds 5]

Prints each round and the median with its spread. Run it from two checkouts to compare two
versions of the tracer (docs/tracer-peers.md did so for the host's bpftrace 0.17 against the
tracer's container).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.spread import median_spread, warm_rounds  # noqa: E402
from tracing.request import image_request  # noqa: E402
from tracing.runner import trace  # noqa: E402
from workloads.config import BASE_TAG  # noqa: E402


def one(runs: Path) -> tuple[float, float]:
    """(seconds to the release, seconds for the whole run) of one traced ``true``."""
    started = time.monotonic_ns()
    outcome = trace(image_request(BASE_TAG, ["true"], runs))
    ended = time.monotonic_ns()
    if outcome.status != "completed":
        raise SystemExit(f"the traced run did not complete: {outcome.error}")
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    shutil.rmtree(outcome.run_dir)
    return (manifest["start_ns"] - started) / 1e9, (ended - started) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="twintrace-start-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        rows = warm_rounds(  # warm: images, page cache
            args.rounds,
            lambda: one(work),
            lambda r: f"release after {r[0]:.2f} s, run {r[1]:.2f} s",
        )
        release, whole = [r for r, _ in rows], [w for _, w in rows]
        print(
            f"median of {args.rounds}: to the release {median_spread(release, '.2f')} s; "
            f"whole run {median_spread(whole, '.2f')} s"
        )


if __name__ == "__main__":
    main()
