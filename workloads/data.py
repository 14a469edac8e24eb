"""What every workload's dataset check returns (numpy-free, torch-free)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DataSummary:
    """What a ``check_dataset`` found: items (cases, records, images, groups), files and bytes."""

    items: int
    files: int
    bytes: int
