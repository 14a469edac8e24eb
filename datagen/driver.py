"""The sequence every dataset generator follows, in one place.

A generator (``generate_unet3d``, ``generate_bert``, ...) makes a :class:`Job` of its request
and calls :meth:`Job.generate` with two functions of its own: ``plan()``, which validates its
parameters and lays the dataset out, and ``write(plan)``, which writes the files (through
:meth:`Job.run`) and returns their manifest records with the generator's manifest params. The
job then guarantees the dataset-directory contract of :mod:`datagen.common`:

1. the request (size, seed, workers) is checked when the job is made, and the plan is made,
   before the directory is touched: a bad request never clears it;
2. the directory is prepared (:func:`datagen.common.prepare_output_dir`: empty, or cleared
   with ``force`` when twintrace wrote it);
3. the files are written; a failure or Ctrl-C propagates, leaving no partial file;
4. ``manifest.json`` is written last (with the time from 2 to 4), and returned.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from core.errors import UserError
from datagen.common import (
    FileTask,
    ProgressCallback,
    check_seed,
    check_size_bytes,
    prepare_output_dir,
    run_file_tasks,
    write_manifest,
)

Plan = TypeVar("Plan")
Written = tuple[list[dict[str, Any]], dict[str, Any]]
"""What a generator's ``write`` returns: the files' manifest records, the manifest's params."""


@dataclasses.dataclass(frozen=True)
class Job:
    """One run of generator ``generator``: the request every generator takes, checked.

    ``out``: the dataset directory (see :func:`datagen.common.prepare_output_dir` for
    ``force``); ``workers``: writer processes (default: one per CPU); ``progress(done_bytes,
    total_bytes)``: called from this process; ``fsync``: see :func:`datagen.common.atomic_file`.
    """

    generator: str
    out: Path
    size_bytes: int
    seed: int = 0
    workers: int | None = None
    force: bool = False
    progress: ProgressCallback | None = None
    fsync: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))
        check_seed(self.seed)
        check_size_bytes(self.size_bytes)
        if self.workers is not None and self.workers < 1:
            raise UserError(f"workers must be at least 1, got {self.workers}")

    def run(
        self,
        tasks: Sequence[FileTask],
        *,
        workers: int | None = None,
        progress: ProgressCallback | None = None,
        **options: Any,
    ) -> list[dict[str, Any]]:
        """:func:`datagen.common.run_file_tasks` into ``out`` with the job's settings.

        ``workers`` and ``progress`` replace the job's for this call (a phase of the run that
        reports its share of the progress); ``options``: run_file_tasks' other keywords.
        """
        return run_file_tasks(
            self.out,
            tasks,
            workers=workers or self.workers,
            progress=progress or self.progress,
            fsync=self.fsync,
            **options,
        )

    def generate(
        self, plan: Callable[[], Plan], write: Callable[[Plan], Written]
    ) -> dict[str, Any]:
        """Plan, prepare ``out``, write, then write the manifest; return the manifest."""
        layout = plan()
        prepare_output_dir(self.out, self.force)
        started = time.monotonic()
        files, params = write(layout)
        return write_manifest(
            self.out,
            generator=self.generator,
            seed=self.seed,
            requested_bytes=self.size_bytes,
            files=files,
            params=params,
            duration_s=time.monotonic() - started,
            fsync=self.fsync,
        )
