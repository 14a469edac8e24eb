"""The compiled parsers of raw/syscalls.txt, raw/block.txt and raw/cache.txt (one pass each over
a block of whole lines; see the package doc)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tracing.ingest.jit import inline as _inline
from tracing.ingest.jit import kernel as _kernel
from tracing.ingest.scan import (
    _AGG_OPEN,
    _AGG_SEP,
    _C_PID,
    _FULL_NAMES,
    _FULL_ROWS,
    _I_AGGS,
    _I_BEHIND,
    _I_EXAMPLES,
    _I_HEAP,
    _I_LOST,
    _I_PATHS,
    _I_ROWS,
    _I_SKIPPED,
    _I_STATUS,
    _K_LSEEK,
    _K_MMAP,
    _K_OPENAT,
    _K_PREAD,
    _K_PWRITE,
    _K_RW_END,
    _KEY_END,
    _WORD_AGG,
    _WORD_ATTACHING,
    _WORD_BEHIND,
    _WORD_BLK,
    _WORD_EV,
    _WORD_EVENTS,
    _WORD_LOST,
    _WORD_MAP_UPDATE,
    _WORD_OP,
    _WORD_READY,
    _WORD_WARNING,
    _bracket,
    _copy_bytes,
    _expect,
    _field_end,
    _get,
    _intern,
    _line_end,
    _low_bytes,
    _put,
    _put_row,
    _read_int,
    _read_name,
    _read_number,
    _texts,
    _word,
)
from tracing.ingest.schema import _N_FIXED_KINDS


@_inline
def _parse_agg(
    buf: np.ndarray,
    p: int,
    aggs: np.ndarray,
    agg_times: np.ndarray,
    j: int,
    agg_kinds: np.ndarray,
    fields: np.ndarray,
) -> int:
    """Parse the aggregated row at ``p`` (just after "@agg") into ``aggs[j]``, its time into
    ``agg_times[j]`` (grammar of tracing.aggregates; ``fields``: room for its 14 numbers);
    returns 1, 0 when the line is not one, -1 - code for an unknown kind."""
    value, p, ok = _read_int(buf, p, False)
    if not ok or buf[p] != 91:  # '['
        return 0
    p += 1
    for f in range(14):
        if f == 8:
            p = _expect(buf, p, _AGG_OPEN)
            if p < 0:
                return 0
        elif f > 0:
            p = _expect(buf, p, _AGG_SEP)
            if p < 0:
                return 0
        value, p, ok = _read_int(buf, p, f == 2 or f == 9 or f == 13)
        if not ok:
            return 0
        fields[f] = value
    if buf[p] != 41 or buf[p + 1] != 10:  # ')' and the end of the line
        return 0
    code = fields[3]
    if code >= len(agg_kinds):
        return -1 - code
    _put_row(
        aggs, j, fields[12], agg_kinds[code], fields[0], fields[1], -1, fields[2], -1, fields[9],
        fields[9], fields[13], fields[10], fields[8], fields[11], -1, 1, 2,
    )  # fmt: skip
    agg_times[j] = fields[12]
    return 1


@_inline
def _noise_line(buf: np.ndarray, p: int, info: np.ndarray) -> int:
    """Whether the line at ``p`` is bpftrace's own: 0 when not; 1 when it is ("Lost N
    events" counted as lost; "BEHIND <ns>", the script's mark of its user space falling
    behind, counted in ``info[_I_BEHIND]``); 2 for a warning of bpftrace's ``-k`` (a helper
    call failed), which bpftrace follows with two lines (the script's line and a mark under
    the call): a failed map update (a full map) is one event lost."""
    q = _expect(buf, p, _WORD_LOST)
    if q >= 0:
        value, q, ok = _read_int(buf, q, False)
        if ok and _expect(buf, q, _WORD_EVENTS) >= 0:
            info[_I_LOST] += value
            return 1
    if _expect(buf, p, _WORD_READY) >= 0 or _expect(buf, p, _WORD_ATTACHING) >= 0:
        return 1
    if _expect(buf, p, _WORD_BEHIND) >= 0:
        info[_I_BEHIND] += 1
        return 1
    start = p
    blank = True
    while buf[p] != 10:
        c = buf[p]
        if c != 32 and c != 9 and c != 13 and c != 11 and c != 12:
            blank = False
            if c == 87 and _expect(buf, p, _WORD_WARNING) >= 0 and p > start:  # 'W'
                if _has(buf, p, _WORD_MAP_UPDATE):
                    info[_I_LOST] += 1
                return 2
        p += 1
    return 1 if blank else 0


@_inline
def _has(buf: np.ndarray, p: int, text: np.ndarray) -> bool:
    """Whether ``text`` occurs in the line from ``p`` on."""
    while buf[p] != 10:
        if buf[p] == text[0] and _expect(buf, p, text) >= 0:
            return True
        p += 1
    return False


@_inline
def _skip_echo(words: np.ndarray, p: int, end: int) -> int:
    """The end of the two lines after a warning's line (ending at ``p``), as far as ``end``."""
    for _ in range(2):
        if p + 1 < end:
            p = _line_end(words, p + 1)
    return p


