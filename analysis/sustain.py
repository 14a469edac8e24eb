"""What one run of the sustain search measured, what limited it, and the study's figure and table
(``./cli.py sustain``, experiments/sustain.py, docs/sustain.md).

Every figure is over the run's measured steps (each epoch's first step left out, as for AU:
:mod:`analysis.breakdown`), from the run's own trace and samples:

- ``au``, ``samples_per_s``, ``delivered_bytes_per_s`` and ``needed_bytes_per_s``
  (:func:`analysis.breakdown.storage_demand`): the dataset's read syscalls, and the rate the
  run's own reads imply at AU 100 % (what it got, over the time it computed); the search adds
  ``demand_bytes_per_s``, the count times the first (one accelerator's) ``needed_bytes_per_s``:
  what the count needs from the storage;
- ``storage_bytes``: the bytes the run's containers read from the block device in that window
  (block reads attributed to them: docs/run-format.md) and ``storage_share``, their share of the
  dataset's read bytes (at most 1): what came from the storage, the rest from the page cache;
- ``cpu_cores``: the cores the containers used (``container_cpu``, mean), ``cpu_capacity`` the
  cores they could use (their ``--cpus`` limit, else the host's), and ``loader_share``, the part
  of their CPU the data loader's worker processes used.

:func:`limiter` names what kept AU below the threshold, in this order: the page cache (a run
whose reads mostly never reached the storage measured memory: flagged whatever else), the
clients' CPU (busy at :data:`CPU_BUSY` of what they may use), the storage (the data came from
the device and the CPU had room), else the data pipeline itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.breakdown import step_table, storage_demand
from analysis.tables import is_value
from store.rundir import Run

#: Below this share of the dataset's bytes from the storage, a run measured the page cache.
CACHED_SHARE = 0.5
#: The clients' CPU is the limit when the containers used at least this share of their cores.
CPU_BUSY = 0.85
#: What limits a count, in the words of the result.
LIMITS = {
    "accelerators": "the accelerator count: every count tried kept AU at the threshold",
    "page_cache": "the page cache: the reads mostly never reached the storage",
    "client_cpu": "the clients' CPU",
    "storage": "the storage",
    "pipeline": "the data pipeline (neither the storage nor the CPU was saturated)",
}

_NS = 1e-9


def _window(steps: pd.DataFrame) -> tuple[int, int]:
    kept = steps[~steps["first_in_epoch"]]
    if not len(kept):
        return 0, 0
    return int(kept["start_ns"].min()), int(kept["end_ns"].max())


def run_figures(
    run: Run, steps: pd.DataFrame | None = None, demand: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The figures of one run of the search (module doc); ``steps`` and ``demand``: the run's
    :func:`analysis.breakdown.step_table` and :func:`analysis.breakdown.storage_demand`, when
    already computed."""
    steps = step_table(run) if steps is None else steps
    demand = storage_demand(run, steps) if demand is None else demand
    start, end = _window(steps)
    seconds = (end - start) * _NS
    events = run.events
    block = events[
        is_value(events["kind"], "block_read")
        & events["container"].notna().to_numpy()
        & (events["ts_ns"] > start).to_numpy()
        & (events["ts_ns"] <= end).to_numpy()
    ]
    storage = float(block["bytes"].sum())
    read = float(demand.get("read_bytes") or 0.0)
    samples = run.samples
    inside = samples[(samples["ts_ns"] > start) & (samples["ts_ns"] <= end)]

    def cores(metric: str) -> float:
        rows = inside[is_value(inside["metric"], metric)]
        if not len(rows):
            return math.nan
        return float(rows.groupby(rows["container"].astype(str))["value"].mean().sum() / 100.0)

    cpu, loader = cores("container_cpu"), cores("container_cpu_loader")
    limits = [c.get("cpus") for c in run.manifest.get("containers") or []]
    host_cpus = float((run.manifest.get("host") or {}).get("cpus") or math.nan)
    capacity = sum(limits) if limits and all(limits) else host_cpus  # type: ignore[arg-type]
    config = (run.manifest.get("containers") or [{}])[0].get("config") or {}
    return {
        "accelerators": int(config.get("accelerators") or 1),
        **demand,
        "window_s": seconds,
        "storage_bytes": storage,
        "storage_bytes_per_s": storage / seconds if seconds > 0 else math.nan,
        "storage_share": min(1.0, storage / read) if read > 0 else math.nan,
        "cpu_cores": cpu,
        "cpu_capacity": capacity,
        "cpu_busy": cpu / capacity if capacity and not math.isnan(cpu) else math.nan,
        "loader_share": loader / cpu if cpu and not math.isnan(loader) else math.nan,
    }


