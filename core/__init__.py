"""The foundation every other package builds on: the version, the one error type, byte sizes,
atomic file writes and versioned file layouts, carried into the workload images with
``workloads/``.

Layering (checked by tests/test_layering.py): ``core`` imports no other package of the
project; ``workloads`` imports only ``core``. These two are what the workload images carry,
whole, so they import nothing host-only (no pandas, pyarrow, plotly, docker, click...: only
what ``images/requirements.txt`` installs). ``store`` (what the host stores and reads back: the
run-directory format, the profile database) imports ``core`` and ``workloads``; it is a
package of its own because it belongs in neither image package nor in any one of its readers.
``datagen`` imports ``core`` and ``workloads``; ``tracing`` and ``analysis`` import those and
``store``, never each other; ``images`` builds from ``core`` and ``workloads`` (and reads
``store``); ``experiments`` (orchestration), ``commands`` (the CLI's commands) and ``cli.py``
sit on top.
"""

__version__ = "0.1.0"