@_inline
def _skip_line(buf: np.ndarray, words: np.ndarray, pos: int, end: int, info: np.ndarray) -> int:
    """A line at ``pos`` that gives no row: the tracer's noise (:func:`_noise_line`; a warning's
    echo skipped with it) or a skipped line, counted, its place kept among the first examples.
    Returns the position of the newline it ends at."""
    p = _line_end(words, pos)
    noise = _noise_line(buf, pos, info)
    if noise == 0:
        k = info[_I_SKIPPED]
        if k < 5:
            info[_I_EXAMPLES + 2 * k] = pos
            info[_I_EXAMPLES + 2 * k + 1] = p
        info[_I_SKIPPED] = k + 1
    elif noise == 2:
        p = _skip_echo(words, p, end)
    return p


@_inline
def _tab_numbers(buf: np.ndarray, words: np.ndarray, p: int, fields: np.ndarray, count: int) -> int:
    """``count`` signed numbers into ``fields[:count]``, the first after the tab at ``p``, each
    ending at a tab: the position of the last one's tab, or -1."""
    for f in range(count):
        value, p, ok = _read_number(buf, words, p + 1, True)
        if not ok or buf[p] != 9:
            return -1
        fields[f] = value
    return p


@_inline
def _tab_name(
    buf: np.ndarray,
    words: np.ndarray,
    p: int,
    table: np.ndarray,
    names: np.ndarray,
    count: np.ndarray,
) -> tuple[int, int]:
    """The name after the tab at ``p`` (at most 16 bytes, ending at a tab) interned in a name
    table (``table``, ``names``, ``count``: see :func:`_intern`): the position of its tab and
    its code; the code -1 when the table is full, -2 when there is no such name."""
    start = p + 1
    p, w0, w1 = _read_name(words, start)
    if buf[p] != 9 or p - start > 16:
        return p, -2
    return p, _intern(table, names, count, w0, w1, p - start)


@_inline
def _ev_field(
    buf: np.ndarray,
    words: np.ndarray,
    p: int,
    ev: np.ndarray,
    f: int,
    separated: bool,
    signed: bool,
) -> int:
    """A number at ``p`` (after ", " when ``separated``; -1: none) into ``ev[f]``; the position
    after it, or -1."""
    if p < 0:
        return -1
    if separated:
        p = _expect(buf, p, _AGG_SEP)
        if p < 0:
            return -1
    value, p, ok = _read_number(buf, words, p, signed)
    if not ok:
        return -1
    ev[f] = value
    return p


