"""Names (kinds, thread names, devices, roles) as codes: in Python, and in the parsers' tables."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracing.ingest import scan


class _Names:
    """A growing list of names and their codes (for dictionary-encoded output columns)."""

    def __init__(self, initial: Sequence[str] = ()) -> None:
        self.names: list[str] = []
        self.codes: dict[str, int] = {}
        self._array: pa.Array | None = None
        for name in initial:
            self.code(name)

    def code(self, name: str) -> int:
        code = self.codes.get(name)
        if code is None:
            code = self.codes[name] = len(self.names)
            self.names.append(name)
            self._array = None
        return code

    def codes_of(self, values: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The codes of an array of strings (nulls: -1)."""
        encoded = pc.dictionary_encode(values)
        if isinstance(encoded, pa.ChunkedArray):
            encoded = encoded.combine_chunks()
        mapping = np.array([self.code(s) for s in encoded.dictionary.to_pylist()] + [-1])
        indices = encoded.indices.to_numpy(zero_copy_only=False)
        if encoded.indices.null_count:
            indices = np.where(
                encoded.indices.is_null().to_numpy(zero_copy_only=False), -1, indices
            )
        return mapping[indices].astype(np.int64)

    def array(self) -> pa.Array:
        if self._array is None:
            self._array = pa.array(self.names, type=pa.string())
        return self._array

    def take(self, codes: np.ndarray) -> pa.Array:
        """The names of ``codes`` (-1: null)."""
        return self.array().take(pa.array(codes, mask=codes < 0))


class _NameTable:
    """The parser's table of names of at most 16 bytes (numba arrays) and their codes."""

    def __init__(self, initial: Sequence[str] = (), capacity: int = 1024) -> None:
        self.table = np.full(2 * capacity, -1, dtype=np.int64)
        self.names = np.zeros((capacity, 3), dtype=np.uint64)
        self.count = np.zeros(1, dtype=np.int64)
        for name in initial:
            w0, w1, n = self._words(name.encode())
            scan._intern(self.table, self.names, self.count, w0, w1, n)
        self.decoded: list[str] = list(initial)

    @staticmethod
    def _words(raw: bytes) -> tuple[np.uint64, np.uint64, int]:
        padded = raw.ljust(16, b"\0")
        return (
            np.uint64(int.from_bytes(padded[:8], "little")),
            np.uint64(int.from_bytes(padded[8:16], "little")),
            len(raw),
        )

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The table, names and count, as the parsing kernels take them."""
        return self.table, self.names, self.count

    def grow(self) -> None:
        capacity = 2 * len(self.names)
        names = np.zeros((capacity, 3), dtype=np.uint64)
        names[: len(self.names)] = self.names
        table = np.full(2 * capacity, -1, dtype=np.int64)
        for code in range(int(self.count[0])):
            w0, w1, n = names[code]
            table[scan._name_slot(table, names, w0, w1, int(n))] = code
        self.table, self.names = table, names

    def new_names(self) -> list[str]:
        """Names added since the last call, in code order."""
        added = []
        for code in range(len(self.decoded), int(self.count[0])):
            w0, w1, n = (int(v) for v in self.names[code])
            raw = (w0.to_bytes(8, "little") + w1.to_bytes(8, "little"))[:n]
            added.append(raw.decode("utf-8", errors="replace"))
        self.decoded += added
        return added
