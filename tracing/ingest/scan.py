"""Kernels and layout shared by the parsers and the join: bytes scanned 8 at a time, numbers,
times, interned names, an open-addressing table of int64 keys; the merge rows' columns and the
parsers' info slots."""

from __future__ import annotations

from typing import Any

import numpy as np

from tracing.ingest.jit import allocating as _allocating
from tracing.ingest.jit import inline as _inline

_U64_GOLDEN = 0x9E3779B97F4A7C15
_U64_MIX = 0xBF58476D1CE4E5B9


@_inline
def _name_slot(table: np.ndarray, names: np.ndarray, w0: Any, w1: Any, length: int) -> int:
    """The slot of an interned name of at most 16 bytes (packed little-endian in w0, w1) in an
    open-addressing table of codes (-1: empty): where it is, or the empty slot to put it in."""
    h = (w0 ^ (w1 * np.uint64(_U64_GOLDEN)) ^ np.uint64(length)) * np.uint64(_U64_MIX)
    mask = np.uint64(len(table) - 1)
    slot = (h >> np.uint64(32)) & mask
    while True:
        code = table[slot]
        if code < 0:
            return np.int64(slot)
        if names[code, 0] == w0 and names[code, 1] == w1 and names[code, 2] == np.uint64(length):
            return np.int64(slot)  # (the length as uint64: int64 against uint64 compares floats)
        slot = (slot + np.uint64(1)) & mask


@_inline
def _intern(table: np.ndarray, names: np.ndarray, count: np.ndarray, w0: Any, w1: Any, n: int):
    """The code of a name (see :func:`_name_slot`), added when new; -1 when the table is full."""
    slot = _name_slot(table, names, w0, w1, n)
    code = table[slot]
    if code >= 0:
        return code
    code = count[0]
    if code >= len(names) or 2 * code >= len(table):
        return -1
    names[code, 0] = w0
    names[code, 1] = w1
    names[code, 2] = np.uint64(n)
    table[slot] = code
    count[0] = code + 1
    return code


# Names and paths are scanned 8 bytes at a time (one load, a few arithmetic steps, no branch per
# byte; numbers are short, their digits read one by one): a text block is also read as
# little-endian words (``words``, the same memory), with at least 16 bytes after its last line.
_ONES = np.uint64(0x0101010101010101)
_HIGHS = np.uint64(0x8080808080808080)
_TABS = np.uint64(0x0909090909090909)
_ASCII_ZEROS = np.uint64(0x3030303030303030)
_NOT_DIGIT = np.uint64(0x7676767676767676)  # + a byte of 0-9: no high bit
_NEWLINES = np.uint64(0x0A0A0A0A0A0A0A0A)
_BRACKETS = np.uint64(0x5D5D5D5D5D5D5D5D)  # closing square brackets


@_inline
def _word(words: np.ndarray, at: int) -> Any:
    """The 8 bytes at byte ``at`` of ``words`` (little-endian; any alignment)."""
    q = at >> 3
    shift = np.uint64((at & 7) * 8)
    return (words[q] >> shift) | ((words[q + 1] << np.uint64(1)) << (np.uint64(63) - shift))


@_inline
def _low_bytes(k: int) -> Any:
    """A mask of the ``k`` (0 to 7) low bytes of a word."""
    return (np.uint64(1) << np.uint64(8 * k)) - np.uint64(1)


@_inline
def _first_flagged(flags: Any) -> int:
    """The index of the lowest byte of ``flags`` (not 0) with its high bit set."""
    low = flags & (~flags + np.uint64(1))
    return np.int64(((low >> np.uint64(7)) * np.uint64(0x0001020304050607)) >> np.uint64(56))


@_inline
def _zero_bytes(x: Any) -> Any:
    """The high bit set in the zero bytes of ``x`` (exactly up to its first zero byte)."""
    return (x - _ONES) & ~x & _HIGHS


@_inline
def _find(words: np.ndarray, p: int, one: Any, other: Any) -> int:
    """The position of the first byte at or after ``p`` that is ``one``'s or ``other``'s
    (words of 8 copies of a byte)."""
    while True:
        x = _word(words, p)
        flags = _zero_bytes(x ^ one) | _zero_bytes(x ^ other)
        if flags:
            return p + _first_flagged(flags)
        p += 8


@_inline
def _field_end(words: np.ndarray, p: int) -> int:
    """The position of the first tab or newline at or after ``p``."""
    return _find(words, p, _TABS, _NEWLINES)


@_inline
def _line_end(words: np.ndarray, p: int) -> int:
    """The position of the first newline at or after ``p``."""
    return _find(words, p, _NEWLINES, _NEWLINES)


@_inline
def _bracket(words: np.ndarray, p: int) -> int:
    """The position of the first closing square bracket or newline at or after ``p``."""
    return _find(words, p, _BRACKETS, _NEWLINES)