@_inline
def _parse_ev_map(buf: np.ndarray, words: np.ndarray, p: int, is_open: bool, ev: np.ndarray) -> int:
    """Parse a call printed from syscalls.bt's maps, from ``p`` (just after "@ev" or "@op")::

        @evQ[ts, tid, comm]: (kind, pid, fd, ret, arg, latency)
        @opQ[ts, tid, comm]: (pid, ret, latency, path)        (openat)

    ``ev``: ts, tid, kind code, pid, fd, ret, arg, latency, then the start and end of the comm
    and of the path (empty but for openat). The comm ends at the first "]: (" (a thread name
    may hold commas); the path is the rest of the line but its closing parenthesis. Returns the
    position of the line's newline, or -1 when the line is not one of these."""
    value, p, ok = _read_number(buf, words, p, False)
    if not ok or buf[p] != 91:  # '['
        return -1
    p = _ev_field(buf, words, p + 1, ev, 0, False, False)
    p = _ev_field(buf, words, p, ev, 1, True, False)
    if p < 0:
        return -1
    p = _expect(buf, p, _AGG_SEP)
    if p < 0:
        return -1
    ev[8] = p
    p = _bracket(words, p)
    while _expect(buf, p, _KEY_END) < 0:  # "]: ("
        if buf[p] == 10:
            return -1
        p = _bracket(words, p + 1)
    if p - ev[8] > 16:
        return -1
    ev[9] = p
    p += len(_KEY_END)
    if is_open:
        ev[2] = _K_OPENAT
        ev[4] = -1
        ev[6] = -1
        p = _ev_field(buf, words, p, ev, 3, False, True)
        p = _ev_field(buf, words, p, ev, 5, True, True)
        p = _ev_field(buf, words, p, ev, 7, True, True)
        p = _expect(buf, p, _AGG_SEP) if p >= 0 else -1
        if p < 0:
            return -1
        stop = _line_end(words, p)
        if buf[stop - 1] != 41:  # ')'
            return -1
        ev[10] = p
        ev[11] = stop - 1
        return stop
    p = _ev_field(buf, words, p, ev, 2, False, True)  # written out: each field's branches apart
    p = _ev_field(buf, words, p, ev, 3, True, True)
    p = _ev_field(buf, words, p, ev, 4, True, True)
    p = _ev_field(buf, words, p, ev, 5, True, True)
    p = _ev_field(buf, words, p, ev, 6, True, True)
    p = _ev_field(buf, words, p, ev, 7, True, True)
    if p < 0:
        return -1
    ev[10] = p
    ev[11] = p
    return p + 1 if buf[p] == 41 and buf[p + 1] == 10 else -1  # ')' and the newline