def cached(figures: Mapping[str, Any]) -> bool:
    """Whether the run's reads were mostly served by the page cache: it measured memory."""
    share = figures.get("storage_share")
    return share is not None and not math.isnan(share) and share < CACHED_SHARE


#: What measures the storage instead of the page cache, in the words of every warning.
REMEDIES = (
    "evict the dataset from the page cache before each run and between its epochs "
    "(`./cli.py trace --cold-epochs`, `./cli.py sustain --cache epochs`), give the "
    "containers a --memory-limit, or use a dataset larger than memory"
)


def page_cache_note(
    run: Run, demand: Mapping[str, Any] | None = None, steps: pd.DataFrame | None = None
) -> str | None:
    """The warning a run whose dataset reads mostly never reached the storage gets (``show``,
    the report), with the remedies; None for a run that read its storage. ``demand`` and
    ``steps`` as for :func:`run_figures`."""
    figures = run_figures(run, steps, demand)
    if not cached(figures):
        return None
    return (
        f"{1 - figures['storage_share']:.0%} of the dataset's bytes read came from the page "
        f"cache, not the storage: this run measured memory; for storage, {REMEDIES}"
    )


def limiter(figures: Mapping[str, Any], threshold: float) -> tuple[str, str]:
    """(code, sentence): what kept the run's AU below ``threshold`` (module doc), with the
    figures that say so; ``accelerators`` when it did not."""
    au = figures.get("au")
    mb = 1e6
    if au is not None and not math.isnan(au) and au >= threshold:
        return "accelerators", LIMITS["accelerators"]
    busy = figures.get("cpu_busy")
    if cached(figures):
        return "page_cache", (
            f"{LIMITS['page_cache']} ({figures['storage_share']:.0%} of the bytes read came "
            "from the storage): this measured memory, not storage"
        )
    if busy is not None and not math.isnan(busy) and busy >= CPU_BUSY:
        return "client_cpu", (
            f"{LIMITS['client_cpu']}: the containers used {figures['cpu_cores']:.2f} of their "
            f"{figures['cpu_capacity']:.2f} cores ({busy:.0%}), the loader workers "
            f"{percent(figures.get('loader_share'), '?')} of it"
        )
    if figures.get("storage_share") is not None and not math.isnan(figures["storage_share"]):
        demand = figures.get("demand_bytes_per_s")
        needed = (
            f"{demand / mb:.1f} MB/s ({figures['accelerators']} x the demand of one accelerator "
            "alone)"
            if demand
            else f"{figures['needed_bytes_per_s'] / mb:.1f} MB/s"
        )
        return "storage", (
            f"{LIMITS['storage']}: it delivered {figures['storage_bytes_per_s'] / mb:.1f} MB/s "
            f"from the device while the accelerators needed {needed}; the CPU had room "
            f"({percent(busy, '?')} busy)"
        )
    return "pipeline", LIMITS["pipeline"]


def search_counts(passes: Mapping[int, bool], largest: int) -> tuple[int | None, int | None, bool]:
    """The next accelerator count to run, given the counts run so far (count -> AU at the
    threshold), by growing (1, 2, 4, ...) until one fails, then bisecting between the last
    that passed and the first that failed; and whether the search is over. Returns (next
    count or None, the answer so far: the largest count that passed with every smaller one
    tried passing, done)."""
    best = max((n for n, ok in passes.items() if ok), default=0)
    failed = min((n for n, ok in passes.items() if not ok and n > best), default=None)
    if failed is None:
        if best >= largest:
            return None, best, True
        grow = max(1, best * 2) if best else 1
        return min(grow, largest), best, False
    if failed - best <= 1:
        return None, best, True
    return (best + failed) // 2, best, False


def table_lines(result: Mapping[str, Any]) -> list[str]:
    """The search's runs and its answer, as lines for the terminal."""
    s = result["settings"]
    lines = [
        f"{'accelerators':>12}  {'AU':>6}  {'needed MB/s':>11}  {'read MB/s':>9}  "
        f"{'storage MB/s':>12}  {'from storage':>12}  {'CPU busy':>8}"
    ]
    for r in sorted(result["runs"], key=lambda r: r["accelerators"]):
        f = r["figures"]
        lines.append(
            f"{r['accelerators']:>12}  {percent(f.get('au')):>6}  "
            f"{megabytes(f.get('demand_bytes_per_s') or f.get('needed_bytes_per_s')):>11}  "
            f"{megabytes(f.get('delivered_bytes_per_s')):>9}  "
            f"{megabytes(f.get('storage_bytes_per_s')):>12}  {percent(f.get('storage_share')):>12}  "
            f"{percent(f.get('cpu_busy')):>8}" + ("  (page cache)" if cached(f) else "")
        )
    answer = result["answer"]
    lines.append(
        f"{s['workload']} on {s.get('accelerator') or 'its profile'}: {answer['accelerators']} "
        f"accelerator(s) sustained at AU >= {s['au']:.0%}; limited by {answer['limit_text']}"
    )
    return lines


