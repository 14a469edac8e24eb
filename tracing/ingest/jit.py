"""The ingest's compiled kernels: numba, imported and compiled (or loaded from numba's on-disk
cache) on first use, so that the CLI does not pay for it.

A kernel module (:mod:`scan`, :mod:`parse_kernels`, :mod:`join_kernels`) registers each function
with :func:`kernel` (called from Python), :func:`inline` (called by other kernels: inlined in
them) or :func:`allocating` (one that returns new arrays). :func:`compile` compiles every
registered function once per process and puts the compiled one in place of the Python one in the
globals of every kernel module that names it (its own, and those that imported it): kernels call
each other by their global names. Python code calls a kernel through its module
(``parse_kernels._parse_syscall_block(...)``), never by a name imported before the compile,
which would stay the Python function.

Kernels but the allocating ones are compiled without numba's runtime (``_nrt=False``): they
allocate nothing (a parser's working space is an argument) and keep no reference count on the
arrays they are given. With the runtime, numba counted references to the arrays the parsers
pass to their helpers, an atomic increment and decrement each time, even where the helper was
inlined; on an Intel Xeon (Emerald Rapids) VM those atomic operations were half to two thirds
of a parse (``perf``), and ``python bench/trace_ingest.py`` gave 0.26 where an AMD EPYC VM had
given 0.53 with the same code and libraries (0.46 there now: see the bench's doc).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_FUNCTIONS: dict[int, Callable[..., Any]] = {}  # id -> the Python function
_INLINED: set[int] = set()
_ALLOCATING: set[int] = set()
_NAMESPACES: dict[int, dict[str, Any]] = {}  # the kernel modules' globals
_COMPILED = False
_LOCK = threading.Lock()


def kernel(function: Callable[..., Any]) -> Callable[..., Any]:
    """Register a kernel called from Python (see the module doc)."""
    _FUNCTIONS[id(function)] = function
    _NAMESPACES[id(function.__globals__)] = function.__globals__
    return function


def inline(function: Callable[..., Any]) -> Callable[..., Any]:
    """Register a kernel that other kernels call: inlined in them."""
    _INLINED.add(id(function))
    return kernel(function)


def allocating(function: Callable[..., Any]) -> Callable[..., Any]:
    """Register a kernel that returns new arrays: compiled with numba's runtime."""
    _ALLOCATING.add(id(function))
    return kernel(function)


def compile() -> None:
    """Compile every registered kernel (or load it from numba's cache) once per process, and
    swap the compiled functions into the kernel modules' globals."""
    global _COMPILED
    with _LOCK:
        if _COMPILED:
            return
        import numba

        compiled = {}
        for key, function in _FUNCTIONS.items():
            options = {
                "nogil": True,
                "inline": "always" if key in _INLINED else "never",
                "_nrt": key in _ALLOCATING,
            }
            try:
                compiled[key] = numba.njit(cache=True, **options)(function)
            except RuntimeError as exc:  # no writable cache directory: compile in memory
                if "no locator available" not in str(exc):
                    raise
                compiled[key] = numba.njit(**options)(function)
        for namespace in _NAMESPACES.values():
            for name, value in list(namespace.items()):
                if id(value) in compiled and _FUNCTIONS[id(value)] is value:
                    namespace[name] = compiled[id(value)]
        _COMPILED = True