@_kernel
def _parse_syscall_block(
    buf: np.ndarray,
    words: np.ndarray,
    pos: int,
    end: int,
    rows: np.ndarray,
    row_times: np.ndarray,
    aggs: np.ndarray,
    agg_times: np.ndarray,
    offsets: np.ndarray,
    heap: np.ndarray,
    kind_table: np.ndarray,
    kind_names: np.ndarray,
    kind_count: np.ndarray,
    comm_table: np.ndarray,
    comm_names: np.ndarray,
    comm_count: np.ndarray,
    agg_kinds: np.ndarray,
    seen: np.ndarray,
    info: np.ndarray,
    scratch: np.ndarray,
) -> int:
    """Parse the lines of ``buf[pos:end]`` (``buf[end - 1]`` is a newline; ``words``: the same
    bytes as words, see :func:`_word`) of raw/syscalls.txt (``scratch``: at least 26 int64 of
    working space).

    One-by-one lines become columns of ``rows`` (see ``_C_*``; their times also in
    ``row_times``, an aggregated row's in ``agg_times``), with the derived values of
    events.parquet: an openat's fd is its return value (-1 when it failed), bytes are a read's
    or write's return value (0 on error) or an mmap's length, offset a pread64/pwrite64's
    argument or an lseek's result (-1 else); an openat's path is copied to ``heap`` (its end
    in ``offsets``, its number in the path column). Aggregated rows go to ``aggs``. The pid
    of every row is marked in ``seen`` (the thread-group leaders, by pid). Returns
    the position reached: ``end``, or the start of a line with ``info[_I_STATUS]``
    ``_FULL_NAMES`` or ``_FULL_ROWS`` when a name table or the output is full (grow it and
    call again from there). A line that gives no row (an aggregated row of an unknown kind
    code too) is counted as skipped (:func:`_skip_line`)."""
    n = info[_I_ROWS]
    n_agg = info[_I_AGGS]
    fields = scratch[:14]  # of an aggregated row
    ev = scratch[14:26]  # of a call printed from a map
    n_paths = info[_I_PATHS]
    hp = info[_I_HEAP]
    info[_I_STATUS] = 0
    while pos < end:
        if n >= rows.shape[0] or n_agg >= aggs.shape[0]:
            info[_I_STATUS] = _FULL_ROWS
            break
        ok = False
        path_start = path_end = 0
        q = _expect(buf, pos, _WORD_EV)
        is_open = False
        if q < 0:
            q = _expect(buf, pos, _WORD_OP)
            is_open = q >= 0
        if q >= 0:  # a call printed from syscalls.bt's maps
            p = _parse_ev_map(buf, words, q, is_open, ev)
            ok = p >= 0
            if not ok:
                p = _line_end(words, pos)
            if ok:
                ts, tid, kind, pid = ev[0], ev[1], ev[2], ev[3]
                fd, ret, arg, lat = ev[4], ev[5], ev[6], ev[7]
                ok = 0 <= kind < _N_FIXED_KINDS
            if ok:
                w0, w1 = _name_words(words, ev[8], ev[9] - ev[8])
                comm = _intern(comm_table, comm_names, comm_count, w0, w1, ev[9] - ev[8])
                if comm < 0:
                    info[_I_STATUS] = _FULL_NAMES
                    break
                path_start, path_end = ev[10], ev[11]
            digits = False
        else:  # a tab-separated line (syscalls.bt before its calls were batched in maps)
            ts, p, digits = _read_number(buf, words, pos, False)
        if digits and buf[p] == 9:
            p, kind = _tab_name(buf, words, p, kind_table, kind_names, kind_count)
            if kind == -1:
                info[_I_STATUS] = _FULL_NAMES
                break
            if kind >= 0:
                p = _tab_numbers(buf, words, p, ev, 6)
            if kind >= 0 and p >= 0:  # else ok stays False: a skipped line
                pid, tid, fd, ret, arg, lat = ev[0], ev[1], ev[2], ev[3], ev[4], ev[5]
                p, comm = _tab_name(buf, words, p, comm_table, comm_names, comm_count)
                if comm == -1:
                    info[_I_STATUS] = _FULL_NAMES
                    break
                if comm >= 0:
                    path_start = p + 1
                    p = _field_end(words, path_start)
                    path_end = p
                    ok = buf[p] == 10
        if ok:
            nbytes = 0  # the derived values of events.parquet (see the doc)
            if kind < _K_RW_END:
                nbytes = ret if ret > 0 else 0
            elif kind == _K_MMAP:
                nbytes = arg
            offset = -1
            if kind in (_K_PREAD, _K_PWRITE):
                offset = arg
            elif kind == _K_LSEEK and ret >= 0:
                offset = ret
            path = -1
            if path_end > path_start:
                _copy_bytes(heap, hp, buf, path_start, path_end)
                hp += path_end - path_start
                n_paths += 1
                offsets[n_paths] = hp
                path = n_paths - 1
            if kind == _K_OPENAT:
                fd = ret if ret >= 0 else -1
            _put_row(
                rows, n, ts, kind, pid, tid, comm, fd, path, nbytes, ret, offset, lat, 1, lat, -1,
                1, 1,
            )  # fmt: skip
            row_times[n] = ts
            if 0 <= pid < len(seen):
                seen[pid] = 1
            n += 1
        if not ok:
            found = 0
            if _expect(buf, pos, _WORD_AGG) >= 0:
                found = _parse_agg(buf, pos + 4, aggs, agg_times, n_agg, agg_kinds, fields)
                if found < 0:  # an unknown kind code: no row, a skipped line (counted)
                    found = 0
                if found == 1:
                    pid = aggs[n_agg, _C_PID]
                    if 0 <= pid < len(seen):
                        seen[pid] = 1
                n_agg += found
            p = _line_end(words, pos) if found else _skip_line(buf, words, pos, end, info)
        pos = p + 1
    info[_I_ROWS] = n
    info[_I_AGGS] = n_agg
    info[_I_PATHS] = n_paths
    info[_I_HEAP] = hp
    return pos


_WORD_ADD, _WORD_DEL, _WORD_SHM_ADD, _WORD_SHM_DEL, _WORD_TICK, _CACHE_CLOSE = _texts(
    b"@add", b"@del", b"@shm_add", b"@shm_del", b"T ", b"]: "
)


