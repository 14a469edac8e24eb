"""Files: who reads the data (effective reader threads), in what order the files are first
read (Kendall tau x Jaccard), the bytes read per file and the opens per file (Jensen-Shannon).
Runs of two datasets that share no file (ours and DLIO's copy, for one) are compared by rank
and by how sequential their orders are, since names cannot be matched (the functions say how).

All four look only at files in the comparison's file scope (the dataset, by default the runs'
read-only mounts: :attr:`RunProfile.file_scope`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from analysis.similarity.aspects.base import SCALE, SHIFT, SPEED, Outcome, aspect, one_sided
from analysis.similarity.measures import (
    aligned_shares,
    effective_readers,
    js_similarity,
    order_similarity,
    ratio_similarity,
)
from analysis.similarity.profile import RunProfile

#: At most this many files are kept for the per-file plots (the largest by combined share).
TOP_FILES = 30
#: At most this many shared files are kept for the access-order scatter plot.
MAX_RANK_POINTS = 5_000


def _scope(profile: RunProfile) -> dict[str, Any]:
    return {"file_scope": list(profile.file_scope) or "all files"}


def per_file_outcome(a: pd.Series, b: pd.Series, what: str, extra: Mapping[str, Any]) -> Outcome:
    """JS similarity of per-file shares over the union of files (0 when one run has none).

    Runs that read no file in common (two datasets: ours and DLIO's copy of it, say) are
    compared by rank instead: each run's shares sorted from the largest, the largest against
    the largest (``by_rank`` in the details), since their files' names cannot be matched."""
    missing = one_sided(len(a) > 0, len(b) > 0, what, extra)
    if missing:
        return missing
    if not a.index.intersection(b.index).size:
        n = max(len(a), len(b))
        va = np.pad(np.sort(a.to_numpy(dtype=np.float64))[::-1], (0, n - len(a)))
        vb = np.pad(np.sort(b.to_numpy(dtype=np.float64))[::-1], (0, n - len(b)))
        score = js_similarity(va, vb)
        pa, pb = va / va.sum(), vb / vb.sum()
        details = {
            "js_distance": 1.0 - score,
            "files_real": len(a),
            "files_emulated": len(b),
            "by_rank": True,
            **extra,
        }
        top = min(n, TOP_FILES)
        labels = [f"#{i + 1}" for i in range(top)]
        return Outcome(
            score, details, {"kind": "bars", "x": labels, "real": pa[:top], "emulated": pb[:top]}
        )
    union, va, vb = aligned_shares(a, b)
    score = js_similarity(va, vb)
    pa, pb = va / va.sum(), vb / vb.sum()
    top = np.argsort(-(pa + pb), kind="stable")[:TOP_FILES]
    details = {
        "js_distance": 1.0 - score,
        "files_real": len(a),
        "files_emulated": len(b),
        "files_union": len(union),
        **extra,
    }
    plot = {"kind": "bars", "x": union[top].tolist(), "real": pa[top], "emulated": pb[top]}
    return Outcome(score, details, plot)


@aspect(
    "read_parallelism",
    "dataset reader threads",
    "syscall I/O",
    "effective readers ratio",
    2.0,
    (SHIFT, SPEED, SCALE, "threads or processes"),
    ("number of threads reading the data", "their shares of the bytes"),
)
def read_parallelism(real: RunProfile, emulated: RunProfile) -> Outcome:
    """Ratio of the effective numbers of threads reading the data (files in scope)."""
    a, b = real.readers, emulated.readers
    missing = one_sided(len(a) > 0, len(b) > 0, "reads of named files")
    if missing:
        return missing
    eff_a, eff_b = effective_readers(a.to_numpy()), effective_readers(b.to_numpy())
    details = {
        "effective_readers_real": eff_a,
        "effective_readers_emulated": eff_b,
        "reader_threads_real": len(a),
        "reader_threads_emulated": len(b),
        "reads_in_flight_real": real.totals["reads_in_flight"],
        "reads_in_flight_emulated": emulated.totals["reads_in_flight"],
        **_scope(real),
    }
    # Bars: each run's readers' shares, busiest first (thread ids differ between runs).
    n = max(len(a), len(b))
    plot = {
        "kind": "bars",
        "x": [f"reader {i + 1}" for i in range(n)],
        "real": np.pad(a.to_numpy() / a.sum(), (0, n - len(a))),
        "emulated": np.pad(b.to_numpy() / b.sum(), (0, n - len(b))),
    }
    return Outcome(ratio_similarity(eff_a, eff_b), details, plot)


@aspect(
    "file_order",
    "file access order",
    "files",
    "Kendall τ × Jaccard",
    1.0,
    (SHIFT, SPEED, SCALE),
    ("which files are read", "order of first reads (shuffling seed)"),
)
def file_order(real: RunProfile, emulated: RunProfile) -> Outcome:
    """Kendall tau x Jaccard of the first-read orders. Runs that read no file in common (two
    datasets) are compared by how sequential each order is instead: Kendall's tau between a
    run's first-read order and its files' name order (1 reading in name order, ~0 shuffled,
    -1 reversed), the score ``1 - |tau_real - tau_emulated| / 2``."""
    a, b = real.files_read.index, emulated.files_read.index
    missing = one_sided(len(a) > 0, len(b) > 0, "reads of named files", _scope(real))
    if missing:
        return missing
    if not a.intersection(b).size:
        tau_a, tau_b = name_order_tau(a), name_order_tau(b)
        details = {
            "by_sequentiality": True,
            "name_order_tau_real": tau_a,
            "name_order_tau_emulated": tau_b,
            **_scope(real),
        }
        ranks = (np.arange(len(a)), np.argsort(np.argsort(np.asarray(a, dtype=str))))
        plot = {"kind": "ranks", "real": ranks[0], "emulated": ranks[1]}
        return Outcome(1.0 - abs(tau_a - tau_b) / 2, details, plot)
    score, details = order_similarity(a, b)
    rank_a, rank_b = details.pop("ranks")
    step = max(1, len(rank_a) // MAX_RANK_POINTS)
    plot = {"kind": "ranks", "real": rank_a[::step], "emulated": rank_b[::step]}
    return Outcome(score, {**details, **_scope(real)}, plot)


def name_order_tau(files: pd.Index) -> float:
    """Kendall's tau between the order in which ``files`` were first read and their names'
    sorted order (1 for one file)."""
    if len(files) < 2:
        return 1.0
    by_name = np.argsort(np.argsort(np.asarray(files, dtype=str)))
    return float(kendalltau(np.arange(len(files)), by_name).statistic)


@aspect(
    "file_bytes",
    "bytes read per file",
    "files",
    "JS",
    1.0,
    (SHIFT, SPEED, SCALE),
    ("which files are read", "share of bytes per file"),
)
def file_bytes(real: RunProfile, emulated: RunProfile) -> Outcome:
    return per_file_outcome(
        real.files_read, emulated.files_read, "reads of named files", _scope(real)
    )


@aspect(
    "open_close",
    "open/close pattern",
    "files",
    "JS + count ratio",
    1.0,
    (SHIFT, SPEED),
    ("opens per file", "number of opens"),
)
def open_close(real: RunProfile, emulated: RunProfile) -> Outcome:
    """Where the opens go (JS per file) and how many there are (ratio); opens in scope for
    the score, all opens, closes and failures as evidence."""
    opens_a, opens_b = float(real.opens.sum()), float(emulated.opens.sum())
    counts = {
        "opens_real": int(opens_a),
        "opens_emulated": int(opens_b),
        **{
            f"{name}_{who}": int(profile.totals[key])
            for name, key in (
                ("all_opens", "opens"),
                ("closes", "closes"),
                ("failed_opens", "failed_opens"),
            )
            for who, profile in (("real", real), ("emulated", emulated))
        },
        **_scope(real),
    }
    outcome = per_file_outcome(real.opens, emulated.opens, "successful opens", counts)
    if opens_a > 0 and opens_b > 0:
        count_ratio = ratio_similarity(opens_a, opens_b)
        outcome.details["open_count_ratio"] = count_ratio
        # Where opens go, and how many there are.
        return outcome._replace(score=(float(outcome.score or 0.0) + count_ratio) / 2)
    return outcome