def percent(value: float | None, missing: str = "-") -> str:
    """A fraction as a whole percent; ``missing`` for none (None or NaN)."""
    return missing if value is None or math.isnan(value) else f"{value:.0%}"


def megabytes(value: float | None) -> str:
    """Bytes per second in MB/s, one decimal; "-" for none."""
    return "-" if value is None or math.isnan(value) else f"{value / 1e6:.1f}"


def compare_lines(ours: Mapping[str, Any], dlio: Mapping[str, Any]) -> list[str]:
    """Two searches side by side (``--variant both``): per count tried, each one's AU and rate
    from the storage; then each answer and its limit."""
    by_count: dict[int, dict[str, Any]] = {}
    for name, result in (("sleep", ours), ("dlio", dlio)):
        for r in result["runs"]:
            by_count.setdefault(r["accelerators"], {})[name] = r["figures"]
    lines = [f"{'accelerators':>12}  {'AU sleep':>8}  {'AU DLIO':>8}  {'storage MB/s sleep':>18}  "
             f"{'storage MB/s DLIO':>17}"]  # fmt: skip
    for count in sorted(by_count):
        a, b = by_count[count].get("sleep", {}), by_count[count].get("dlio", {})
        lines.append(
            f"{count:>12}  {percent(a.get('au')):>8}  {percent(b.get('au')):>8}  "
            f"{megabytes(a.get('storage_bytes_per_s')):>18}  "
            f"{megabytes(b.get('storage_bytes_per_s')):>17}"
        )
    for name, result in (("ours (sleep)", ours), ("DLIO", dlio)):
        answer = result["answer"]
        lines.append(f"{name}: {answer['accelerators']}, limited by {answer['limit_text']}")
    return lines


def sustain_figure(result: Mapping[str, Any]) -> go.Figure:
    """AU and bandwidth against accelerators: the threshold, the answer, and per run the rate
    the accelerators needed, the rate the reads delivered and the part from the storage."""
    runs = sorted(result["runs"], key=lambda r: r["accelerators"])
    x = [r["accelerators"] for r in runs]

    def values(key: str, scale: float = 1.0) -> list[float | None]:
        out: list[float | None] = []
        for r in runs:
            v = r["figures"].get(key)
            out.append(None if v is None or (isinstance(v, float) and math.isnan(v)) else v * scale)
        return out

    s, answer = result["settings"], result["answer"]
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
        subplot_titles=("accelerator utilisation", "bandwidth"),
    )  # fmt: skip
    fig.add_trace(go.Scatter(x=x, y=values("au", 100), mode="lines+markers", name="AU"), 1, 1)
    fig.add_hline(y=100 * s["au"], line_dash="dash", row=1, col=1, annotation_text="threshold")
    if answer["accelerators"]:
        fig.add_vline(x=answer["accelerators"], line_dash="dot", annotation_text="sustained")
    for key, name in (
        ("demand_bytes_per_s", "needed at AU 100 % (the count x one alone)"),
        ("delivered_bytes_per_s", "read (syscalls)"),
        ("storage_bytes_per_s", "from the storage (block)"),
    ):
        fig.add_trace(go.Scatter(x=x, y=values(key, 1e-6), mode="lines+markers", name=name), 2, 1)
    fig.update_yaxes(title_text="AU (%)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="MB/s", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="emulated accelerators", row=2, col=1)
    fig.update_layout(
        title=f"{s['workload']}: {answer['accelerators']} accelerator(s) at AU >= "
        f"{s['au']:.0%}, limited by {answer['limit']}",
        height=700,
    )
    return fig


__all__ = [
    "CACHED_SHARE",
    "CPU_BUSY",
    "LIMITS",
    "cached",
    "compare_lines",
    "limiter",
    "megabytes",
    "page_cache_note",
    "percent",
    "run_figures",
    "search_counts",
    "sustain_figure",
    "table_lines",
]