@_kernel
def _parse_cache_lines(
    buf: np.ndarray,
    words: np.ndarray,
    end: int,
    ints: np.ndarray,
    comms: np.ndarray,
    heap: np.ndarray,
    info: np.ndarray,
) -> tuple[int, int]:
    """Parse raw/cache.txt (``buf[:end]``, whole lines): "T <ns>" starts a block of counts,
    "@addQ[<pid>, <comm>]: <pages>" (or @del, @shm_add, @shm_del; Q the map's digit, absent
    before the maps rotated) is one (``ints``: time, the map's code in :data:`CACHE_KINDS`,
    pid, pages by row; the comm's bytes to ``heap``, their ends in ``comms[1:]``); any other
    line is the tracer's noise or a skipped line, counted in ``info`` as by
    :func:`_parse_syscall_block` (:func:`_skip_line`: lost events, "BEHIND", skipped lines
    and their first examples). Returns (rows, bytes of comms)."""
    n = 0
    used = 0
    ts = 0
    comms[0] = 0
    pos = 0
    while pos < end:
        line_end = _line_end(words, pos)
        stop = line_end - 1 if line_end > pos and buf[line_end - 1] == 13 else line_end  # \r\n
        code = -1
        start = pos + 4
        parsed = False
        if _expect(buf, pos, _WORD_ADD) >= 0:
            code = 1
        elif _expect(buf, pos, _WORD_DEL) >= 0:
            code = 0
        elif _expect(buf, pos, _WORD_SHM_ADD) >= 0:
            code, start = 3, pos + 8
        elif _expect(buf, pos, _WORD_SHM_DEL) >= 0:
            code, start = 2, pos + 8
        if code >= 0:
            if 48 <= buf[start] <= 57:  # the map's digit
                start += 1
            if buf[start] != 91:  # "[": another map's name
                code = -1
            start += 1
        if code >= 0:
            pid, p, ok = _read_int(buf, start, False)
            ok = ok and p + 1 < stop and buf[p] == 44 and buf[p + 1] == 32  # ", "
            q = stop  # the pages: the digits at the end, after the last "]: "
            while q > p and 48 <= buf[q - 1] <= 57:
                q -= 1
            if ok and q < stop and q - 3 >= p + 2 and _expect(buf, q - 3, _CACHE_CLOSE) == q:
                pages, _, _ = _read_int(buf, q, False)
                ints[0, n] = ts
                ints[1, n] = code
                ints[2, n] = pid
                ints[3, n] = pages
                length = q - 3 - (p + 2)
                _copy_bytes(heap, used, buf, p + 2, q - 3)
                used += length
                n += 1
                comms[n] = used
                parsed = True
        elif _expect(buf, pos, _WORD_TICK) >= 0:
            value, p, ok = _read_int(buf, pos + 2, True)
            if ok and p == stop:
                ts = value
                parsed = True
        if not parsed:
            line_end = _skip_line(buf, words, pos, end, info)
        pos = line_end + 1
    return n, used


@_inline
def _name_words(words: np.ndarray, p: int, n: int) -> tuple[Any, Any]:
    """The first 8 and next 8 bytes of the ``n``-byte name at ``p``, as :func:`_read_name`
    gives them (the bytes after the name zero; meaningless beyond 16 bytes)."""
    x = _word(words, p)
    if n < 8:
        return x & _low_bytes(n), np.uint64(0)
    y = _word(words, p + 8)
    if n < 16:
        return x, y & _low_bytes(n - 8)
    return x, y


@_inline
def _parse_blk_map(buf: np.ndarray, p: int, stop: int, fields: np.ndarray) -> bool:
    """Parse a request printed from block.bt's maps, from ``p`` (just after "@blk") to the
    line's end at ``stop``: ``Q[ts, dev, sector]: (rwbs, bytes, latency, pid, in container,
    comm)``. ``fields``: ts, dev, sector, bytes, latency, pid, in container, then the start and
    end of the rwbs and of the comm. The comm is the rest of the line but its closing
    parenthesis (a thread name may hold commas)."""
    value, p, ok = _read_int(buf, p, False)
    if not ok or buf[p] != 91:  # '['
        return False
    p += 1
    for f in range(3):
        if f > 0:
            p = _expect(buf, p, _AGG_SEP)
            if p < 0:
                return False
        value, p, ok = _read_int(buf, p, False)
        if not ok:
            return False
        fields[f] = value
    p = _expect(buf, p, _AGG_OPEN)
    if p < 0:
        return False
    fields[7] = p
    while p < stop and buf[p] != 44:  # ','
        p += 1
    if p - fields[7] > 16:
        return False
    fields[8] = p
    for f in range(3, 7):
        p = _expect(buf, p, _AGG_SEP)
        if p < 0:
            return False
        value, p, ok = _read_int(buf, p, f == 5)
        if not ok:
            return False
        fields[f] = value
    p = _expect(buf, p, _AGG_SEP)
    if p < 0 or buf[stop - 1] != 41 or stop - 1 - p > 16:  # ')'
        return False
    fields[9] = p
    fields[10] = stop - 1
    return True


