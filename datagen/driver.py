"""The sequence every dataset generator follows, in one place.

A generator (``generate_unet3d``, ``generate_bert``, ...) is a function of a :class:`Job` and
its params, made public by :func:`generator`: every generator takes the same request, made into
the job. It calls :meth:`Job.generate` with two functions of its own: ``plan()``, which
validates its parameters and lays the dataset out, and ``write(plan)``, which writes the files
(through :meth:`Job.run`) and returns their manifest records with the generator's manifest
params. The job then guarantees the dataset-directory contract of :mod:`datagen.common`:

1. the request (size, seed, workers) is checked when the job is made, and the plan is made
   and the file system's free space checked, before the directory is touched: a bad request
   never clears it;
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
    check_free_space,
    check_seed,
    check_size_bytes,
    prepare_output_dir,
    run_file_tasks,
    write_manifest,
)

Plan = TypeVar("Plan")
Params = TypeVar("Params")
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
        check_free_space(self.out, self.size_bytes, self.force)
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


#: What :func:`generator` makes public: ``generate(out, size_bytes, seed=0, workers=None,
#: force=False, progress=None, params=None, fsync=False) -> manifest``.
Generate = Callable[..., dict[str, Any]]

_RUN_DOC = """
    The run (``out``, ``force``, ``workers``, ``progress``, ``fsync``, the manifest written
    last, nothing partial left on failure) is :class:`datagen.driver.Job`'s."""


def generator(
    name: str, default_params: Callable[[], Params]
) -> Callable[[Callable[[Job, Params], dict[str, Any]]], Generate]:
    """Make ``body(job, params) -> manifest`` the public function of generator ``name``.

    The function returned takes the request every generator takes (the signature below, the
    same for all, which ``datagen.registry`` relies on), with ``params`` (``default_params()``
    when not given), makes the :class:`Job` of it (which checks it), and returns
    ``body(job, params)``. It bears ``body``'s name and docstring.
    """

    def decorate(body: Callable[[Job, Params], dict[str, Any]]) -> Generate:
        def generate(
            out: Path,
            size_bytes: int,
            seed: int = 0,
            workers: int | None = None,
            force: bool = False,
            progress: ProgressCallback | None = None,
            params: Params | None = None,
            fsync: bool = False,
        ) -> dict[str, Any]:
            params = params or default_params()
            job = Job(name, out, size_bytes, seed, workers, force, progress, fsync)
            return body(job, params)

        # Not functools.wraps: its __wrapped__ would make inspect.signature show body's.
        generate.__module__ = body.__module__
        generate.__name__ = body.__name__
        generate.__qualname__ = body.__qualname__
        generate.__doc__ = (body.__doc__ or "").rstrip() + "\n" + _RUN_DOC + "\n    "
        return generate

    return decorate
