"""What the host stores and reads back: the run-directory format (:mod:`store.rundir`), the
profile database (:mod:`store.profiledb`, its tables under ``store/profiles/``) and this host's
cached CPU profiles (:mod:`store.hostprofiles`). Never carried into the images.

A package of its own because it belongs to none of the others: ``core`` and ``workloads`` are
what the workload images carry (whole: ``.dockerignore`` keeps out only generated files), so
nothing that needs pandas or pyarrow, or megabytes of host-side tables, may live in them; and
``tracing``, ``analysis`` and ``experiments`` all read and write these formats, so none of them
is their home. ``store`` imports only ``core`` and ``workloads``
(tests/test_layering.py).
"""