@_kernel
def _parse_block_lines(
    buf: np.ndarray,
    words: np.ndarray,
    pos: int,
    end: int,
    rows: np.ndarray,
    rw_table: np.ndarray,
    rw_names: np.ndarray,
    rw_count: np.ndarray,
    comm_table: np.ndarray,
    comm_names: np.ndarray,
    comm_count: np.ndarray,
    dev_keys: np.ndarray,
    dev_values: np.ndarray,
    info: np.ndarray,
    scratch: np.ndarray,
) -> int:
    """Parse the lines of ``buf[pos:end]`` of raw/block.txt (tracing/bpf/block.bt: time, rwbs,
    dev, sector, bytes, latency, pid, in container, comm) into merge rows: the kind column has
    the code of the rwbs (``rw_*`` name table), the comm column the parser's code of the
    thread name, the dev column the code of the device (``dev_keys``/``dev_values``, codes in
    order, their count in ``info[_I_PATHS]``). A request is a line of either form block.bt has
    had: ``@blkQ[...]: (...)`` printed from its maps (:func:`_parse_blk_map`) or, before, a
    tab-separated line. Other lines are counted as in :func:`_parse_syscall_block` (its
    ``info`` slots, the same statuses; ``scratch``: at least 12 int64 of
    working space)."""
    fields = scratch[:11]  # of a request printed from a map
    used = scratch[11:12]  # the devices' table's count (its own count is info[_I_PATHS])
    n = info[_I_ROWS]
    info[_I_STATUS] = 0
    while pos < end:
        if n >= rows.shape[0]:
            info[_I_STATUS] = _FULL_ROWS
            break
        rw = comm_len = 0
        ts = dev = sector = nbytes = lat = pid = inside = 0
        w0 = w1 = np.uint64(0)
        q = _expect(buf, pos, _WORD_BLK)
        if q >= 0:  # a request printed from block.bt's maps
            p = _line_end(words, pos)
            ok = _parse_blk_map(buf, q, p, fields)
            if ok:
                ts, dev, sector = fields[0], fields[1], fields[2]
                nbytes, lat, pid, inside = fields[3], fields[4], fields[5], fields[6]
                start, stop = fields[7], fields[8]
                w0, w1 = _name_words(words, start, stop - start)
                rw = _intern(rw_table, rw_names, rw_count, w0, w1, stop - start)
                if rw < 0:
                    info[_I_STATUS] = _FULL_NAMES
                    break
                comm_len = fields[10] - fields[9]
                w0, w1 = _name_words(words, fields[9], comm_len)
        else:  # a tab-separated line (block.bt before its requests were batched in maps)
            ts, p, ok = _read_int(buf, pos, True)
            ok = ok and buf[p] == 9
            if ok:
                p, rw = _tab_name(buf, words, p, rw_table, rw_names, rw_count)
                if rw == -1:
                    info[_I_STATUS] = _FULL_NAMES
                    break
                ok = rw >= 0
            if ok:
                p = _tab_numbers(buf, words, p, fields, 6)
                ok = p >= 0
            if ok:
                dev, sector, nbytes = fields[0], fields[1], fields[2]
                lat, pid, inside = fields[3], fields[4], fields[5]
                start = p + 1
                p, w0, w1 = _read_name(words, start)
                comm_len = p - start
                ok = buf[p] == 10 and comm_len <= 16
        if ok:
            comm = _intern(comm_table, comm_names, comm_count, w0, w1, comm_len)
            if comm < 0:
                info[_I_STATUS] = _FULL_NAMES
                break
            if 2 * (info[_I_PATHS] + 1) > len(dev_keys):
                info[_I_STATUS] = _FULL_NAMES
                break
            code = _get(dev_keys, dev_values, dev << 1)  # keys: never -1, the empty slot
            if code < 0:
                code = info[_I_PATHS]
                _put(dev_keys, dev_values, used, dev << 1, code)
                info[_I_PATHS] = code + 1
            _put_row(
                rows, n, ts, rw, pid, -1, comm, -1, -1, nbytes, 0, sector * 512, lat, 1, lat, code,
                1 if inside == 1 else 0, 0,
            )  # fmt: skip
            n += 1
        else:
            p = _skip_line(buf, words, pos, end, info)
        pos = p + 1
    info[_I_ROWS] = n
    return pos
