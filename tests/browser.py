"""Render HTML reports in headless Chromium, so tests check what a browser really draws.

Plotly figures are drawn by JavaScript in the page; a test that only inspects the Python figure
cannot see a page that fails to render (a script error, a missing plotly.js). These helpers run
Debian's ``chromium`` headless on a local file:

- :func:`dom` returns the DOM after the page's scripts ran (``--dump-dom``), so a test can count
  rendered elements, e.g. plotly's ``<g class="subplot xy">`` groups (:func:`subplot_count`);
- :func:`render` writes a PNG screenshot.

Chromium is found by :func:`chromium_binary`; :func:`require_chromium` skips a test without it
on a developer machine and fails it when ``CI=true`` (as ``tests/conftest.py`` does for the
tracing stack), so CI cannot pass by skipping. Install: ``apt-get install chromium``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import require

#: Seconds a Chromium run may take before the test fails (a hung browser must not hang CI).
TIMEOUT_S = 90.0

#: Plotly's subplot groups: ``<g class="subplot xy">``, ``<g class="subplot x2y2">``, ...
SUBPLOT_RE = re.compile(r'<g class="subplot (x\d*y\d*)"')


def chromium_binary() -> str | None:
    """Path of the Chromium executable (``chromium``, else ``chromium-browser``), or None."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def require_chromium() -> str:
    """The Chromium binary; skip the calling test without one, or fail it when ``CI=true``."""
    binary = chromium_binary()
    require(binary, "chromium is not installed: run `apt-get install chromium` as root")
    assert binary is not None
    return binary


def _run(
    args: list[str], timeout_s: float, virtual_time: bool = True
) -> subprocess.CompletedProcess[bytes]:
    binary = require_chromium()
    # A private profile directory: parallel runs never share (or lock) one.
    with tempfile.TemporaryDirectory(prefix="twintrace-chromium-") as profile:
        command = [
            binary,
            "--headless",
            "--no-sandbox",  # tests run as root in containers, where the sandbox cannot start
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            # Virtual time runs the page's scripts and timers to completion, then stops: no
            # fixed sleep, and plotly has drawn everything before the dump or screenshot.
            *(["--virtual-time-budget=10000"] if virtual_time else []),
            *args,
        ]
        try:
            result = subprocess.run(command, capture_output=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail(f"chromium did not finish within {timeout_s:.0f} s: {' '.join(command)}")
    if result.returncode != 0:
        tail = result.stderr.decode(errors="replace")[-2000:]
        pytest.fail(f"chromium exited with {result.returncode}: {tail}")
    return result


def render(
    html_path: Path,
    png_path: Path,
    width: int = 1400,
    height: int = 2000,
    timeout_s: float = TIMEOUT_S,
) -> None:
    """Screenshot ``html_path`` as it renders in a ``width`` x ``height`` window to ``png_path``."""
    png_path = Path(png_path).resolve()
    _run(
        [
            f"--screenshot={png_path}",
            f"--window-size={width},{height}",
            Path(html_path).resolve().as_uri(),
        ],
        timeout_s,
    )
    if not png_path.is_file() or png_path.stat().st_size == 0:
        pytest.fail(f"chromium wrote no screenshot to {png_path}")


def dom(html_path: Path, timeout_s: float = TIMEOUT_S) -> str:
    """The serialised DOM of ``html_path`` after its scripts ran."""
    result = _run(["--dump-dom", Path(html_path).resolve().as_uri()], timeout_s)
    return result.stdout.decode(errors="replace")


def opening_ms(html_path: Path, timeout_s: float = TIMEOUT_S) -> int:
    """How long ``html_path`` took to open, in real milliseconds from the start of its
    navigation until its figures were drawn: the ``data-rendered-ms`` its own script sets
    (analysis/run_report.py). Real time, not the virtual clock :func:`dom` runs pages on: the
    DOM is dumped at the load event, after the page's inline scripts ran."""
    result = _run(["--dump-dom", Path(html_path).resolve().as_uri()], timeout_s, False)
    found = re.search(r'data-rendered-ms="(\d+)"', result.stdout.decode(errors="replace"))
    if found is None:
        pytest.fail(f"{html_path} did not say when its figures were drawn")
    return int(found.group(1))


def subplot_count(html: str) -> int:
    """How many plotly cartesian subplots are drawn in a dumped DOM."""
    return len(set(SUBPLOT_RE.findall(html)))