@_inline
def _read_name(words: np.ndarray, p: int) -> tuple[int, Any, Any]:
    """Scan a field up to the next tab or newline: (end, first 8 bytes, next 8 bytes), the
    bytes after the field zero (the words mean nothing for a field of more than 16 bytes)."""
    x = _word(words, p)
    flags = _zero_bytes(x ^ _TABS) | _zero_bytes(x ^ _NEWLINES)
    if flags:
        k = _first_flagged(flags)
        return p + k, x & _low_bytes(k), np.uint64(0)
    y = _word(words, p + 8)
    flags = _zero_bytes(y ^ _TABS) | _zero_bytes(y ^ _NEWLINES)
    if flags:
        k = _first_flagged(flags)
        return p + 8 + k, x, y & _low_bytes(k)
    return _field_end(words, p + 16), x, y


@_inline
def _copy_bytes(dst: np.ndarray, at: int, src: np.ndarray, start: int, end: int) -> None:
    """``dst[at : at + end - start] = src[start:end]``, as a loop: numba cannot tell that the
    slices do not overlap and would copy the source first, which needs its runtime (jit.py)."""
    for i in range(end - start):
        dst[at + i] = src[start + i]


@_inline
def _more_digits(buf: np.ndarray, p: int, value: int) -> tuple[int, int]:
    """``value`` followed by the digits at ``p`` (none or more), and the position after them."""
    c = buf[p]
    while c >= 48 and c <= 57:
        value = value * 10 + (c - 48)
        p += 1
        c = buf[p]
    return value, p


@_inline
def _read_int(buf: np.ndarray, p: int, signed: bool) -> tuple[int, int, bool]:
    """An integer at ``p``: (value, position after it, whether there were digits)."""
    negative = False
    if signed and buf[p] == 45:  # '-'
        negative = True
        p += 1
    value, end = _more_digits(buf, p, 0)
    return -value if negative else value, end, end > p


@_inline
def _eight_digits(t: Any) -> int:
    """The number of the 8 digits (0-9 each, the first the lowest byte) of the word ``t``."""
    t = t * np.uint64(10) + (t >> np.uint64(8))
    t = (
        (t & np.uint64(0x000000FF000000FF)) * np.uint64(0x000F424000000064)
        + ((t >> np.uint64(16)) & np.uint64(0x000000FF000000FF)) * np.uint64(0x0000271000000001)
    ) >> np.uint64(32)
    return np.int64(t)


@_inline
def _read_number(buf: np.ndarray, words: np.ndarray, p: int, signed: bool) -> tuple[int, int, bool]:
    """:func:`_read_int` a word at a time: the digits found in one load, up to 8 of them
    converted in a few multiplications (no branch per digit, which mispredicts at each number's
    end); a longer number's further digits one by one."""
    negative = False
    if signed and buf[p] == 45:  # '-'
        negative = True
        p += 1
    t = _word(words, p) ^ _ASCII_ZEROS  # digits: 0-9
    flags = ((t + _NOT_DIGIT) | t) & _HIGHS  # the lowest flagged byte is the first non-digit
    if flags:
        k = _first_flagged(flags)
        if k == 0:
            return 0, p, False
        value = _eight_digits(t << np.uint64(64 - 8 * k))  # zeros in front of the k digits
        p += k
    else:
        value, p = _more_digits(buf, p + 8, _eight_digits(t))
    if negative:
        value = -value
    return value, p, True


@_inline
def _expect(buf: np.ndarray, p: int, text: np.ndarray) -> int:
    """The position after ``text`` when the bytes at ``p`` are ``text``, else -1."""
    for i in range(len(text)):
        if buf[p + i] != text[i]:
            return -1
    return p + len(text)


# The rows of events while they are merged: int64 arrays of _N_COLS columns, a row per event.
# kind, comm and dev are codes (global tables of names), path the number of a path in the
# round's path heap (-1: none), line 1 for a one-by-one syscall line, 2 for an aggregated row.
_C_TS, _C_KIND, _C_PID, _C_TID, _C_COMM, _C_FD, _C_PATH, _C_BYTES = 0, 1, 2, 3, 4, 5, 6, 7
_C_RET, _C_OFFSET, _C_LAT, _C_COUNT, _C_LATMAX, _C_DEV, _C_INC, _C_LINE = range(8, 16)
_N_COLS = 16
_END = np.iinfo(np.int64).max


@_inline
def _put_row(
    rows: np.ndarray,
    i: int,
    ts: int,
    kind: int,
    pid: int,
    tid: int,
    comm: int,
    fd: int,
    path: int,
    nbytes: int,
    ret: int,
    offset: int,
    lat: int,
    count: int,
    latmax: int,
    dev: int,
    inc: int,
    line: int,
) -> None:
    """Write merge row ``i`` of ``rows`` (a kernel's :func:`merge_rows`)."""
    rows[i, _C_TS] = ts
    rows[i, _C_KIND] = kind
    rows[i, _C_PID] = pid
    rows[i, _C_TID] = tid
    rows[i, _C_COMM] = comm
    rows[i, _C_FD] = fd
    rows[i, _C_PATH] = path
    rows[i, _C_BYTES] = nbytes
    rows[i, _C_RET] = ret
    rows[i, _C_OFFSET] = offset
    rows[i, _C_LAT] = lat
    rows[i, _C_COUNT] = count
    rows[i, _C_LATMAX] = latmax
    rows[i, _C_DEV] = dev
    rows[i, _C_INC] = inc
    rows[i, _C_LINE] = line


