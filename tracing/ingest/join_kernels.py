"""The compiled descriptor join of a round of merge rows (:func:`_join_round`) and the path
dictionary of a round (:func:`_number_paths`, :func:`_distinct_paths`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tracing.ingest.jit import inline as _inline
from tracing.ingest.jit import kernel as _kernel
from tracing.ingest.scan import (
    _C_BYTES,
    _C_COMM,
    _C_COUNT,
    _C_DEV,
    _C_FD,
    _C_INC,
    _C_KIND,
    _C_LAT,
    _C_LATMAX,
    _C_LINE,
    _C_OFFSET,
    _C_PATH,
    _C_PID,
    _C_RET,
    _C_TID,
    _C_TS,
    _U64_GOLDEN,
    _U64_MIX,
    _get,
    _put,
    _word,
)

# What the descriptor join does with a row (by its kind), see _join_round.
_A_NONE, _A_OPEN, _A_CLOSE, _A_DUP, _A_USE, _A_FORK = 0, 1, 2, 3, 4, 5
# Rows of the join's int64 and int32 outputs (the columns of events.parquet; path: a number).
_O_TS, _O_BYTES, _O_COUNT, _O_RET, _O_OFFSET, _O_LAT, _O_LATMAX = range(7)
_O_PID, _O_TID, _O_FD, _O_COMM, _O_DEV, _O_CONTAINER, _O_PATH = range(7)
#: Task ids are below this (the kernel's PID_MAX_LIMIT): dense tables are indexed by them.
_PID_LIMIT = 1 << 22
# join state slots: rows written, descriptor table entries
_S_WRITTEN, _S_USED = 1, 2


@_kernel
def _join_round(
    parts: tuple,
    times: tuple,
    orders: tuple,
    at: np.ndarray,
    end: np.ndarray,
    bases: np.ndarray,
    parsed: np.ndarray,
    comm_map: np.ndarray,
    kind_map: np.ndarray,
    action: np.ndarray,
    leaders: np.ndarray,
    owners: np.ndarray,
    fd_keys: np.ndarray,
    fd_values: np.ndarray,
    tid_comms: np.ndarray,
    state: np.ndarray,
    out64: np.ndarray,
    out32: np.ndarray,
    out_kind: np.ndarray,
    out_inside: np.ndarray,
    totals: np.ndarray,
) -> bool:
    """Join one round of merge rows into the output columns (from ``state[_S_WRITTEN]`` on):
    the rows ``orders[p][at[p]:end[p]]`` of each part ``p`` (in time order, at ``times[p]``),
    merged in time order (ties: the row of the lower part first); returns False when the
    descriptor table is half full (grow it and call again: ``at`` says where it stopped),
    True when done. The rows of a part with ``parsed`` set have the parser's codes of kinds
    and thread names (``kind_map``, ``comm_map``: ours), and paths numbered from
    ``bases[part]``.

    The path of an fd-based call is looked up in the (pid, fd) -> path table (``fd_keys``,
    ``fd_values``), which the calls update as they go: ``action[kind]`` says whether a row
    opens (an openat names its descriptor), closes (a successful close unnames it; the close
    itself still resolves to the file), copies (a dup resolves the old descriptor and gives the
    new one the same name, or none), uses (resolved) or forks (the child, ``ret``, gets a copy
    of its parent's table). A fork whose child is no thread-group leader (``leaders[child]``
    0: a thread) is left out. An aggregated row takes the comm of the latest one-by-one line
    of its thread (``tid_comms``: comm + 1 by tid), -1 when there was none. ``owners``: the
    container (code + 1) of an in-container pid, 0 for none; ``owners[_PID_LIMIT]`` applies
    to every pid (one container). ``totals[container + 1, kind]`` adds up rows, count, bytes."""
    every_pid = owners[len(owners) - 1]
    m = state[_S_WRITTEN]
    room = len(fd_keys) // 2
    while True:
        best = second = -1  # the parts with the earliest next rows
        best_ts = second_ts = 0
        for p in range(len(at)):
            if at[p] < end[p]:
                t = times[p][at[p]]
                if best < 0 or t < best_ts:
                    second, second_ts = best, best_ts
                    best, best_ts = p, t
                elif second < 0 or t < second_ts:
                    second, second_ts = p, t
        if best < 0:
            break
        rows, order, ts, a, e = parts[best], orders[best], times[best], at[best], end[best]
        base, coded = bases[best], parsed[best]
        # the best part's rows up to the second's next row
        while a < e and (second < 0 or ts[a] < second_ts or (ts[a] == second_ts and best < second)):
            if state[_S_USED] + 2 > room:
                at[best] = a
                state[_S_WRITTEN] = m
                return False
            i = order[a]
            a += 1
            kind = rows[i, _C_KIND]
            comm = rows[i, _C_COMM]
            path = rows[i, _C_PATH]
            if coded:
                kind = kind_map[kind]
                if comm >= 0:
                    comm = comm_map[comm]
            if path >= 0:
                path += base
            what = action[kind]
            pid = rows[i, _C_PID]
            tid = rows[i, _C_TID]
            line = rows[i, _C_LINE]
            if line == 1:
                if 0 <= tid < len(tid_comms):
                    tid_comms[tid] = comm + 1
            elif line == 2:
                comm = tid_comms[tid] - 1 if 0 <= tid < len(tid_comms) else -1
            if what == _A_FORK:
                child = rows[i, _C_RET]
                if 0 <= child < len(leaders) and leaders[child] == 0:
                    continue  # a thread
                if child != pid and child >= 0:
                    copies = 0
                    for s in range(len(fd_keys)):
                        k = fd_keys[s]
                        if k != -1 and (k >> 32) == pid:
                            copies += 1
                    if state[_S_USED] + copies + 2 > room:
                        at[best] = a - 1
                        state[_S_WRITTEN] = m
                        return False
                    for s in range(len(fd_keys)):
                        k = fd_keys[s]
                        if k != -1 and (k >> 32) == child:
                            fd_values[s] = -1
                    for s in range(len(fd_keys)):
                        k = fd_keys[s]
                        if k != -1 and (k >> 32) == pid:
                            _put(
                                fd_keys,
                                fd_values,
                                state[_S_USED:],
                                (child << 32) | (k & 0xFFFFFFFF),
                                fd_values[s],
                            )
            elif what != _A_NONE:
                fd = rows[i, _C_FD]
                if fd >= 0:
                    key = (pid << 32) | fd
                    if what == _A_OPEN:
                        _put(fd_keys, fd_values, state[_S_USED:], key, path)
                    else:
                        path = _get(fd_keys, fd_values, key)
                        if what == _A_CLOSE:
                            if rows[i, _C_RET] == 0 and path != -1:
                                _put(fd_keys, fd_values, state[_S_USED:], key, -1)
                        elif what == _A_DUP:
                            new_fd = rows[i, _C_RET]
                            if new_fd >= 0:
                                new_key = (pid << 32) | new_fd
                                if path != -1 or _get(fd_keys, fd_values, new_key) != -1:
                                    _put(fd_keys, fd_values, state[_S_USED:], new_key, path)
            inside = rows[i, _C_INC] != 0
            container = -1
            if inside:
                if every_pid:
                    container = every_pid - 1
                elif 0 <= pid < _PID_LIMIT:
                    container = owners[pid] - 1
            nbytes = rows[i, _C_BYTES]
            count = rows[i, _C_COUNT]
            totals[container + 1, kind, 0] += 1
            totals[container + 1, kind, 1] += count
            totals[container + 1, kind, 2] += nbytes
            out64[_O_TS, m] = rows[i, _C_TS]
            out64[_O_BYTES, m] = nbytes
            out64[_O_COUNT, m] = count
            out64[_O_RET, m] = rows[i, _C_RET]
            out64[_O_OFFSET, m] = rows[i, _C_OFFSET]
            out64[_O_LAT, m] = rows[i, _C_LAT]
            out64[_O_LATMAX, m] = rows[i, _C_LATMAX]
            out32[_O_PID, m] = pid
            out32[_O_TID, m] = tid
            out32[_O_FD, m] = rows[i, _C_FD]
            out32[_O_COMM, m] = comm
            out32[_O_DEV, m] = rows[i, _C_DEV]
            out32[_O_CONTAINER, m] = container
            out32[_O_PATH, m] = path
            out_kind[m] = kind
            out_inside[m] = inside
            m += 1
        at[best] = a
    state[_S_WRITTEN] = m
    return True


@_inline
def _tail(words: np.ndarray, at: int, end: int) -> Any:
    """The bytes ``at`` to ``end`` (at most 8) of ``words``, the rest zero."""
    word = _word(words, at)
    if end - at < 8:
        word &= (np.uint64(1) << np.uint64(8 * (end - at))) - np.uint64(1)
    return word


@_inline
def _hash_bytes(words: np.ndarray, start: int, end: int) -> Any:
    h = np.uint64(end - start) * np.uint64(_U64_GOLDEN)
    for at in range(start, end, 8):
        h = (h ^ _tail(words, at, end)) * np.uint64(_U64_MIX)
        h ^= h >> np.uint64(31)
    return h


@_inline
def _same_bytes(words: np.ndarray, a: int, a_end: int, b: int, b_end: int) -> bool:
    if a_end - a != b_end - b:
        return False
    for k in range(0, a_end - a, 8):
        if _tail(words, a + k, a_end) != _tail(words, b + k, b_end):
            return False
    return True


@_kernel
def _number_paths(refs: np.ndarray, local: np.ndarray, picked: np.ndarray) -> int:
    """Number the heap numbers ``refs`` uses (-1: none) in the order of their first row:
    ``refs`` becomes those numbers, in place, ``picked`` their heap numbers; returns how many.
    ``local`` (-1 everywhere, as it is left) maps heap numbers to them meanwhile."""
    k = 0
    for i in range(len(refs)):
        r = refs[i]
        if r >= 0:
            c = local[r]
            if c < 0:
                c = k
                local[r] = k
                picked[k] = r
                k += 1
            refs[i] = c
    for j in range(k):
        local[picked[j]] = -1
    return k


@_kernel
def _distinct_paths(
    refs: np.ndarray,
    picked: np.ndarray,
    offsets: np.ndarray,
    words: np.ndarray,
    table: np.ndarray,
    first: np.ndarray,
    hashes: np.ndarray,
    codes: np.ndarray,
) -> int:
    """The same path under several of the numbers of :func:`_number_paths` (``picked``: their
    heap numbers; ``offsets``, ``words``: the heap) becomes one code: ``first`` gets the heap
    number of each distinct path, ``refs`` their codes, in place; returns how many. ``table``
    (-1 everywhere, a power of two of at least twice ``picked``'s slots), ``hashes`` and
    ``codes``: working space."""
    k = len(picked)
    mask = np.uint64(len(table) - 1)
    n = 0
    for j in range(k):
        r = picked[j]
        start, end = offsets[r], offsets[r + 1]
        h = _hash_bytes(words, start, end)
        slot = (h >> np.uint64(20)) & mask
        while True:
            c = table[slot]
            if c < 0:
                table[slot] = n
                first[n] = r
                hashes[n] = h
                codes[j] = n
                n += 1
                break
            other = first[c]
            if hashes[c] == h and _same_bytes(
                words, offsets[other], offsets[other + 1], start, end
            ):
                codes[j] = c
                break
            slot = (slot + np.uint64(1)) & mask
    if n < k:
        for i in range(len(refs)):
            if refs[i] >= 0:
                refs[i] = codes[refs[i]]
    return n


@_kernel
def _validity(codes: np.ndarray, bitmap: np.ndarray) -> int:
    """Arrow's validity bitmap of ``codes`` (bit set: code >= 0); returns the nulls."""
    n = len(codes)
    nulls = 0
    for b in range((n + 7) // 8):
        byte = 0
        for k in range(min(8, n - 8 * b)):
            if codes[8 * b + k] >= 0:
                byte |= 1 << k
            else:
                nulls += 1
        bitmap[b] = byte
    return nulls


@_kernel
def _paths_used(rows: np.ndarray, which: np.ndarray, base: int, used: np.ndarray) -> None:
    """Mark the paths (heap numbers: ``base`` + theirs) of ``rows[which]`` in ``used``."""
    for i in which:
        path = rows[i, _C_PATH]
        if path >= 0:
            used[base + path] = True


@_kernel
def _renumber_paths(rows: np.ndarray, which: np.ndarray, base: int, numbers: np.ndarray) -> None:
    """Give the paths of ``rows[which]`` (``base`` + theirs) their new numbers (by old)."""
    for i in which:
        path = rows[i, _C_PATH]
        if path >= 0:
            rows[i, _C_PATH] = numbers[base + path]


#: The most parts a round's rows are taken from without a copy (see :func:`_join_round`).
_MAX_PARTS = 8
