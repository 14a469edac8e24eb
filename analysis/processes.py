"""Which traced process is what: the training process, a data-loader worker, or other.

:func:`classify_processes` groups the processes of an events table (``docs/run-format.md``)
from the process tree (``fork`` rows) and their names and I/O. The timeline's process lane
draws one row per process, grouped this way; pass it the events of one container at a time
(each container of a run has its own training process).

Example::

    procs = classify_processes(run.events)
    workers = procs[procs["group"] == "loader worker"]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis.tables import BLOCK_KINDS
from store.rundir import READ_KINDS, WRITE_KINDS

PROCESS_GROUPS: tuple[str, ...] = ("main", "loader worker", "other")

#: Process names that identify a data-loader worker (comm is at most 15 characters).
#: PyTorch names its DataLoader worker processes ``pt_data_worker``.
WORKER_COMM_PREFIXES: tuple[str, ...] = ("pt_data_worker",)


def classify_processes(
    events: pd.DataFrame, worker_prefixes: Sequence[str] = WORKER_COMM_PREFIXES
) -> pd.DataFrame:
    """One row per process seen in ``events``, grouped as main, loader worker or other.

    The process tree comes from ``fork`` rows (``pid`` = parent, ``ret`` = child pid). Rules,
    in order:

    1. **loader worker** by name: a process any of whose threads has a comm starting with one
       of ``worker_prefixes`` (PyTorch names its DataLoader workers ``pt_data_worker``).
    2. **main**: the fork parents of those workers (the training processes, one per rank).
       Without named workers: the process that writes the most bytes (checkpoints, logs), or,
       if nothing is written, the one that reads the most.
    3. **loader worker**: a child forked by a main process that reads something and at least
       as many bytes as it writes, i.e. a dataset reader started under a generic name
       (multiprocessing, a DataLoader in an older PyTorch).
    4. **main**: a remaining process with the same comm as a main process that is neither a
       child nor the parent of one: the other ranks of a job whose ranks are siblings rather
       than children of rank 0 (Horovod/MPI); a launcher (torchrun) is a parent of mains and a
       writing helper forked by a main is its child, so both stay "other".
    5. **other**: everything else (launcher, shell, helpers such as nvidia-smi).

    Block rows are ignored (they are device-wide and their pid is whoever issued the request).
    Returns columns ``pid, comm, parent, group, read_bytes, write_bytes, io_events, first_ns``
    (``io_events``: read and write calls, each row weighted by its ``count``),
    sorted by group (main, loader worker, other) then by first appearance. The per-event work
    is vectorised; only the per-process rules (a few hundred processes at most) are Python.
    """
    columns = {
        "pid": "int32",
        "comm": "string",
        "parent": "int64",
        "group": pd.CategoricalDtype(list(PROCESS_GROUPS), ordered=True),
        "read_bytes": "int64",
        "write_bytes": "int64",
        "io_events": "int64",
        "first_ns": "int64",
    }
    empty = pd.DataFrame({c: pd.Series([], dtype=d) for c, d in columns.items()})
    if len(events) == 0:
        return empty
    # Work on column arrays filtered once, not on a filtered copy of the whole frame, and
    # aggregate with numpy over the inverse of np.unique (a few processes, millions of rows).
    kind = events["kind"]
    keep = ~kind.isin(BLOCK_KINDS).to_numpy()
    if not keep.any():
        return empty
    pid = events["pid"].to_numpy()[keep]
    is_read = kind.isin(READ_KINDS).to_numpy()[keep]
    is_write = kind.isin(WRITE_KINDS).to_numpy()[keep]
    nbytes = events["bytes"].to_numpy()[keep]
    calls = events["count"].to_numpy()[keep]
    ts = events["ts_ns"].to_numpy()[keep]
    uniq, inv = np.unique(pid, return_inverse=True)
    k = len(uniq)

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(inv, weights=values, minlength=k).round().astype(np.int64)

    def last_row(mask: np.ndarray) -> np.ndarray:
        """Per process, the index of its last row where ``mask`` holds, or -1."""
        last = np.full(k, -1, dtype=np.int64)
        rows = np.flatnonzero(mask)
        np.maximum.at(last, inv[rows], rows)
        return last

    first_ns = np.full(k, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_ns, inv, ts)
    # A run has a handful of distinct names: factorise them once, so that prefix tests and
    # "which name" work on integer codes instead of millions of strings (-1: no name).
    codes, names = pd.factorize(events["comm"])
    codes = codes[keep]
    names = pd.Index(names, dtype="string")
    # A process's name is its main thread's comm (other threads have names like pt_autograd_0);
    # fall back to the last comm seen when the main thread never appears.
    named_row = codes >= 0
    main_thread = events["tid"].to_numpy()[keep] == pid
    row = last_row(named_row & main_thread)
    row = np.where(row >= 0, row, last_row(named_row))
    code = np.where(row >= 0, codes[row], -1)
    comm = pd.array([pd.NA] * k, dtype="string")
    comm[code >= 0] = names.take(code[code >= 0]).to_numpy()
    procs = pd.DataFrame(
        {
            "read_bytes": total(np.where(is_read, nbytes, 0)),
            "write_bytes": total(np.where(is_write, nbytes, 0)),
            "io_events": total(np.where(is_read | is_write, calls, 0)),
            "first_ns": first_ns,
            "comm": comm,
        },
        index=pd.Index(uniq, name="pid"),
    )

    is_fork = (kind == "fork").to_numpy()[keep] & (events["ret"].to_numpy()[keep] > 0)
    # Later fork rows for the same child pid (pid reuse) do not override the first parent.
    parent_of: dict[int, int] = {}
    children = events["ret"].to_numpy()[keep][is_fork].tolist()
    for child, parent in zip(children, pid[is_fork].tolist(), strict=True):
        parent_of.setdefault(int(child), int(parent))
    worker_name = names.str.startswith(tuple(worker_prefixes)).to_numpy(dtype=bool, na_value=False)
    named = np.append(worker_name, False)[codes]  # code -1 picks the appended False
    workers = set(np.unique(pid[named]).tolist())

    # The rules below run once per process (a few hundred at most), not per event.
    pids = procs.index.to_numpy().tolist()
    mains = {parent_of[w] for w in workers if w in parent_of} - workers
    mains &= set(pids)
    if not mains:
        candidates = procs.drop(index=list(workers), errors="ignore")
        if len(candidates):
            column = "write_bytes" if candidates["write_bytes"].max() > 0 else "read_bytes"
            mains = {int(candidates[column].idxmax())}
    read_bytes = procs["read_bytes"].to_dict()
    write_bytes = procs["write_bytes"].to_dict()
    for p in pids:
        if (
            p not in mains
            and p not in workers
            and parent_of.get(p) in mains
            and read_bytes[p] > 0
            and read_bytes[p] >= write_bytes[p]
        ):
            workers.add(p)
    comm_of = {p: c for p, c in procs["comm"].items() if c is not pd.NA}
    main_comms = {comm_of[m] for m in mains if m in comm_of}
    parents_of_mains = {parent_of.get(m) for m in mains}
    for p in pids:
        if (
            p not in mains
            and p not in workers
            and p not in parents_of_mains
            and parent_of.get(p) not in mains
            and comm_of.get(p) in main_comms
        ):
            mains.add(p)

    group = np.full(len(pids), "other", dtype=object)
    pid_array = np.asarray(pids)
    group[np.isin(pid_array, list(workers))] = "loader worker"
    group[np.isin(pid_array, list(mains))] = "main"
    procs["group"] = group
    procs["parent"] = [parent_of.get(p, -1) for p in pids]
    out = procs.reset_index()
    out = out.astype({c: d for c, d in columns.items()})[list(columns)]
    return out.sort_values(["group", "first_ns", "pid"], kind="stable").reset_index(drop=True)