#: The merge rows' columns by name (:func:`merge_rows`), and the value of each not given.
_COLUMNS = {
    "ts": _C_TS, "kind": _C_KIND, "pid": _C_PID, "tid": _C_TID, "comm": _C_COMM, "fd": _C_FD,
    "path": _C_PATH, "bytes": _C_BYTES, "ret": _C_RET, "offset": _C_OFFSET, "lat": _C_LAT,
    "count": _C_COUNT, "latmax": _C_LATMAX, "dev": _C_DEV, "inc": _C_INC, "line": _C_LINE,
}  # fmt: skip
_DEFAULTS = {"tid": -1, "fd": -1, "path": -1, "bytes": 0, "ret": 0, "offset": -1, "lat": 0}
_DEFAULTS |= {"count": 1, "latmax": 0, "dev": -1, "inc": 1, "line": 0}


def merge_rows(n: int, **columns: Any) -> np.ndarray:
    """``n`` merge rows from Python: each column by its name in :data:`_COLUMNS` (a value or an
    array), those not given their value of :data:`_DEFAULTS` (ts, kind, pid and comm have
    none)."""
    rows = np.empty((n, _N_COLS), dtype=np.int64)
    for name, column in _COLUMNS.items():
        if name in columns:
            rows[:, column] = columns[name]
        elif name in _DEFAULTS:
            rows[:, column] = _DEFAULTS[name]
        else:
            raise TypeError(f"merge_rows: {name} is required")
    unknown = set(columns) - set(_COLUMNS)
    if unknown:
        raise TypeError(f"merge_rows: no column {sorted(unknown)}")
    return rows


# info slots of the parser
_I_ROWS, _I_AGGS, _I_PATHS, _I_HEAP, _I_LOST, _I_SKIPPED, _I_STATUS = range(7)
_I_BEHIND = 8  # "BEHIND <ns>" lines
_FULL_NAMES, _FULL_ROWS = 1, 3
_I_EXAMPLES = 9  # then (start, end) of up to 5 skipped lines


def _texts(*texts: bytes) -> tuple[np.ndarray, ...]:
    """The bytes a kernel looks for, as arrays."""
    return tuple(np.frombuffer(text, dtype=np.uint8) for text in texts)


_AGG_SEP, _AGG_OPEN, _KEY_END = _texts(b", ", b"]: (", b"]: (")
_WORD_LOST, _WORD_EVENTS, _WORD_READY, _WORD_BEHIND, _WORD_ATTACHING = _texts(
    b"Lost ", b" events", b"READY ", b"BEHIND ", b"Attaching "
)
_WORD_AGG, _WORD_BLK, _WORD_EV, _WORD_OP = _texts(b"@agg", b"@blk", b"@ev", b"@op")
_WORD_WARNING, _WORD_MAP_UPDATE = _texts(b"WARNING: ", b"Failed to map_update_elem")
# Kind codes (fixed in the parser's kind table, see SYSCALL_KINDS)
_K_RW_END, _K_PREAD, _K_PWRITE, _K_OPENAT, _K_LSEEK, _K_MMAP = 6, 1, 4, 6, 8, 11


@_inline
def _slot(keys: np.ndarray, key: int) -> int:
    """The slot of ``key`` in an open-addressing table of int64 keys (-1: empty), or the empty
    slot where it would go."""
    mask = np.uint64(len(keys) - 1)
    slot = ((np.uint64(key) * np.uint64(_U64_GOLDEN)) >> np.uint64(29)) & mask
    while True:
        k = keys[slot]
        if k == key or k == -1:
            return np.int64(slot)
        slot = (slot + np.uint64(1)) & mask


@_inline
def _put(keys: np.ndarray, values: np.ndarray, used: np.ndarray, key: int, value: int) -> None:
    """Set ``key`` to ``value`` (the table must have room: see :func:`_rehash`)."""
    slot = _slot(keys, key)
    if keys[slot] == -1:
        keys[slot] = key
        used[0] += 1
    values[slot] = value


@_inline
def _get(keys: np.ndarray, values: np.ndarray, key: int) -> int:
    slot = _slot(keys, key)
    return values[slot] if keys[slot] == key else -1


@_allocating
def _rehash(keys: np.ndarray, values: np.ndarray, size: int):
    """The table with ``size`` slots (a power of two)."""
    new_keys = np.full(size, -1, dtype=np.int64)
    new_values = np.empty(size, dtype=np.int64)
    for s in range(len(keys)):
        if keys[s] != -1:
            t = _slot(new_keys, keys[s])
            new_keys[t] = keys[s]
            new_values[t] = values[s]
    return new_keys, new_values
