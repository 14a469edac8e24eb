"""What an ingest counts besides the rows: what it skipped or lost, and totals per kind."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from tracing.ingest.schema import _LOST_RE


@dataclass
class ParseStats:
    """What the parser skipped, for the summary and for honesty about a trace's completeness."""

    lost_events: int = 0
    skipped_lines: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    #: Rows that came later than the reorder window (put in place by a second pass).
    late_rows: int = 0
    #: Times a script found bpftrace's user space 300 ms behind its kernel side ("BEHIND"
    #: lines): a map was being written again before its clear, so events may be missing.
    behind: int = 0

    def merge(self, other: ParseStats) -> None:
        """Add ``other``'s counts (another host's)."""
        self.lost_events += other.lost_events
        self.late_rows += other.late_rows
        self.behind += other.behind
        self.skipped_lines += other.skipped_lines
        self.skipped_examples = (self.skipped_examples + other.skipped_examples)[:5]

    def skip(self, text: str) -> None:
        """Count one line that is no event (and keep the first few)."""
        self.skipped_lines += 1
        if len(self.skipped_examples) < 5:
            self.skipped_examples.append(text[:200])

    def handler(self, row: pacsv.InvalidRow) -> str:
        text = row.text or ""
        match = _LOST_RE.match(text)
        if match:
            self.lost_events += int(match.group(1))
        elif text.startswith("BEHIND "):
            self.behind += 1
        elif not (text.startswith(("READY ", "Attaching ")) or text.strip() == ""):
            self.skip(text)
        return "skip"


@dataclass
class EventTotals:
    """Rows, counts and bytes of events.parquet per (container, kind): what the summary needs,
    added up while the table is written."""

    #: (container role or None, kind) -> [rows, count, bytes]
    by_key: dict[tuple[str | None, str], list[int]] = field(default_factory=dict)

    def add(self, container: str | None, kind: str, rows: int, count: int, nbytes: int) -> None:
        entry = self.by_key.setdefault((container, kind), [0, 0, 0])
        entry[0] += rows
        entry[1] += count
        entry[2] += nbytes

    @property
    def containers(self) -> set[str]:
        return {c for c, _ in self.by_key if c is not None}

    def merge(self, other: EventTotals) -> None:
        """Add ``other``'s rows (another host's)."""
        for (container, kind), (rows, count, nbytes) in other.by_key.items():
            self.add(container, kind, rows, count, nbytes)

    def per_kind(self, container: str | None = ..., /) -> dict[str, tuple[int, int]]:  # type: ignore[assignment]
        """kind -> (count, bytes), over every row (no argument) or the rows of one container."""
        out: dict[str, list[int]] = {}
        for (role, kind), (rows, count, nbytes) in self.by_key.items():
            if rows == 0 or (container is not ... and role != container):
                continue
            entry = out.setdefault(kind, [0, 0])
            entry[0] += count
            entry[1] += nbytes
        return {kind: (c, b) for kind, (c, b) in out.items()}

    @classmethod
    def of_table(cls, events: pa.Table) -> EventTotals:
        """The totals of an events table (as :func:`build_events` returns it)."""
        totals = cls()
        df = events.select(["kind", "bytes", "count", "container"]).to_pandas()
        df["kind"] = df["kind"].astype(str)
        df["container"] = df["container"].astype(object).where(df["container"].notna(), None)
        grouped = df.groupby(["container", "kind"], dropna=False, observed=True).agg(
            rows=("count", "size"), count=("count", "sum"), bytes=("bytes", "sum")
        )
        for (role, kind), row in grouped.iterrows():
            role = None if role is None or pd.isna(role) else str(role)
            totals.add(role, str(kind), int(row["rows"]), int(row["count"]), int(row["bytes"]))
        return totals
