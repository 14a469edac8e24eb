"""How every benchmark runs its rounds and prints a figure measured over them: its median and
its spread."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def median_spread(values: Sequence[float], fmt: str = ".3f") -> str:
    """``median (spread min .. max)`` of ``values``, each number in format ``fmt``."""
    return f"{statistics.median(values):{fmt}} (spread {min(values):{fmt}} .. {max(values):{fmt}})"


def warm_rounds(rounds: int, measure: Callable[[], T], show: Callable[[T], str]) -> list[T]:
    """``measure()`` once to warm up (not kept), then ``rounds`` times, each printed as
    ``round N: show(result)`` as it comes; the kept results."""
    measure()
    kept = []
    for i in range(rounds):
        kept.append(measure())
        print(f"round {i + 1}: {show(kept[-1])}", flush=True)
    return kept


_PEAK_RSS = """
import json, sys, time
sys.path[:0] = {paths!r}
{setup}

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

before = hwm()
with open("/proc/self/clear_refs", "w") as fh:  # the peak so far (imports) is reset
    fh.write("5")
t = time.perf_counter()
{call}
print(json.dumps({{"seconds": time.perf_counter() - t, "rss_mib": hwm(), "imports_mib": before}}))
"""


def peak_rss(setup: str, call: str) -> dict:
    """Run ``setup`` (imports, warm-up) then ``call`` (one statement) in a fresh Python with the
    project and bench/ importable: ``seconds`` of the call, ``rss_mib`` its peak RSS (VmHWM
    reset after the setup) and ``imports_mib`` the RSS the setup left."""
    bench = Path(__file__).resolve().parent
    code = _PEAK_RSS.format(paths=[str(bench.parent), str(bench)], setup=setup, call=call)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])
