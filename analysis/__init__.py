"""Analysis of run directories (:mod:`store.rundir`): plots, similarity, breakdowns, exports.

Everything here is a pure function over DataFrames read from a run directory
(``docs/run-format.md``); the CLI only resolves arguments and writes the results. Importing this
package does not import plotly, so commands that only list or summarise runs stay fast.
``docs/analysis.md`` lists the modules; :mod:`analysis.series` (time bins),
:mod:`analysis.processes` (process classification) and :mod:`analysis.tables` (rows by kind,
container and phase) are shared by the others.
"""

from store.rundir import (
    EVENTS_COLUMNS,
    PHASES_COLUMNS,
    SAMPLES_COLUMNS,
    SCHEMA_VERSION,
    Run,
    arrow_schema,
    empty_frame,
    load_run,
    resolve_run,
)

__all__ = [
    "EVENTS_COLUMNS",
    "PHASES_COLUMNS",
    "SAMPLES_COLUMNS",
    "SCHEMA_VERSION",
    "Run",
    "arrow_schema",
    "empty_frame",
    "load_run",
    "resolve_run",
]
